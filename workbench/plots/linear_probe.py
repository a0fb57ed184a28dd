"""Linear probe accuracy per loop, per site and target, against the label-permutation null."""

from __future__ import annotations

import math
import re

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.plots.base import nested, require
from workbench.plots.registry import Figure, Section
from workbench.plots.theme import COLORWAY, apply_theme

TARGETS = {"x_prev": "x_{t−1}", "x_t": "x_t", "x_next": "x_{t+1}"}
MAX_COLS = 3


def _site_order(sites) -> list[str]:
    """Returns "state" first, then block layers by index ("block.12" after "block.9")."""
    def key(s: str):
        m = re.fullmatch(r"block\.(\d+)", s)
        return (0 if s == "state" else 1 if m else 2, int(m.group(1)) if m else 0, s)
    return sorted(sites, key=key)


def linear_probe_figure(df: pd.DataFrame) -> go.Figure:
    """Returns probe accuracy vs loop, one panel per site, one colour per target; dashed: the null's 95th pct;
    dotted grey: chance (the test share of the most frequent training label, highest over targets).

    Args:
        df: the linear_probe table (loop, site, target, accuracy, null_p95, n_train, n_test).
    """
    require(df, ["loop", "site", "target", "accuracy", "null_p95", "n_test"], "linear_probe")
    sites = _site_order(df["site"].unique())
    targets = [t for t in TARGETS if t in set(df["target"])] + sorted(set(df["target"]) - set(TARGETS))
    ncols = min(MAX_COLS, len(sites))
    nrows = math.ceil(len(sites) / ncols)
    fig = make_subplots(rows=nrows, cols=ncols, shared_yaxes=True, subplot_titles=sites,
                        horizontal_spacing=0.05, vertical_spacing=0.18 if nrows > 1 else 0.1)
    for s, site in enumerate(sites):
        row, col = s // ncols + 1, s % ncols + 1
        for i, target in enumerate(targets):
            sub = df[(df["site"] == site) & (df["target"] == target)].sort_values("loop")
            if sub.empty:
                continue
            color, label = COLORWAY[i % len(COLORWAY)], TARGETS.get(target, target)
            # Targets can be decoded equally well (all at 1.0): nested widths keep every line visible.
            line, marker = nested(i, len(targets))
            null_line, _ = nested(i, len(targets), thinnest=1.0, step=1.5)
            fig.add_trace(go.Scatter(
                x=sub["loop"], y=sub["accuracy"], mode="lines+markers", name=label, legendgroup=target,
                showlegend=s == 0, line=dict(color=color, **line), marker=marker, customdata=sub["n_test"],
                hovertemplate=f"{site}, {label}, loop %{{x}}: accuracy %{{y:.3f}} (n_test %{{customdata}})<extra></extra>"),
                row=row, col=col)
            fig.add_trace(go.Scatter(
                x=sub["loop"], y=sub["null_p95"], mode="lines", name=f"{label}: null p95", legendgroup=target,
                showlegend=False, line=dict(color=color, dash="dash", **null_line),
                hovertemplate=f"{site}, {label}, loop %{{x}}: permutation null p95 %{{y:.3f}}<extra></extra>"),
                row=row, col=col)
        if "chance" in df.columns:
            chance = df[df["site"] == site].groupby("loop")["chance"].max().reset_index()
            fig.add_trace(go.Scatter(
                x=chance["loop"], y=chance["chance"], mode="lines", name="chance", legendgroup="chance",
                showlegend=s == 0, line=dict(color="#999999", dash="dot", width=1),
                hovertemplate=f"{site}, loop %{{x}}: chance %{{y:.3f}}<extra></extra>"), row=row, col=col)
        fig.update_xaxes(title="loop t" if row == nrows else None, dtick=1, row=row, col=col)
    fig.update_yaxes(range=[0, 1.02])
    fig.update_yaxes(title="probe accuracy", col=1)
    fig.update_layout(title="Where the chain symbols become linearly decodable (dashed: permutation null, 95th pct)",
                      height=380 * nrows + 80, legend=dict(orientation="h", y=-0.12 if nrows > 1 else -0.22))
    return apply_theme(fig)


SECTIONS = {
    "linear_probe": Section(
        title="Linear probes",
        about="Decodability of x_{t−1}, x_t, x_{t+1} from the loop state against a label-permutation null.",
        figures=(
            Figure(linear_probe_figure,
                   "Held-out accuracy of linear probes for x_{t−1}, x_t, x_{t+1} from loop t's state, dashed: the "
                   "permutation null. Predicted: x_t decodable above the null at every loop."),
        ),
    ),
}
