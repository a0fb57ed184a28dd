"""Where the answer is made: the patching grid, its gradient estimate beside it, and the loop-to-loop paths
(the `patching`, `attribution` and `paths` probes' tables)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.plots.base import add_slider, nested, require
from workbench.plots.registry import Figure, Section
from workbench.plots.theme import COLORWAY, apply_theme

DIVERGING = "RdBu"
COMPONENT_WORDS = {"resid": "residual", "attn": "attention out", "mlp": "MLP out"}


def _heat(part: pd.DataFrame, loops: list[int], layers: list[int], value: str = "recovered") -> np.ndarray:
    z = np.full((len(loops), len(layers)), np.nan)
    row, col = {t: i for i, t in enumerate(loops)}, {x: j for j, x in enumerate(layers)}
    for r in part.itertuples():
        z[row[r.loop], col[r.layer]] = getattr(r, value)
    return z


def patching_figure(df: pd.DataFrame, grid: pd.DataFrame) -> go.Figure:
    """Loop x block layer heatmaps of the recovered share: one row per component, one column per position class,
    a slider over the corruptions.

    Args:
        df: the patching table (per pair and cell; only checked here).
        grid: patching__grid (corruption, loop, layer, position, component, recovered, low, high, n).
    """
    require(grid, ["corruption", "loop", "layer", "position", "component", "recovered", "n"], "patching__grid")
    components = [c for c in ("resid", "attn", "mlp") if c in set(grid["component"])]
    positions = [p for p in ("edited", "entries", "start", "question", "other", "read") if p in set(grid["position"])]
    loops, layers = sorted(grid["loop"].unique()), sorted(grid["layer"].unique())
    fig = make_subplots(rows=len(components), cols=len(positions), shared_xaxes=True, shared_yaxes=True,
                        horizontal_spacing=0.02, vertical_spacing=0.06,
                        column_titles=positions, row_titles=[COMPONENT_WORDS[c] for c in components])
    groups, labels = [], []
    for corruption, part in grid.groupby("corruption", sort=False):
        group = []
        for i, comp in enumerate(components):
            for j, pos in enumerate(positions):
                cell = part[(part["component"] == comp) & (part["position"] == pos)]
                if cell.empty:
                    continue
                z = _heat(cell, loops, layers)
                n = _heat(cell, loops, layers, "n")
                fig.add_trace(go.Heatmap(z=z, x=layers, y=loops, zmin=-1, zmax=1, zmid=0, colorscale=DIVERGING,
                                         customdata=n, name=f"{corruption}: {comp} at {pos}",
                                         showscale=len(fig.data) == 0, colorbar=dict(title="recovered"),
                                         hovertemplate=(f"{corruption} edit, {COMPONENT_WORDS[comp]}, {pos} positions"
                                                        "<br>loop %{y}, layer %{x}: %{z:.2f} recovered"
                                                        " (%{customdata} pairs)<extra></extra>")),
                              row=i + 1, col=j + 1)
                group.append(len(fig.data) - 1)
        groups.append(group)
        labels.append(corruption)
    if len(groups) > 1:
        add_slider(fig, groups, labels, "corrupted: ")
    for i in range(len(components)):
        fig.update_yaxes(title_text="loop" if i == len(components) // 2 else None, row=i + 1, col=1, dtick=1)
    for j in range(len(positions)):
        fig.update_xaxes(title_text="block layer", row=len(components), col=j + 1)
    fig.update_layout(title="Activation patching: share of the answer's margin restored by one clean cell",
                      height=260 * len(components) + 120)
    return apply_theme(fig)


def patching_steps_figure(df: pd.DataFrame, steps: pd.DataFrame) -> go.Figure:
    """Recovered share of the read-position state after loop t, one line per edited step k, 95% intervals.

    Args:
        df: the patching table (only checked here).
        steps: patching__steps (step, loop, recovered, low, high, n).
    """
    require(steps, ["step", "loop", "recovered", "low", "high", "n"], "patching__steps")
    fig = go.Figure()
    groups = list(steps.groupby("step", sort=True))
    for i, (k, g) in enumerate(groups):
        g = g.sort_values("loop")
        color = COLORWAY[i % len(COLORWAY)]
        line, marker = nested(i, len(groups))   # steps can read alike: each stays visible inside the one before
        fig.add_trace(go.Scatter(x=g["loop"], y=g["recovered"], mode="lines+markers", name=f"entry read by loop {k}",
                                 line=dict(color=color, **line), marker=marker,
                                 error_y=dict(type="data", symmetric=False, array=g["high"] - g["recovered"],
                                              arrayminus=g["recovered"] - g["low"], color=color),
                                 customdata=g["n"], hovertemplate=(f"entry read by loop {k}<br>state after loop %{{x}}:"
                                                                   " %{y:.2f} (%{customdata} pairs)<extra></extra>")))
    fig.update_layout(title="When an edited entry enters the read position's state",
                      xaxis=dict(title="loop t whose read-position state is patched", dtick=1),
                      yaxis=dict(title="recovered share of the margin"))
    return apply_theme(fig)


def attribution_figure(df: pd.DataFrame, check: pd.DataFrame) -> go.Figure:
    """Exact (left) and gradient (right) recovered share on the check pairs, loop x block layer, per component,
    at the position class where the exact grid recovers most; a slider over the corruptions.

    Args:
        df: the attribution table (only checked here).
        check: attribution__check (corruption, loop, layer, position, component, exact, gradient).
    """
    require(check, ["corruption", "loop", "layer", "position", "component", "exact", "gradient"], "attribution__check")
    components = [c for c in ("resid", "attn", "mlp") if c in set(check["component"])]
    loops, layers = sorted(check["loop"].unique()), sorted(check["layer"].unique())
    fig = make_subplots(rows=len(components), cols=2, shared_xaxes=True, shared_yaxes=True, horizontal_spacing=0.04,
                        vertical_spacing=0.06, column_titles=["exact patching", "gradient estimate (AtP)"],
                        row_titles=[COMPONENT_WORDS[c] for c in components])
    groups, labels = [], []
    for corruption, part in check.groupby("corruption", sort=False):
        best = part.groupby("position")["exact"].apply(lambda s: s.abs().max()).idxmax()
        group = []
        for i, comp in enumerate(components):
            cell = part[(part["component"] == comp) & (part["position"] == best)]
            for j, value in enumerate(("exact", "gradient")):
                fig.add_trace(go.Heatmap(z=_heat(cell, loops, layers, value), x=layers, y=loops, zmin=-1, zmax=1,
                                         zmid=0, colorscale=DIVERGING, showscale=len(fig.data) == 0,
                                         colorbar=dict(title="recovered"), name=f"{corruption}: {comp} {value}",
                                         hovertemplate=(f"{corruption} edit, {COMPONENT_WORDS[comp]} at {best}, {value}"
                                                        "<br>loop %{y}, layer %{x}: %{z:.2f}<extra></extra>")),
                              row=i + 1, col=j + 1)
                group.append(len(fig.data) - 1)
        groups.append(group)
        labels.append(f"{corruption} ({best} positions)")
    if len(groups) > 1:
        add_slider(fig, groups, labels, "corrupted: ")
    for j in (1, 2):
        fig.update_xaxes(title_text="block layer", row=len(components), col=j)
    fig.update_yaxes(dtick=1)
    fig.update_layout(title="The gradient map beside the exact grid, same cells, same pairs",
                      height=260 * len(components) + 120)
    return apply_theme(fig)


ROUTE_WORDS = {"loops": "through the later loops", "loops_read": "read position only, then the loops",
               "readout": "straight into the readout"}


def paths_figure(df: pd.DataFrame, routes: pd.DataFrame) -> go.Figure:
    """Recovered share at loop u of the clean state leaving loop t: one panel per route, one line per t, per corruption.

    Args:
        df: the paths table (only checked here).
        routes: paths__routes (corruption, route, source, read, recovered, low, high, n).
    """
    require(routes, ["corruption", "route", "source", "read", "recovered", "low", "high", "n"], "paths__routes")
    names = [r for r in ("loops", "loops_read", "readout") if r in set(routes["route"])]
    fig = make_subplots(rows=1, cols=len(names), shared_yaxes=True, horizontal_spacing=0.05,
                        subplot_titles=[ROUTE_WORDS[r] for r in names])
    groups, labels = [], []
    sources = sorted(routes["source"].unique())
    kinds = list(dict.fromkeys(routes["corruption"]))
    for c, (corruption, part) in enumerate(routes.groupby("corruption", sort=False)):
        group = []
        for j, route in enumerate(names):
            for t, g in part[part["route"] == route].groupby("source", sort=True):
                i = sources.index(t)
                g = g.sort_values("read")
                color = COLORWAY[i % len(COLORWAY)]
                line, marker = nested(c * len(sources) + i, len(kinds) * len(sources))   # lines can coincide
                fig.add_trace(go.Scatter(x=g["read"], y=g["recovered"], mode="lines+markers", name=f"h_{t}",
                                         legendgroup=f"h_{t}", showlegend=j == 0, line=dict(color=color, **line),
                                         marker=marker,
                                         error_y=dict(type="data", symmetric=False, array=g["high"] - g["recovered"],
                                                      arrayminus=g["recovered"] - g["low"], color=color),
                                         customdata=g["n"],
                                         hovertemplate=(f"{corruption} edit, clean h_{t} {ROUTE_WORDS[route]}<br>read at "
                                                        "loop %{x}: %{y:.2f} (%{customdata} pairs)<extra></extra>")),
                              row=1, col=j + 1)
                group.append(len(fig.data) - 1)
        groups.append(group)
        labels.append(corruption)
    if len(groups) > 1:
        add_slider(fig, groups, labels, "corrupted: ")
    for j in range(len(names)):
        fig.update_xaxes(title_text="loop u read", dtick=1, row=1, col=j + 1)
    fig.update_yaxes(title_text="recovered share of the margin", row=1, col=1)
    fig.update_layout(title="The state leaving loop t: carried by the loops, or read as it is")
    return apply_theme(fig)


SECTIONS = {
    "patching": Section(
        title="Activation patching: loop x layer x position x component",
        about="The clean run's activation at one loop, block layer, class of positions and component written into a "
              "corrupted twin (one table entry or the start changed): the share of the answer's margin it restores.",
        figures=(
            Figure(patching_figure,
                   "Recovered share of the clean answer's logit margin when one cell (loop x block layer, per position "
                   "class and component) of the clean run is written into the corrupted twin; 1 restores the answer, 0 "
                   "carries nothing. Predicted: for a model that looks up once per loop, an edited entry reaches the "
                   "read position at the loop that reads it, through attention there."),
            Figure(patching_steps_figure,
                   "The read-position state after loop t patched in, for an edit to the entry loop k reads (one line "
                   "per k). Predicted: 0 before loop k, then near 1: the edit enters the state at its own loop."),
        ),
    ),
    "attribution": Section(
        title="Attribution patching: the gradient map and where it can be trusted",
        about="The first-order (gradient) estimate of every patching cell from one forward and one backward, checked "
              "against the exact grid on a few pairs.",
        figures=(
            Figure(attribution_figure,
                   "The exact grid (left) and the gradient estimate (right) of the same cells on the check pairs, per "
                   "component, at the position class where the exact grid recovers most. Predicted: close where the "
                   "path from the cell to the answer is near linear; apart where a softmax or norm saturates."),
        ),
    ),
    "paths": Section(
        title="Paths: through the later loops, or straight to the readout",
        about="The clean state leaving loop t put into the corrupted twin at every position, at the read position "
              "only, or straight into the readout of a later loop: how much of the answer travels through the loops.",
        figures=(
            Figure(paths_figure,
                   "Recovered share at loop u of the clean state leaving loop t, by route (one panel per route, one "
                   "line per t). Predicted: for a loop that iterates, near 1 through the later loops, near 0 straight "
                   "into the readout (h_t holds x_t, not the answer the later loop reads)."),
        ),
    ),
}
