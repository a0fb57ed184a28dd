"""Head specialisation per loop: retrieval mass on the current symbol's table line (docs/analyses.md: heads)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from workbench.plots.base import SEQUENTIAL, add_slider, require
from workbench.plots.registry import Figure, Section
from workbench.plots.theme import COLORWAY, INK, apply_theme

HEAD_COLUMNS = ["row_id", "loop", "layer", "head", "target_mass", "table_mass"]


def head_means(df: pd.DataFrame) -> pd.DataFrame:
    """Returns mean target and table mass per (loop, layer, head) with the number of rows."""
    return (df.groupby(["loop", "layer", "head"])
              .agg(target_mass=("target_mass", "mean"), table_mass=("table_mass", "mean"), n=("row_id", "size"))
              .reset_index())


# What the circles mark (probes.heads.summary_table's defaults): the legend names it, the caption explains it.
RETRIEVAL_MARK = "○ retrieval head: target mass ≥ 3× its layer's median on at least half the rows"


def heads_figure(df: pd.DataFrame, summary: pd.DataFrame | None = None) -> go.Figure:
    """Returns layer × head heatmaps of mean attention mass on the retrieval target, one per loop (slider).

    Args:
        df: the heads table (row_id, loop, layer, head, target_mass, table_mass).
        summary: the heads__summary table; retrieval heads (is_retrieval) are then marked and the
            hover adds retrieval_frac.
    """
    require(df, HEAD_COLUMNS, "heads")
    means = head_means(df)
    if summary is not None:
        keep = [c for c in ("retrieval_frac", "is_retrieval") if c in summary.columns]
        means = means.merge(summary[["loop", "layer", "head", *keep]], on=["loop", "layer", "head"], how="left")
    layers = sorted(means["layer"].unique())
    heads = sorted(means["head"].unique())
    zmax = float(means["target_mass"].max()) or 1.0
    loops = sorted(int(t) for t in means["loop"].unique())
    fig, groups = go.Figure(), []
    for t in loops:
        m = means[means["loop"] == t]
        grid = m.pivot(index="layer", columns="head", values="target_mass").reindex(index=layers, columns=heads)
        table = m.pivot(index="layer", columns="head", values="table_mass").reindex(index=layers, columns=heads)
        frac = (m.pivot(index="layer", columns="head", values="retrieval_frac").reindex(index=layers, columns=heads)
                if "retrieval_frac" in m else pd.DataFrame(np.nan, index=layers, columns=heads))
        custom = np.stack([table.to_numpy(float), frac.to_numpy(float)], axis=-1)
        group = [len(fig.data)]
        fig.add_trace(go.Heatmap(
            x=heads, y=layers, z=grid.to_numpy(float), zmin=0, zmax=zmax, colorscale=SEQUENTIAL,
            name=f"loop {t}", customdata=custom, colorbar=dict(title="target<br>mass", thickness=12),
            hovertemplate=(f"loop {t}, layer %{{y}}, head %{{x}}<br>mass on target line %{{z:.3f}}"
                           "<br>mass on table %{customdata[0]:.3f}<br>retrieval fraction %{customdata[1]:.2f}"
                           "<extra></extra>")))
        if "is_retrieval" in m:
            hits = m[m["is_retrieval"].fillna(False).astype(bool)]
            group.append(len(fig.data))
            fig.add_trace(go.Scatter(
                x=hits["head"], y=hits["layer"], mode="markers", name=RETRIEVAL_MARK, legendgroup="retrieval",
                showlegend=not any(d.legendgroup == "retrieval" for d in fig.data),   # one entry for every loop
                marker=dict(symbol="circle-open", size=16, color=COLORWAY[3], line=dict(width=2.5)),
                hovertemplate=f"retrieval head at loop {t}: layer %{{y}}, head %{{x}}<extra></extra>"))
        groups.append(group)
    add_slider(fig, groups, loops, "loop t = ")
    fig.update_xaxes(title="head", dtick=1, showgrid=False)
    fig.update_yaxes(title="block layer", dtick=1, showgrid=False)
    fig.update_layout(title="Attention mass from the read position onto the line holding x_{t-1}, per loop",
                      height=520, showlegend=True, legend=dict(orientation="h", y=-0.18, x=0))
    return apply_theme(fig)


def head_concentration_figure(df: pd.DataFrame, summary: pd.DataFrame) -> go.Figure:
    """Returns the concentration of retrieval across heads per loop against its random-rotation null.

    Args:
        df: the heads table (its loops set the axis, so loops without a summary show as gaps).
        summary: the heads__summary table (loop, concentration, null_p95 per loop).
    """
    require(summary, ["loop", "concentration", "null_p95"], "heads__summary")
    loops = pd.Index(sorted(set(df["loop"]) | set(summary["loop"])), name="loop")
    per_loop = summary.groupby("loop")[["concentration", "null_p95"]].first().reindex(loops).reset_index()
    hover = "loop %{x}: concentration %{y:.3f}"
    if "is_retrieval" in summary.columns:
        count = summary[summary["is_retrieval"].astype(bool)].groupby("loop").size()
        per_loop["retrieval_heads"] = per_loop["loop"].map(count).fillna(0).astype(int)
        hover += ", retrieval heads %{customdata}"
    fig = go.Figure(go.Scatter(
        x=per_loop["loop"], y=per_loop["concentration"], mode="lines+markers", name="concentration (top-2 Σ share²)",
        line=dict(color=COLORWAY[0], width=2), customdata=per_loop.get("retrieval_heads"),
        hovertemplate=hover + "<extra></extra>"))
    fig.add_trace(go.Scatter(
        x=per_loop["loop"], y=per_loop["null_p95"], mode="lines", name="random-rotation null, 95th pct",
        line=dict(color=INK, dash="dash", width=1.5), hovertemplate="null p95 %{y:.3f}<extra></extra>"))
    fig.update_xaxes(title="loop t", dtick=1, range=[0.5, int(df["loop"].max()) + 0.5])
    fig.update_yaxes(title="concentration", rangemode="tozero")
    fig.update_layout(title="Is retrieval concentrated in a few heads? (above the null = yes)", height=400)
    return apply_theme(fig)


SECTIONS = {
    "heads": Section(
        title="Head specialisation",
        about="Attention mass from the read position onto the table line of the current symbol, per loop, layer and "
              "head.",
        figures=(
            Figure(heads_figure,
                   "Attention mass from the read position onto the table line of x_{t−1}, per layer and head, per "
                   "loop. Open circles mark retrieval heads: heads whose mass on that line is at least 3 times the "
                   "median head's of their layer on at least half the rows. Predicted: a few bright heads per loop, "
                   "the ones doing the lookup."),
            Figure(head_concentration_figure,
                   "Concentration of that mass across heads against a circular-shift null. Predicted: above the null "
                   "at every loop."),
        ),
    ),
}
