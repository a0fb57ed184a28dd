"""Figures of the loop-dynamics probes: lens agreement per pass and the causal lens, step geometry and head
stability across passes, post-hoc exit rules on the halting probe's compute-accuracy axes (docs/analyses.md)."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.plots.base import nested, require, wilson
from workbench.plots.halting import halting_figure
from workbench.plots.registry import Figure, Section
from workbench.plots.theme import COLORWAY, apply_theme

LENSES = ("logit", "coda", "tuned")
MEASURES = {"agree_label": "top-1 = the row's x_t", "agree_final": "top-1 = the final output"}


def _band(fig, x, low, high, color, group, **at):
    fig.add_trace(go.Scatter(x=list(x) + list(x)[::-1], y=list(high) + list(low)[::-1], fill="toself",
                             fillcolor=color, opacity=0.15, line=dict(width=0), hoverinfo="skip", showlegend=False,
                             legendgroup=group), **at)


def lens_passes_figure(df: pd.DataFrame, summary: pd.DataFrame) -> go.Figure:
    """Per lens and pass: top-1 agreement with x_t and with the final output (95% Wilson bands), and the KL
    from the final distribution; dotted, the pairwise agreement of the lenses.

    Args:
        df: the lens_agreement table (the figure reads its summary part).
        summary: lens_agreement__summary (loop, lens, measure, value, low, high, n).
    """
    require(summary, ["loop", "lens", "measure", "value", "low", "high", "n"], "lens_agreement__summary")
    fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.08,
                        subplot_titles=("top-1 = the row's x_t", "top-1 = the final output", "KL(final ‖ lens), nats"))
    for col, measure in enumerate(("agree_label", "agree_final", "kl_final"), 1):
        for i, lens in enumerate(LENSES):
            g = summary[(summary["measure"] == measure) & (summary["lens"] == lens)].sort_values("loop")
            if g.empty:
                continue
            color = COLORWAY[i % len(COLORWAY)]
            line, marker = nested(i, len(LENSES))
            _band(fig, g["loop"], g["low"], g["high"], color, lens, row=1, col=col)
            fig.add_trace(go.Scatter(x=g["loop"], y=g["value"], mode="lines+markers", name=f"{lens} lens",
                                     legendgroup=lens, showlegend=col == 1, line=dict(color=color, **line),
                                     marker=marker, customdata=g[["low", "high", "n"]],
                                     hovertemplate=f"{lens} lens, pass %{{x}}: %{{y:.3f}} [%{{customdata[0]:.2f}}, "
                                                   "%{customdata[1]:.2f}], n = %{customdata[2]}<extra></extra>"),
                          row=1, col=col)
    pairs = summary[summary["measure"] == "agree_pair"]
    for j, (pair, g) in enumerate(pairs.groupby("lens", sort=True)):
        g = g.sort_values("loop")
        line, _ = nested(j, 3)
        fig.add_trace(go.Scatter(x=g["loop"], y=g["value"], mode="lines", name=f"{pair} agree",
                                 line=dict(color=COLORWAY[(3 + j) % len(COLORWAY)], dash="dot", **line),
                                 hovertemplate=f"{pair}: lenses agree in %{{y:.3f}} at pass %{{x}}<extra></extra>"),
                      row=1, col=2)
    for col in (1, 2, 3):
        fig.update_xaxes(title="pass t", dtick=1, row=1, col=col)
    fig.update_yaxes(range=[0, 1.02], row=1, col=1)
    fig.update_yaxes(range=[0, 1.02], row=1, col=2)
    fig.update_layout(title="Do the lenses agree? Logit, coda and tuned lens at every pass", height=420)
    return apply_theme(fig)


def lens_causal_figure(df: pd.DataFrame, causal: pd.DataFrame) -> go.Figure:
    """Where the lenses disagree: the share of spliced cells whose reading each lens predicts B's read from,
    per kind of disagreement (logit ≠ coda, or only the tuned lens differs) and splice offset j (coincidences
    left out), with 95% Wilson intervals."""
    if causal.empty:  # the lenses agreed at every cell: no disagreement to splice (a finding, not a failure)
        fig = go.Figure()
        fig.add_annotation(text="the three lenses agree on every row at every pass: no cell to splice", showarrow=False,
                           x=0.5, y=0.5, xref="paper", yref="paper")
        fig.update_layout(title="Which lens is causal where they disagree", height=240)
        return apply_theme(fig)
    require(causal, ["j", "coincide", *[f"carried_{x}" for x in LENSES]], "lens_agreement__causal")
    kept = causal[~causal["coincide"].astype(bool)]
    fig = go.Figure()
    kinds = {"logit-coda": "logit ≠ coda", "tuned": "tuned only"}
    for i, lens in enumerate(LENSES):
        xs, ys, lo, hi, ns = [], [], [], [], []
        by = ["disagree", "j"] if "disagree" in kept else ["j"]
        for key, g in kept.groupby(by):
            kind, j = key if len(by) == 2 else (None, key[0] if isinstance(key, tuple) else key)
            g = g[g[lens].notna()]
            if g.empty:
                continue
            k, n = int(g[f"carried_{lens}"].sum()), len(g)
            low, high = wilson(k, n)
            xs.append((f"{kinds.get(kind, kind)}<br>" if kind else "") + f"j = {int(j)}")
            ys.append(k / n)
            lo.append(k / n - float(low))
            hi.append(float(high) - k / n)
            ns.append(n)
        fig.add_trace(go.Bar(x=xs, y=ys, name=f"{lens} lens", marker_color=COLORWAY[i % len(COLORWAY)],
                             error_y=dict(type="data", array=hi, arrayminus=lo, visible=True), customdata=ns,
                             hovertemplate=f"{lens} lens carries %{{y:.2f}} of %{{customdata}} cells, %{{x}}"
                                           "<extra></extra>"))
    fig.update_xaxes(title="disagreement, passes j after the splice", tickangle=0)
    fig.update_yaxes(title="share of cells carried", range=[0, 1.05])
    fig.update_layout(title="Which lens is causal where they disagree", barmode="group", height=420)
    fig = apply_theme(fig)
    fig.update_layout(legend=dict(orientation="h", yanchor="bottom", y=1.0, x=0, xanchor="left"))
    return fig


def dynamics_figure(df: pd.DataFrame, rows: pd.DataFrame | None = None) -> go.Figure:
    """Per block layer: the mean relative step ||h_{t+1} − h_t|| / ||h_t|| (log axis), the angle between
    consecutive steps and the distance to the last pass's state; the state (last block layer) in black;
    with `rows` (dynamics__rows) the title counts the state's settling / marginal / drifting rows."""
    require(df, ["layer", "loop", "rel_step", "angle_deg", "dist_last"], "dynamics")
    fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.08,
                        subplot_titles=("relative step, t → t+1", "angle between consecutive steps (°)",
                                        "distance to the last state"))
    layers = sorted(df["layer"].unique())
    last = layers[-1]
    for i, layer in enumerate(layers):
        g = df[df["layer"] == layer].groupby("loop")[["rel_step", "angle_deg", "dist_last"]].mean().reset_index()
        state = layer == last
        color = "#222222" if state else COLORWAY[i % len(COLORWAY)]
        line, marker = nested(i, len(layers), thinnest=1.5, widest=7.0)   # layers can step alike: nested stripes
        for col, y in enumerate(("rel_step", "angle_deg", "dist_last"), 1):
            h = g.dropna(subset=[y])
            fig.add_trace(go.Scatter(x=h["loop"], y=h[y], mode="lines+markers", name=f"layer {layer}"
                                     + (" (state)" if state else ""), legendgroup=str(layer), showlegend=col == 1,
                                     line=dict(color=color, **line), marker=marker,
                                     hovertemplate=f"layer {layer}, pass %{{x}}: %{{y:.4g}}<extra></extra>"),
                          row=1, col=col)
    if "beyond_support" in df and df["beyond_support"].any():
        first = float(df.loc[df["beyond_support"].astype(bool), "loop"].min())
        for col in (1, 2, 3):
            fig.add_vrect(x0=first - 0.5, x1=float(df["loop"].max()) + 0.5, fillcolor="#999", opacity=0.08,
                          line_width=0, row=1, col=col)
    fig.update_yaxes(type="log", row=1, col=1)
    for col in (1, 2, 3):
        fig.update_xaxes(title="pass t", dtick=1, row=1, col=col)
    title = "Where the loops go: step size, step angle and distance to the last state per block layer"
    if rows is not None and len(rows):
        s = rows[rows["layer"] == rows["layer"].max()]
        counts = ", ".join(f"{int((s['cls'] == c).sum())} {c}" for c in ("settling", "marginal", "drifting"))
        title += f"<br><sup>state past each row's depth: {counts} of {len(s)} rows (shaded: beyond the support)</sup>"
    fig.update_layout(title=title, height=500)
    fig = apply_theme(fig)
    fig.update_layout(legend=dict(orientation="h", yanchor="top", y=-0.22, x=0, xanchor="left", font=dict(size=10)),
                      margin=dict(b=120))
    return fig


