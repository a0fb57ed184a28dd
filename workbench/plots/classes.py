"""Class fractions: overshoot (iterate / park / other per extra loop) and splices (per site and j)."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.plots.base import CLASS_COLORS, class_fractions, nested, require
from workbench.plots.registry import Figure, Section
from workbench.plots.theme import COLORWAY, apply_theme

OVERSHOOT_CLASSES = ["iterate", "park", "other"]
SPLICE_CLASSES = ["source_orbit", "lawful", "shortcut", "other"]
SPLICE_SITES = ["state", "block_resid", "reentry_input"]


def _stacked(fig: go.Figure, frac: pd.DataFrame, x: str, classes: list[str], row=None, col=None,
             showlegend: bool = True, where: str = "") -> None:
    for cls in classes:
        fig.add_trace(go.Bar(
            x=frac[x], y=frac[cls], name=cls, legendgroup=cls, showlegend=showlegend,
            marker_color=CLASS_COLORS[cls], customdata=frac["n"],
            hovertemplate=f"{where}{x} = %{{x}}: {cls} %{{y:.3f}} (n = %{{customdata}})<extra></extra>"),
            row=row, col=col)


def decidable(df: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """Returns the rows whose classes are distinguishable (`coincide` false, when the probe marks it), and
    how many were left out: where two class symbols coincide, the read symbol cannot tell them apart."""
    if "coincide" not in df.columns:
        return df, 0
    keep = ~df["coincide"].fillna(False).astype(bool)
    return df[keep], int((~keep).sum())


def _left_out(n: int) -> str:
    return f" ({n} coinciding entries left out)" if n else ""


def overshoot_figure(df: pd.DataFrame) -> go.Figure:
    """Returns stacked class fractions (iterate, park, other) at each extra loop past the depth.

    Args:
        df: the overshoot table (row_id, depth, loop, extra, predicted, ..., cls), pooled over depths;
            entries marked `coincide` (f^t(x0) = x_d) are left out.
    """
    require(df, ["row_id", "depth", "extra", "cls"], "overshoot")
    df, dropped = decidable(df)
    frac = class_fractions(df, ["extra"], OVERSHOOT_CLASSES)
    fig = go.Figure()
    _stacked(fig, frac, "extra", OVERSHOOT_CLASSES)
    fig.update_xaxes(title="extra loops past the depth (t − d)", dtick=1)
    fig.update_yaxes(title="fraction of rows", range=[0, 1])
    fig.update_layout(barmode="stack", height=420, bargap=0.25,
                      title="Overshoot: does the state keep iterating the rule or park on the answer?"
                      + _left_out(dropped))
    return apply_theme(fig)


def overshoot_cost_figure(df: pd.DataFrame, cost: pd.DataFrame) -> go.Figure:
    """Returns how far past its depth the answer survives: accuracy on x_d at loop d + k, one line per depth.

    Args:
        df: the overshoot table (its depths fix the colours).
        cost: the overshoot__cost table (depth, extra, n, answer_acc, iterate_acc).
    """
    require(cost, ["depth", "extra", "n", "answer_acc"], "overshoot__cost")
    depths = sorted(set(df["depth"]) | set(cost["depth"]))
    fig = go.Figure()
    for i, d in enumerate(depths):
        sub = cost[cost["depth"] == d].sort_values("extra")
        if sub.empty:
            continue
        line, marker = nested(i, len(depths))  # depths that keep the answer draw equal lines
        fig.add_trace(go.Scatter(
            x=sub["extra"], y=sub["answer_acc"], mode="lines+markers", name=f"depth {d}",
            line=dict(color=COLORWAY[i % len(COLORWAY)], **line), marker=marker, customdata=sub["n"],
            hovertemplate=f"depth {d}, k = %{{x}}: answer kept %{{y:.3f}} (n = %{{customdata}})<extra></extra>"))
    fig.update_xaxes(title="extra loops k past the depth", dtick=1)
    fig.update_yaxes(title="accuracy on x_d at loop d + k", range=[0, 1.02])
    fig.update_layout(title="Overshoot cost: how long the answer survives extra loops", height=420)
    return apply_theme(fig)


SPAN_LABELS = {"all": "all positions", "read": "read position"}
MAX_COLS = 4


def _verdict_text(verdict: pd.DataFrame | None, site: str, span: str | None) -> str:
    label = site if span is None else f"{site} · {SPAN_LABELS.get(span, span)}"
    if verdict is None or "verdict" not in verdict.columns:
        return label
    v = verdict[verdict["site"] == site]
    if span is not None and "span" in v.columns:
        v = v[v["span"] == span]
    parts = [f"k0={int(r.k0)}: {r.verdict}" for r in v.sort_values("k0").itertuples()]
    return f"{label}<br><sup>{' · '.join(parts)}</sup>" if parts else label


def _panels(df: pd.DataFrame) -> list[tuple[str, str | None]]:
    """Returns the (site, span) pairs present, sites in the probe's order, "all" before "read"."""
    present = list(df["site"].unique())
    sites = [s for s in SPLICE_SITES if s in present] + sorted(s for s in present if s not in SPLICE_SITES)
    if "span" not in df.columns:
        return [(s, None) for s in sites]
    pairs = set(zip(df["site"], df["span"]))
    return [(s, sp) for s in sites for sp in sorted(df["span"].unique()) if (s, sp) in pairs]


