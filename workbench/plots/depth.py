"""Depth × loop accuracy and the validity frontier (docs/analyses.md: depth_matrix, frontier)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from workbench.analysis.stats import FRONTIER_BAR
from workbench.analysis.stats import frontier as frontier_depth
from workbench.plots.base import SEQUENTIAL, hline, require, wilson
from workbench.plots.registry import Figure, Section
from workbench.plots.theme import COLORWAY, apply_theme

DIAGONAL = "diagonal (t = d)"


def _correct(df: pd.DataFrame) -> pd.Series:
    """Returns `correct` as floats (1.0 / 0.0), NaN where the probe left it NA (loops past the depth)."""
    return pd.Series(df["correct"].astype("Float64").to_numpy(dtype=float, na_value=np.nan), index=df.index)


def accuracy_matrix(df: pd.DataFrame) -> pd.DataFrame:
    """Returns accuracy with depths as rows and loops as columns, cells with loop > depth left NaN.

    Only active labels count (loop t <= depth d): past d a row has no chain symbol to read,
    which is the overshoot probe's business.
    """
    active = df[df["loop"] <= df["depth"]].assign(correct=_correct)
    acc = active.groupby(["depth", "loop"])["correct"].mean().unstack("loop")
    return acc.sort_index().reindex(columns=range(1, int(df["loop"].max()) + 1)).astype(float)


def diagonal_accuracy(df: pd.DataFrame) -> pd.DataFrame:
    """Returns per-depth final-answer (loop = depth) counts: depth, n, correct, accuracy."""
    final = df[df["loop"] == df["depth"]].assign(correct=_correct)
    out = final.groupby("depth")["correct"].agg(n="count", correct="sum").reset_index()
    out["correct"] = out["correct"].astype(int)
    out["accuracy"] = out["correct"] / out["n"]
    return out


def depth_matrix_figure(df: pd.DataFrame) -> go.Figure:
    """Returns the depth × loop accuracy heatmap with the diagonal (t = d) cells outlined.

    Args:
        df: the depth_matrix table (row_id, depth, loop, target, predicted, correct).
    """
    require(df, ["row_id", "depth", "loop", "correct"], "depth_matrix")
    acc = accuracy_matrix(df)
    counts = df[df["loop"] <= df["depth"]].assign(correct=_correct).groupby(["depth", "loop"])["correct"].count()
    counts = counts.unstack("loop")
    counts = counts.reindex(index=acc.index, columns=acc.columns)
    fig = go.Figure(go.Heatmap(
        x=list(acc.columns), y=list(acc.index), z=acc.to_numpy(), zmin=0, zmax=1, colorscale=SEQUENTIAL,
        name="accuracy", customdata=counts.to_numpy(), texttemplate="%{z:.2f}", textfont=dict(size=9),
        colorbar=dict(title="accuracy", thickness=12),
        hovertemplate="depth %{y}, loop %{x}<br>accuracy %{z:.3f} (n = %{customdata})<extra></extra>"))
    depths = [d for d in acc.index if d in acc.columns]
    fig.add_trace(go.Scatter(
        x=depths, y=depths, mode="markers", name=DIAGONAL,
        marker=dict(symbol="square-open", size=22, color=COLORWAY[3], line=dict(width=2.5)),
        hovertemplate="final answer: depth %{y} at loop %{x}<extra></extra>"))
    fig.update_xaxes(title="loop t", dtick=1, showgrid=False)
    fig.update_yaxes(title="depth d", dtick=1, showgrid=False)
    fig.update_layout(title="Accuracy at every loop t ≤ d (active labels)", height=520,
                      legend=dict(orientation="h", y=-0.15))
    return apply_theme(fig)


def _frontier_value(diag: pd.DataFrame, table: pd.DataFrame | None, bar: float) -> tuple[float, float | None]:
    """Returns (frontier, support) at `bar`: from the probe's frontier table if given, else computed."""
    if table is not None and {"bar", "frontier"} <= set(table.columns):
        hit = table[np.isclose(table["bar"].astype(float), bar)]
        if len(hit):
            row = hit.iloc[0]
            support = float(row["support"]) if "support" in row and pd.notna(row["support"]) else None
            return float(row["frontier"]), support
    return frontier_depth(dict(zip(diag["depth"], diag["accuracy"])), bar=bar), None


