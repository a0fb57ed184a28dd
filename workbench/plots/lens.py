"""Per-loop logit lens: which chain symbol each loop's readout holds (docs/analyses.md: logit_lens)."""

from __future__ import annotations

import html

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from workbench.errors import WorkbenchError
from workbench.plots.base import SEQUENTIAL, add_slider, nested, require
from workbench.plots.registry import Figure, Section
from workbench.plots.theme import COLORWAY, apply_theme

LENS_COLUMNS = ["row_id", "depth", "loop", "lens", "chain_index", "symbol", "rank", "prob"]
TOP_K = 5


def _pick_lens(df: pd.DataFrame, lens: str | None) -> str:
    lenses = sorted(df["lens"].unique())
    if lens is None:
        return "coda" if "coda" in lenses else lenses[0]
    if lens not in lenses:
        raise WorkbenchError(f"lens '{lens}' is not in the logit_lens table; it has {', '.join(lenses)}")
    return lens


def top_tokens(top: pd.DataFrame | None, row_ids, lens: str, k: int = TOP_K) -> dict[int, str]:
    """Returns {loop: hover text} of the k tokens with the highest mean full-vocabulary probability.

    The mean is over `row_ids`, a row whose top-k list lacks a token counting as 0 for it, so a
    single row gives its own top-k and many rows give the tokens the loop favours on average.
    """
    if top is None:
        return {}
    ids = set(row_ids)
    sub = top[(top["lens"] == lens) & top["row_id"].isin(ids)]
    out = {}
    for loop, g in sub.groupby("loop"):
        mean = g.groupby("token")["prob"].sum().div(len(ids)).nlargest(k)
        out[int(loop)] = "<br>".join(f"{html.escape(repr(str(t)), quote=False)}  {p:.3f}" for t, p in mean.items())
    return out


def _lens_grid(sub: pd.DataFrame, value: str) -> tuple[list[int], list[int], np.ndarray, np.ndarray]:
    """Returns loops, chain indices, the mean `value` grid [loop, k] and the mean rank grid."""
    z = sub.groupby(["loop", "chain_index"])[value].mean().unstack("chain_index").sort_index()
    rank = sub.groupby(["loop", "chain_index"])["rank"].mean().unstack("chain_index").reindex_like(z)
    return list(z.index), list(z.columns), z.to_numpy(float), rank.to_numpy(float)


def _heatmap(sub: pd.DataFrame, value: str, tops: dict[int, str], name: str, zmax: float) -> go.Heatmap:
    loops, ks, z, rank = _lens_grid(sub, value)
    prob = z if value == "prob" else _lens_grid(sub, "prob")[2]
    text = [[f"loop {t}, x{k}<br>mean prob {p:.3f}, mean rank {r:.2f}"
             + (f"<br><b>top tokens</b><br>{tops[t]}" if t in tops else "")
             for k, p, r in zip(ks, prow, rrow)]
            for t, prow, rrow in zip(loops, prob, rank)]
    reverse = value == "rank"  # rank 0 is the best: draw it darkest
    return go.Heatmap(x=ks, y=loops, z=z, zmin=0, zmax=zmax, colorscale=SEQUENTIAL, reversescale=reverse,
                      name=name, text=text, hovertemplate="%{text}<extra></extra>",
                      texttemplate="%{z:.2f}" if value == "prob" else "%{z:.1f}", textfont=dict(size=9),
                      colorbar=dict(title=value, thickness=12))


