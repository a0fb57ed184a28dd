"""Engineering checks: per-loop gradient RMS by parameter group, and latency ratios."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from workbench.plots.base import nested, require
from workbench.plots.registry import Figure, Section
from workbench.plots.theme import COLORWAY, apply_theme

LATENCY = {"loops": "cost of T loops vs 1 loop", "forced_read": "one-pass forced read",
           "reruns": "per-depth reruns"}


def _fd_note(fd: pd.DataFrame | None) -> str:
    if fd is None or "rel_error" not in fd.columns or fd.empty:
        return ""
    return (f" (finite difference vs autograd: max relative error {fd['rel_error'].abs().max():.2g} "
            f"over {len(fd)} direction{'s' if len(fd) != 1 else ''})")


def gradient_audit_figure(df: pd.DataFrame, fd: pd.DataFrame | None = None) -> go.Figure:
    """Returns gradient RMS reaching each parameter group at each loop (log scale; all-zero groups named).

    Args:
        df: the gradient_audit table (loop, group, grad_rms).
        fd: the gradient_audit__fd table (direction, autograd, finite_difference, rel_error), summarised
            in the title.
    """
    require(df, ["loop", "group", "grad_rms"], "gradient_audit")
    means = df.groupby(["group", "loop"])["grad_rms"].mean().reset_index()
    dead = sorted(g for g, s in means.groupby("group") if (s["grad_rms"] == 0).all())
    fig = go.Figure()
    groups = list(means[~means["group"].isin(dead)].groupby("group", sort=True))
    for i, (group, s) in enumerate(groups):
        line, marker = nested(i, len(groups))  # groups fed the same gradient draw equal lines
        fig.add_trace(go.Scatter(x=s["loop"], y=s["grad_rms"].where(s["grad_rms"] > 0), mode="lines+markers",
                                 name=group, line=dict(color=COLORWAY[i % len(COLORWAY)], **line), marker=marker,
                                 hovertemplate=f"{group}, loop %{{x}}: grad RMS %{{y:.3g}}<extra></extra>"))
    # Log scale shows groups orders of magnitude apart; a zero cannot sit on it, and a zero gradient
    # is itself the finding (no re-entry at loop 1, a frozen group), so zeros are named in the title.
    fig.update_xaxes(title="loop t", dtick=1)
    positive = means["grad_rms"][means["grad_rms"] > 0]
    decades = np.log10(positive.max() / positive.min()) if len(positive) else 0.0
    # One labelled tick per decade when the groups span several; 2s and 5s as well when they do not.
    fig.update_yaxes(title="gradient RMS", type="log", dtick=1 if decades >= 1 else "D2", exponentformat="power")
    fig.update_layout(title="Gradient reaching each parameter group, per loop" + _fd_note(fd) + _zero_note(means, dead),
                      height=440)
    return apply_theme(fig)


def _zero_note(means: pd.DataFrame, dead: list[str]) -> str:
    parts = [f"no gradient at any loop: {', '.join(dead)}"] if dead else []
    zeros = means[(means["grad_rms"] == 0) & ~means["group"].isin(dead)]
    for loops, groups in zeros.groupby("group")["loop"].apply(tuple).reset_index().groupby("loop")["group"]:
        parts.append(f"zero at loop {', '.join(map(str, loops))}: {', '.join(sorted(groups))}")
    return f"<br><sup>{'; '.join(parts)}</sup>" if parts else ""


def latency_figure(df: pd.DataFrame) -> go.Figure:
    """Returns measured cost ratios against the ratios the layer count predicts, per measurement.

    Args:
        df: the latency table (what, loops, seconds, ratio, predicted_ratio).
    """
    require(df, ["what", "loops", "seconds", "ratio", "predicted_ratio"], "latency")
    fig = go.Figure()
    measurements = list(df.groupby("what", sort=True))
    for i, (what, sub) in enumerate(measurements):
        sub = sub.sort_values("loops")
        color, label = COLORWAY[i % len(COLORWAY)], LATENCY.get(what, what)
        # Measurements can share ratios (and predictions often do): nested widths keep each visible.
        line, marker = nested(i, len(measurements))
        predicted, _ = nested(i, len(measurements), thinnest=1.5, step=2.0)
        fig.add_trace(go.Scatter(
            x=sub["loops"], y=sub["ratio"], mode="lines+markers", name=f"{label}: measured", legendgroup=what,
            line=dict(color=color, **line), marker=marker, customdata=sub["seconds"],
            hovertemplate=f"{label}, T = %{{x}}: ratio %{{y:.2f}} (%{{customdata:.3f}} s)<extra></extra>"))
        fig.add_trace(go.Scatter(
            x=sub["loops"], y=sub["predicted_ratio"], mode="lines+markers", name=f"{label}: predicted",
            legendgroup=what, line=dict(color=color, dash="dash", **predicted),
            marker=dict(symbol="line-ew-open", size=14, line=dict(width=2, color=color)),
            hovertemplate=f"{label}, T = %{{x}}: predicted %{{y:.2f}}<extra></extra>"))
    fig.update_xaxes(title="loops T", dtick=1)
    fig.update_yaxes(title="time ratio", rangemode="tozero")
    fig.update_layout(title="Latency: measured ratios against what the layer count predicts", height=420)
    return apply_theme(fig)


SECTIONS = {
    "gradient_audit": Section(
        title="Gradient audit",
        about="Gradient reaching each parameter group per loop, checked against finite differences.",
        figures=(
            Figure(gradient_audit_figure,
                   "Gradient RMS reaching each parameter group from each loop's loss. Predicted: the re-entry reached "
                   "only from loop 2 on; block and Coda from every loop."),
        ),
    ),
    "latency": Section(
        title="Latency",
        about="Measured cost ratios against the ratios the layer count predicts.",
        figures=(
            Figure(latency_figure,
                   "Measured cost ratios against the layer-count prediction. Predicted: measured ≈ predicted, one "
                   "forced read several times cheaper than reruns."),
        ),
    ),
}