def _fmt_depth(value: float) -> str:
    return "none" if math.isnan(value) else f"{value:.2f}"


def frontier_figure(df: pd.DataFrame, frontier: pd.DataFrame | None = None, bar: float = FRONTIER_BAR) -> go.Figure:
    """Returns diagonal accuracy vs depth with Wilson 95% intervals, the bar line and the frontier marked.

    Args:
        df: the depth_matrix table.
        frontier: the depth_matrix__frontier table (bar, frontier, support, ...); the frontier is
            computed with `workbench.analysis.stats.frontier` when it is absent.
        bar: the registered bar (0.71); 0.60 and 0.80 are shown as sensitivity in the title.
    """
    require(df, ["row_id", "depth", "loop", "correct"], "depth_matrix")
    diag = diagonal_accuracy(df)
    lo, hi = wilson(diag["correct"], diag["n"])
    fig = go.Figure(go.Scatter(
        x=diag["depth"], y=diag["accuracy"], mode="lines+markers", name="final-answer accuracy",
        line=dict(color=COLORWAY[0], width=2), customdata=np.stack([diag["correct"], diag["n"]], axis=1),
        error_y=dict(type="data", symmetric=False, array=hi - diag["accuracy"], arrayminus=diag["accuracy"] - lo,
                     thickness=1, width=3),
        hovertemplate="depth %{x}: %{y:.3f} (%{customdata[0]}/%{customdata[1]})<extra></extra>"))
    d0, d1 = float(diag["depth"].min()), float(diag["depth"].max())
    fig.add_trace(hline(d0 - 0.5, d1 + 0.5, bar, f"bar {bar:.2f}"))
    value, support = _frontier_value(diag, frontier, bar)
    if not math.isnan(value):
        fig.add_trace(go.Scatter(
            x=[value, value], y=[0, bar], mode="lines+markers", name=f"frontier {value:.2f}",
            line=dict(color=COLORWAY[3], dash="dot", width=1.5),
            marker=dict(symbol=["line-ew", "diamond"], size=[1, 12], color=COLORWAY[3]),
            hovertemplate=f"frontier at bar {bar:.2f}: depth {value:.2f}<extra></extra>"))
    sens = ", ".join(f"{_fmt_depth(_frontier_value(diag, frontier, b)[0])} at {b:.2f}" for b in (0.60, 0.80))
    head = f"frontier {value:.2f}" if not math.isnan(value) else "none (the first depth is already below the bar)"
    if support:
        head += f", support {support:g}"
    fig.update_xaxes(title="depth d (read at loop t = d)", dtick=1)
    fig.update_yaxes(title="accuracy", range=[0, 1.02])
    fig.update_layout(title=f"Validity frontier at {bar:.2f}: {head} (sensitivity: {sens})", height=420,
                      legend=dict(orientation="h", y=-0.2))
    fig.update_layout(meta=dict(frontier=value, bar=bar, support=support))
    return apply_theme(fig)


SECTIONS = {
    "depth_matrix": Section(
        title="Depth × loop accuracy and the frontier",
        about="Active-label accuracy at every loop t ≤ d; the diagonal is the final answer.",
        figures=(
            Figure(depth_matrix_figure,
                   "Active-label accuracy at every loop t ≤ d, the diagonal outlined. Predicted: every cell near 1 "
                   "within the trained support, the diagonal falling only past it."),
            Figure(frontier_figure,
                   "Final-answer accuracy per depth with Wilson 95% intervals and the bar. Predicted: the diagonal "
                   "crosses the bar past the trained support (frontier / support > 1; the paper: 1.44-1.50)."),
        ),
    ),
}