def logit_lens_figure(df: pd.DataFrame, top: pd.DataFrame | None = None, lens: str | None = None,
                      value: str = "prob", depth: int | None = None, row_id=None) -> go.Figure:
    """Returns the loops × chain symbols heatmap of the reader's probability (or rank) of each x_k.

    With no `depth` and no `row_id`, rows are averaged per depth and a slider steps through the
    depths. Hovering a cell shows the top tokens of that loop from the logit_lens__top table.

    Args:
        df: the logit_lens table.
        top: the logit_lens__top table (row_id, loop, lens, k, token, prob), for the hover.
        lens: "coda" (default when present), "raw" or "tuned".
        value: "prob" (softmax over the task's candidates) or "rank" (0 = top candidate).
        depth: show only this depth (averaged over its rows).
        row_id: show one row; the x axis is labelled with its chain symbols.
    """
    require(df, LENS_COLUMNS, "logit_lens")
    if value not in ("prob", "rank"):
        raise WorkbenchError(f"value '{value}' is unknown; accepted: prob, rank")
    lens = _pick_lens(df, lens)
    data = df[df["lens"] == lens]
    zmax = 1.0 if value == "prob" else float(data["rank"].max()) or 1.0
    fig = go.Figure()
    if row_id is not None:
        one = data[data["row_id"] == row_id]
        if one.empty:
            raise WorkbenchError(f"row_id {row_id!r} is not in the logit_lens table for lens '{lens}'")
        fig.add_trace(_heatmap(one, value, top_tokens(top, [row_id], lens), str(row_id), zmax))
        symbols = one.drop_duplicates("chain_index").sort_values("chain_index")
        fig.update_xaxes(tickvals=list(symbols["chain_index"]),
                         ticktext=[f"x{k} {s}" for k, s in zip(symbols["chain_index"], symbols["symbol"])])
        title = f"Logit lens ({lens}) of row {row_id}, depth {int(one['depth'].iloc[0])}"
    else:
        depths = [depth] if depth is not None else sorted(int(d) for d in data["depth"].unique())
        for d in depths:
            sub = data[data["depth"] == d]
            if sub.empty:
                raise WorkbenchError(f"depth {d} is not in the logit_lens table; it has {sorted(data['depth'].unique())}")
            fig.add_trace(_heatmap(sub, value, top_tokens(top, sub["row_id"].unique(), lens), f"depth {d}", zmax))
        if len(depths) > 1:
            add_slider(fig, [[i] for i in range(len(depths))], depths, "depth d = ", active=len(depths) - 1)
        title = f"Logit lens ({lens}): {value} of each chain symbol x_k at every loop, mean over rows"
    fig.update_xaxes(title="chain symbol x_k (k)", dtick=1, showgrid=False)
    fig.update_yaxes(title="loop t", dtick=1, showgrid=False)
    fig.update_layout(title=title, height=560)
    return apply_theme(fig)


def lens_agreement_figure(df: pd.DataFrame) -> go.Figure:
    """Returns, per lens, the mean probability of the loop's own target x_t and of the next x_{t+1}.

    A lens that reads x_{t+1} at loop t shows the next step forming before the Coda reads it.
    Lenses can read exactly the same numbers (raw and coda often do), so each lens has its own
    line width and marker (`nested`): equal lines show one inside the other.
    """
    require(df, LENS_COLUMNS, "logit_lens")
    fig = go.Figure()
    lenses = sorted(df.groupby("lens"), key=lambda kv: kv[0])
    for i, (lens, sub) in enumerate(lenses):
        color = COLORWAY[i % len(COLORWAY)]
        line, marker = nested(i, len(lenses))
        for offset, dash, label in ((0, "solid", "x_t"), (1, "dot", "x_{t+1}")):
            hit = sub[sub["chain_index"] == sub["loop"] + offset]
            if hit.empty:
                continue
            m = hit.groupby("loop")["prob"].agg(["mean", "size"]).reset_index()
            fig.add_trace(go.Scatter(
                x=m["loop"], y=m["mean"], mode="lines+markers", name=f"{lens}: {label}", legendgroup=lens,
                line=dict(color=color, dash=dash, **line), marker=marker, customdata=m["size"],
                hovertemplate=f"{lens} lens, loop %{{x}}: P({label}) = %{{y:.3f}} (n = %{{customdata}})<extra></extra>"))
    fig.update_xaxes(title="loop t", dtick=1)
    fig.update_yaxes(title="mean probability (over the task's candidates)", range=[0, 1.02])
    fig.update_layout(title="What each lens reads at loop t: the current symbol x_t and the next x_{t+1}",
                      height=420)
    return apply_theme(fig)


SECTIONS = {
    "logit_lens": Section(
        title="Per-loop logit lens",
        about="Which chain symbol each loop's readout holds, through the Coda and the raw and tuned lenses.",
        figures=(
            Figure(logit_lens_figure,
                   "Probability of each chain symbol x_k at every loop, averaged per depth. Predicted: a bright "
                   "diagonal k = t, one lookup per loop."),
            Figure(lens_agreement_figure,
                   "Per lens, the probability of x_t and of x_{t+1} at loop t. Predicted: the Coda reads x_t; a lens "
                   "that already reads x_{t+1} would show the next step forming early."),
        ),
    ),
}