def dynamics_heads_figure(df: pd.DataFrame, heads: pd.DataFrame) -> go.Figure:
    """Heatmap of each head's mean Jensen-Shannon divergence between consecutive passes' read-position attention
    (rows: layer and head; columns: the pass pair t, t+1)."""
    require(heads, ["loop", "layer", "head", "js_mean"], "dynamics__heads")
    if heads.empty:
        fig = go.Figure()
        fig.update_layout(title="No attention patterns read (heads = false or a model without pattern hooks)")
        return apply_theme(fig)
    z = heads.pivot_table(index=["layer", "head"], columns="loop", values="js_mean").sort_index()
    labels = [f"L{int(a)}H{int(b)}" for a, b in z.index]
    fig = go.Figure(go.Heatmap(x=[f"{int(t)}→{int(t) + 1}" for t in z.columns], y=labels, z=z.to_numpy(),
                               colorscale="Blues", colorbar=dict(title="JS (nats)", thickness=12),
                               hovertemplate="%{y}, passes %{x}: JS %{z:.4f}<extra></extra>"))
    fig.update_xaxes(title="passes t → t+1")
    fig.update_yaxes(title="block layer and head", autorange="reversed", tickfont=dict(size=7))
    fig.update_layout(title="Do the heads stabilise? Attention divergence between consecutive passes",
                      height=max(420, 6 * len(labels)))
    return apply_theme(fig)


