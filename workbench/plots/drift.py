"""Subspace drift per loop: principal angles, and the concentration test against its random null."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.plots.base import SEQUENTIAL, nested, require
from workbench.plots.registry import Figure, Section
from workbench.plots.theme import COLORWAY, INK, apply_theme

COMPARISONS = {"consecutive": "loop t vs t−1", "vs_loop1": "loop t vs loop 1"}
NULL_FILL = "rgba(34,34,34,0.12)"


def _band(fig, x, low, high, name: str, fill: str, row: int, col: int, showlegend: bool = True) -> None:
    """Draws a filled band between `low` and `high` (two traces: the lower edge, then the filled upper)."""
    fig.add_trace(go.Scatter(x=x, y=low, mode="lines", line=dict(width=0), showlegend=False, hoverinfo="skip",
                             legendgroup=name, name=f"{name} (low)"), row=row, col=col)
    fig.add_trace(go.Scatter(x=x, y=high, mode="lines", line=dict(width=0), fill="tonexty", fillcolor=fill,
                             name=name, legendgroup=name, showlegend=showlegend, hoverinfo="skip"), row=row, col=col)


def _angles(fig: go.Figure, df: pd.DataFrame, row: int, col: int) -> None:
    comparisons = list(df.groupby("comparison", sort=True))
    for i, (comparison, sub) in enumerate(comparisons):
        color = COLORWAY[i % len(COLORWAY)]
        line, marker = nested(i, len(comparisons))  # at loop 2, "t vs t-1" and "t vs loop 1" are one comparison
        label = COMPARISONS.get(comparison, comparison)
        s = sub.groupby("loop")["angle_deg"].agg(["mean", "min", "max", "size"]).reset_index()
        fill = "rgba({},{},{},0.15)".format(*(int(color[j:j + 2], 16) for j in (1, 3, 5)))
        _band(fig, s["loop"], s["min"], s["max"], f"{label}: range over angles", fill, row, col)
        fig.add_trace(go.Scatter(
            x=s["loop"], y=s["mean"], mode="lines+markers", name=f"{label}: mean angle", line=dict(color=color, **line),
            marker=marker,
            customdata=s[["min", "max"]], legendgroup=label,
            hovertemplate=(f"{label}, loop %{{x}}: mean %{{y:.1f}}° (range %{{customdata[0]:.1f}}–"
                           "%{customdata[1]:.1f}°)<extra></extra>")), row=row, col=col)


def _concentration(fig: go.Figure, conc: pd.DataFrame, row: int, col: int) -> None:
    c = conc.groupby("loop")[["top3_share", "null_mean", "null_p95"]].first().reset_index()
    _band(fig, c["loop"], c["null_mean"], c["null_p95"], "random partitions: mean to 95th pct", NULL_FILL, row, col)
    fig.add_trace(go.Scatter(x=c["loop"], y=c["null_p95"], mode="lines", line=dict(color=INK, dash="dash", width=1),
                             name="null p95", showlegend=False,
                             hovertemplate="loop %{x}: null p95 %{y:.3f}<extra></extra>"), row=row, col=col)
    fig.add_trace(go.Scatter(
        x=c["loop"], y=c["top3_share"], mode="lines+markers", name="top-3 head share of drift energy",
        line=dict(color=COLORWAY[3], width=2),
        hovertemplate="loop %{x}: top-3 share %{y:.3f}<extra></extra>"), row=row, col=col)


def drift_figure(df: pd.DataFrame, concentration: pd.DataFrame | None = None) -> go.Figure:
    """Returns principal angles per loop and, when given, the top-3 head share against the random-null band.

    Args:
        df: the drift table (loop, comparison, angle_index, angle_deg).
        concentration: the drift__concentration table (loop, top3_share, null_p95, null_mean).
    """
    require(df, ["loop", "comparison", "angle_index", "angle_deg"], "drift")
    has_conc = concentration is not None and len(concentration) > 0
    if has_conc:
        require(concentration, ["loop", "top3_share", "null_p95", "null_mean"], "drift__concentration")
    cols = 2 if has_conc else 1
    fig = make_subplots(rows=1, cols=cols, horizontal_spacing=0.12, subplot_titles=(
        ["Principal angles between top-k PCA subspaces", "Drift outside loop 1's envelope, per head"][:cols]))
    _angles(fig, df, 1, 1)
    fig.update_yaxes(title="angle (degrees)", range=[0, 90], row=1, col=1)
    if has_conc:
        _concentration(fig, concentration, 1, 2)
        fig.update_yaxes(title="energy share of the top 3 heads", range=[0, 1], row=1, col=2)
    for c in range(1, cols + 1):
        fig.update_xaxes(title="loop t", dtick=1, row=1, col=c)
    fig.update_layout(title="Subspace drift across loops", height=460, legend=dict(orientation="h", y=-0.22))
    return apply_theme(fig)


def drift_heads_figure(df: pd.DataFrame, heads: pd.DataFrame) -> go.Figure:
    """Returns each head's share of the drift energy outside loop 1's subspace, per loop (loop × head heatmap).

    Args:
        df: the drift table (its loops fix the axis).
        heads: the drift__heads table (loop, layer, head, share).
    """
    require(heads, ["loop", "layer", "head", "share"], "drift__heads")
    heads = heads.assign(label=[f"L{layer}H{h}" for layer, h in zip(heads["layer"], heads["head"])])
    order = heads.drop_duplicates("label").sort_values(["layer", "head"])["label"].tolist()
    loops = sorted(set(df["loop"]) | set(heads["loop"]))
    grid = heads.pivot_table(index="loop", columns="label", values="share").reindex(index=loops, columns=order)
    fig = go.Figure(go.Heatmap(
        x=order, y=loops, z=grid.to_numpy(float), zmin=0, colorscale=SEQUENTIAL, name="share",
        texttemplate="%{z:.2f}", textfont=dict(size=9), colorbar=dict(title="share", thickness=12),
        hovertemplate="loop %{y}, head %{x}: share %{z:.3f}<extra></extra>"))
    fig.update_xaxes(title="head (block layer, head)", showgrid=False)
    fig.update_yaxes(title="loop t", dtick=1, showgrid=False)
    fig.update_layout(title="Where the drift outside loop 1's subspace lands: share per head output subspace",
                      height=380)
    return apply_theme(fig)


SECTIONS = {
    "drift": Section(
        title="Subspace drift",
        about="How far each loop's state subspace moves, and where the drift concentrates.",
        figures=(
            Figure(drift_figure,
                   "Principal angles between the loop states' subspaces, loop to loop and against loop 1. Predicted: "
                   "large early steps that settle as the loop converges."),
            Figure(drift_heads_figure,
                   "Each head's share of the drift outside loop 1's subspace. Predicted: concentrated in a few heads "
                   "if specific heads carry the update."),
        ),
    ),
}
