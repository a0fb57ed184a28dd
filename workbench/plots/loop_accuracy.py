"""Accuracy by the number of loops spent, per depth (RecurTrace Table 5; the `loop_accuracy` probe's table)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from workbench.plots.base import nested, require, wilson
from workbench.plots.registry import Figure, Section
from workbench.plots.theme import COLORWAY, apply_theme


def loop_accuracy_figure(df: pd.DataFrame) -> go.Figure:
    """Returns final-answer accuracy against loop count, one line per depth plus all rows, Wilson 95% intervals.

    Args:
        df: the loop_accuracy table (row_id, depth, loop, predicted, correct).
    """
    require(df, ["row_id", "depth", "loop", "correct"], "loop_accuracy")
    fig = go.Figure()
    groups = [(f"depth {d}" if d else "depth not given", g) for d, g in df.groupby("depth")] + [("all rows", df)]
    for i, (name, g) in enumerate(groups):
        agg = g.assign(correct=g["correct"].astype(float)).groupby("loop")["correct"].agg(["sum", "count"])
        k, n = agg["sum"].to_numpy(), agg["count"].to_numpy()
        acc = k / n
        lo, hi = wilson(k, n)
        last = name == "all rows"
        line, marker = nested(i, len(groups))   # equal curves stay visible: a stripe inside a stripe
        fig.add_trace(go.Scatter(
            x=agg.index, y=acc, mode="lines+markers", name=name, marker=marker,
            line=dict(line, color="#222222" if last else COLORWAY[i % len(COLORWAY)], dash="solid" if last else "dot"),
            customdata=np.stack([k, n], axis=1),
            error_y=dict(type="data", symmetric=False, array=hi - acc, arrayminus=acc - lo, thickness=1, width=3),
            hovertemplate=f"{name}<br>loop %{{x}}: %{{y:.3f}} (%{{customdata[0]:.0f}}/%{{customdata[1]:.0f}})"
                          "<extra></extra>"))
    fig.update_xaxes(title="loops run (the answer read after loop t)", dtick=1)
    fig.update_yaxes(title="final-answer accuracy", range=[0, 1.05])
    fig.update_layout(title="Accuracy by loop count", height=420, legend=dict(orientation="h", y=-0.2))
    return apply_theme(fig)


SECTIONS = {
    "loop_accuracy": Section(
        title="Accuracy by loop count",
        about="The final answer read after every loop count, for any task: the fixed depths of the compute-accuracy "
              "curve.",
        figures=(
            Figure(loop_accuracy_figure,
                   "Final-answer accuracy after t loops, per depth and over all rows. Predicted: rising with loops "
                   "until each depth's answer is reached, then flat if the state persists (RecurTrace Table 5)."),
        ),
    ),
}
