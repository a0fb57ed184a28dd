"""Halting: accuracy against mean loops spent, for the halting head's threshold sweep and the baselines."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from workbench.plots.base import require
from workbench.plots.theme import COLORWAY, apply_theme

METHODS = {"halting": "halting head (threshold sweep)", "oracle": "oracle depth", "fixed_k": "fixed loops",
           "act": "ACT", "pondernet": "PonderNet", "confidence": "confidence exit"}
SYMBOLS = {"oracle": "star", "fixed_k": "square"}


def halting_figure(df: pd.DataFrame) -> go.Figure:
    """Returns the compute-accuracy curve: accuracy vs mean loops per method (hover: the threshold).

    Args:
        df: the halting table (threshold, mean_loops, accuracy, and optionally method); rows without a
            method are the halting head's own sweep.
    """
    require(df, ["threshold", "mean_loops", "accuracy"], "halting")
    data = df.copy()
    data["method"] = data["method"].fillna("halting") if "method" in data else "halting"
    order = [m for m in METHODS if m in set(data["method"])] + sorted(set(data["method"]) - set(METHODS))
    fig = go.Figure()
    for i, method in enumerate(order):
        sub = data[data["method"] == method].sort_values("mean_loops")
        fig.add_trace(go.Scatter(
            x=sub["mean_loops"], y=sub["accuracy"], mode="lines+markers" if len(sub) > 1 else "markers",
            name=METHODS.get(method, method), customdata=sub["threshold"],
            line=dict(color=COLORWAY[i % len(COLORWAY)], width=2, dash="solid" if method == "halting" else "dot"),
            marker=dict(symbol=SYMBOLS.get(method, "circle"), size=12 if method == "oracle" else 7),
            hovertemplate=(f"{METHODS.get(method, method)}<br>mean loops %{{x:.2f}}, accuracy %{{y:.3f}}"
                           "<br>threshold %{customdata}<extra></extra>")))
    fig.update_xaxes(title="mean loops spent per row")
    fig.update_yaxes(title="accuracy", range=[0, 1.02])
    fig.update_layout(title="Halting: accuracy for the compute spent", height=420)
    return apply_theme(fig)
