"""Halting: the compute-accuracy curve (accuracy vs mean loops per method) and hard vs easy rows' depth."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.plots.base import nested, require
from workbench.plots.registry import Figure, Section
from workbench.plots.theme import COLORWAY, apply_theme

METHODS = {"head": "distilled head (tau sweep)", "halting": "halting head (threshold sweep)", "oracle": "oracle",
           "fixed_k": "fixed depth k", "act": "ACT", "pondernet": "PonderNet", "confidence": "confidence exit"}
SYMBOLS = {"oracle": "star", "fixed_k": "square"}
CHOSEN = "chosen on calibration rows"


def halting_figure(df: pd.DataFrame, difficulty: pd.DataFrame | None = None) -> go.Figure:
    """Returns the compute-accuracy curve: accuracy vs mean loops per method, hover the threshold.

    Points chosen on the calibration rows (`chosen`) are ringed in one trace and the best fixed depth
    is annotated; with `difficulty` (halting__difficulty) a second panel shows the mean loops of hard
    (wrong at loop 1) and easy rows per method at its chosen threshold.

    Args:
        df: the halting table (threshold, mean_loops, accuracy; optionally method, chosen); rows without a
            method are the halting head's own sweep.
    """
    require(df, ["threshold", "mean_loops", "accuracy"], "halting")
    data = df.copy()
    data["method"] = data["method"].fillna("halting") if "method" in data else "halting"
    order = [m for m in METHODS if m in set(data["method"])] + sorted(set(data["method"]) - set(METHODS))
    panels = difficulty is not None and not difficulty.empty
    fig = make_subplots(rows=1, cols=2, column_widths=[0.68, 0.32], horizontal_spacing=0.12,
                        subplot_titles=("accuracy for the compute spent", "mean loops: hard vs easy rows")) \
        if panels else go.Figure()
    at = dict(row=1, col=1) if panels else {}
    for i, method in enumerate(order):
        sub = data[data["method"] == method].sort_values(["mean_loops", "accuracy"])
        sweep = method not in ("oracle", "fixed_k")
        line, marker = nested(i, len(order))  # rules that collapse to the same depths draw equal lines
        fig.add_trace(go.Scatter(
            x=sub["mean_loops"], y=sub["accuracy"], mode="lines+markers" if len(sub) > 1 else "markers",
            name=METHODS.get(method, method), customdata=sub["threshold"], legendgroup=method,
            line=dict(color=COLORWAY[i % len(COLORWAY)], dash="solid" if sweep else "dot", **line),
            marker={**marker, **({"symbol": SYMBOLS[method]} if method in SYMBOLS else {})},
            hovertemplate=(f"{METHODS.get(method, method)}<br>mean loops %{{x:.2f}}, accuracy %{{y:.3f}}"
                           "<br>threshold %{customdata}<extra></extra>")), **at)
    if "chosen" in data and data["chosen"].any():
        picked = data[data["chosen"].astype(bool)]
        fig.add_trace(go.Scatter(
            x=picked["mean_loops"], y=picked["accuracy"], mode="markers", name=CHOSEN, customdata=picked["method"],
            marker=dict(symbol="circle-open", size=16, color="black", line=dict(width=2)),
            hovertemplate="%{customdata} as chosen<br>mean loops %{x:.2f}, accuracy %{y:.3f}<extra></extra>"), **at)
        best = picked[picked["method"] == "fixed_k"]
        if len(best):
            k, acc = float(best["mean_loops"].iloc[0]), float(best["accuracy"].iloc[0])
            fig.add_annotation(x=k, y=acc, text=f"best fixed depth k = {int(k)}", showarrow=True, arrowhead=2,
                               ax=30, ay=-30, **({"xref": "x", "yref": "y"} if panels else {}))
    if panels:
        for j, group in enumerate(("hard", "easy")):
            sub = difficulty[difficulty["group"] == group]
            fig.add_trace(go.Bar(x=[METHODS.get(m, m) for m in sub["method"]], y=sub["mean_loops"],
                                 name=f"{group} rows ({'wrong' if group == 'hard' else 'right'} at loop 1)",
                                 customdata=sub["n"], marker_color=COLORWAY[(len(order) + j) % len(COLORWAY)],
                                 hovertemplate="%{x}<br>mean loops %{y:.2f}, n = %{customdata}<extra></extra>"),
                          row=1, col=2)
        fig.update_layout(barmode="group")
        fig.update_yaxes(title="mean loops", row=1, col=2)
        fig.update_xaxes(tickangle=-35, row=1, col=2)
    fig.update_xaxes(title="mean loops spent per row", **at)
    fig.update_yaxes(title="accuracy", range=[0, 1.02], **at)
    fig.update_layout(title="Halting: accuracy for the compute spent", height=500 if panels else 420)
    fig = apply_theme(fig)
    if panels:   # one entry per method and two for the bars: below both panels, so neither panel is squeezed
        fig.update_layout(legend=dict(orientation="h", yanchor="top", y=-0.3, x=0, xanchor="left"),
                          margin=dict(b=150))
    return fig


SECTIONS = {
    "halting": Section(
        title="Halting",
        about="The compute-accuracy curve: accuracy against mean loops for every fixed depth, the oracle, the halting "
              "heads over their thresholds and a confidence exit, chosen on calibration rows and read on the others; "
              "hard and easy rows' mean depth.",
        figures=(
            Figure(halting_figure,
                   "Accuracy against mean loops per method, the calibration picks ringed, the best fixed depth marked; "
                   "right: mean loops of rows wrong (hard) and right (easy) at loop 1. Predicted: the distilled head "
                   "above the best fixed depth at about its compute, spending more loops on hard rows; ACT and "
                   "PonderNet collapsing to one loop (RecurTrace Fig. 1)."),
        ),
    ),
}