def exit_rules_figure(df: pd.DataFrame, matched: pd.DataFrame | None = None) -> go.Figure:
    """The post-hoc rules on the halting probe's compute-accuracy axes beside fixed depths, the oracle and the
    learned heads; the rules matched to (within the match window of) a reference's mean loops are marked with
    diamonds."""
    require(df, ["method", "threshold", "mean_loops", "accuracy"], "exit_rules")
    fig = halting_figure(df)
    if matched is not None and "within" in matched:
        matched = matched[matched["within"].astype(bool)]
    if matched is not None and len(matched):
        fig.add_trace(go.Scatter(x=matched["mean_loops"], y=matched["accuracy"], mode="markers",
                                 name="matched to the reference's loops", customdata=matched[["method", "reference"]],
                                 marker=dict(symbol="diamond-open", size=13, color="#D55E00", line=dict(width=2)),
                                 hovertemplate="%{customdata[0]} matched to %{customdata[1]}<br>mean loops %{x:.2f}, "
                                               "accuracy %{y:.3f}<extra></extra>"))
        best = matched[matched["best"].astype(bool)]
        for k, ((method, _), g) in enumerate(best.groupby(["method", "threshold"], sort=False)):  # one label a point
            fig.add_annotation(x=float(g["mean_loops"].iloc[0]), y=float(g["accuracy"].iloc[0]),
                               text=f"best rule vs {', '.join(g['reference'])}: {method}", showarrow=True,
                               arrowhead=2, ax=30, ay=-70 - 30 * k)
    fig.update_layout(title="Post-hoc exit rules against fixed depths, the oracle and the learned heads", height=560)
    fig = apply_theme(fig)
    fig.update_layout(legend=dict(orientation="h", yanchor="top", y=-0.2, x=0, xanchor="left", font=dict(size=10)),
                      margin=dict(b=150))
    return fig


SECTIONS = {
    "lens_agreement": Section(
        title="Lens agreement per pass",
        about="Logit, coda and tuned lens at every pass against the row's x_t, the final output and each other; where "
              "they disagree, which lens's reading a splice into another row carries.",
        figures=(
            Figure(lens_passes_figure,
                   "Per lens and pass: top-1 = x_t, top-1 = the final output (95% Wilson bands) and KL from the final "
                   "distribution; dotted: pairwise agreement. Predicted: the coda lens reads x_t at every pass and "
                   "equals the output at t = T; a lens that skips the Coda agrees less where the Coda does work."),
            Figure(lens_causal_figure,
                   "Where the lenses disagree, the share of cells whose reading (under B's rule) B's read follows "
                   "after A's state is spliced in. Predicted: the coda lens's reading, if the Coda reads what the next "
                   "pass uses; a coordinate artefact of the logit lens carries nothing."),
        ),
    ),
    "dynamics": Section(
        title="Loop dynamics",
        about="Step size, step angle and distance to the last state per pass and block layer, each head's attention "
              "divergence between passes, and each row classed settling, marginal or drifting past its depth.",
        figures=(
            Figure(dynamics_figure,
                   "Mean relative step, step angle and distance to the last state per pass and block layer (state in "
                   "black; shaded: beyond the trained support). Predicted: a settling loop's steps shrink "
                   "geometrically past the depth; the chase keeper, which keeps iterating, keeps steps of about "
                   "constant size (marginal)."),
            Figure(dynamics_heads_figure,
                   "Each head's Jensen-Shannon divergence between consecutive passes' read-position attention. "
                   "Predicted: falling towards 0 where the heads stabilise (arXiv 2604.11791); staying up where each "
                   "pass looks up a new table line."),
        ),
    ),
    "exit_rules": Section(
        title="Post-hoc exit rules",
        about="Exit rules read off the passes (argmax stability, KL, entropy, step size and its second difference, max "
              "probability) swept on calibration rows, against fixed depths, the oracle and the learned halting heads.",
        figures=(
            Figure(exit_rules_figure,
                   "Accuracy against mean loops for every post-hoc rule swept over its threshold, beside fixed depths, "
                   "the oracle and the learned heads; diamonds: each rule at the reference's mean loops. Predicted: a "
                   "confidence readout at least as good as the learned gate at matched compute (arXiv 2607.20519)."),
        ),
    ),
}