def splice_figure(df: pd.DataFrame, verdict: pd.DataFrame | None = None) -> go.Figure:
    """Returns stacked class fractions by j (loops after the splice), one panel per (site, span) run.

    Args:
        df: the splice table (pair_id, row_a, row_b, depth, site, k0, j, predicted, cls; optionally
            span and coincide), pooled over k0. j = 0 and entries marked `coincide` are left out, as
            in the verdict.
        verdict: the splice__verdict table; each panel's title then lists the verdict per k0.
    """
    require(df, ["pair_id", "site", "k0", "j", "cls"], "splice")
    df, dropped = decidable(df[df["j"] >= 1])
    panels = _panels(df)
    ncols = min(MAX_COLS, len(panels))
    nrows = -(-len(panels) // ncols)
    fig = make_subplots(rows=nrows, cols=ncols, shared_yaxes=True, horizontal_spacing=0.04, vertical_spacing=0.22,
                        subplot_titles=[_verdict_text(verdict, s, sp) for s, sp in panels])
    for i, (site, span) in enumerate(panels):
        r, c = i // ncols + 1, i % ncols + 1
        sub = df[df["site"] == site] if span is None else df[(df["site"] == site) & (df["span"] == span)]
        frac = class_fractions(sub, ["j"], SPLICE_CLASSES)
        where = f"{site}, " if span is None else f"{site}, {SPAN_LABELS.get(span, span)}, "
        _stacked(fig, frac, "j", SPLICE_CLASSES, row=r, col=c, showlegend=i == 0, where=where)
        fig.update_xaxes(title="j (loops after the splice)", dtick=1, row=r, col=c)
    fig.update_yaxes(range=[0, 1])
    fig.update_yaxes(title="fraction of pairs", col=1)
    fig.update_layout(barmode="stack", height=380 * nrows + 100, bargap=0.25,
                      title="Counterfactual splice: what A reads j loops after receiving B's state" + _left_out(dropped),
                      legend=dict(orientation="h", y=-0.2 if nrows == 1 else -0.1))
    return apply_theme(fig)


SECTIONS = {
    "overshoot": Section(
        title="Overshoot",
        about="Rows forced past their depth: iterate the rule, park on the answer, or neither.",
        figures=(
            Figure(overshoot_figure,
                   "Class of the read symbol at each loop past the depth. Predicted: mostly iterate (the rule keeps "
                   "being applied; the paper: 93%), little park."),
            Figure(overshoot_cost_figure,
                   "Accuracy on the answer x_d at loop d + k. Predicted: it falls once the loop runs past d, since the "
                   "loop iterates instead of holding the answer."),
        ),
    ),
    "splice": Section(
        title="Counterfactual splice",
        about="Row B's state spliced into row A at loop k0, classified j loops later.",
        figures=(
            Figure(splice_figure,
                   "Class fractions j loops after splicing row B's state into row A at loop k0. Predicted: lawful (A's "
                   "table applied to B's symbol) at the read position; B's orbit when every position is spliced."),
        ),
    ),
}
