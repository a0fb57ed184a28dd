"""Small helpers shared by the figure builders: column checks, sliders, reference lines, intervals."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from workbench.analysis import stats
from workbench.errors import WorkbenchError
from workbench.plots.theme import INK

# A sequential scale from white: an empty cell reads as "nothing", a dark one as "all of it".
SEQUENTIAL = "Blues"
CLASS_COLORS = {
    # overshoot
    "iterate": "#0072B2", "park": "#009E73",
    # splice
    "source_orbit": "#0072B2", "lawful": "#009E73", "shortcut": "#E69F00",
    "other": "#BBBBBB",
}


# Marker shapes for series that may coincide, in drawing order (see `nested`).
NESTED_SYMBOLS = ["circle", "square", "diamond", "triangle-up", "cross", "x", "hexagon", "star-triangle-up"]


def nested(i: int, n: int, thinnest: float = 2.0, step: float = 3.0, widest: float = 11.0) -> tuple[dict, dict]:
    """Returns (line, marker) style for the i-th of n series of one kind that can be equal.

    Lines of one kind on one axis (one per lens, depth, target, ...) can carry the same numbers, and
    the one drawn last would hide the others. The first drawn is the widest line with the largest
    marker; each later one is thinner, with a smaller marker of its own shape, so equal series show
    as a stripe inside a stripe. Colour, dash and the data are left to the caller.
    """
    if n < 2:
        width = thinnest
    else:
        width = thinnest + min(step, (widest - thinnest) / (n - 1)) * (n - 1 - i)
    width = round(width, 2)
    return dict(width=width), dict(symbol=NESTED_SYMBOLS[i % len(NESTED_SYMBOLS)], size=round(width + 5, 2))


def require(df: pd.DataFrame, columns, what: str) -> None:
    """Raises WorkbenchError naming the missing columns when `df` lacks any of `columns`."""
    if not isinstance(df, pd.DataFrame):
        raise WorkbenchError(f"{what} figure needs a pandas DataFrame, got {type(df).__name__}")
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise WorkbenchError(f"{what} table lacks column(s) {', '.join(missing)}; it has {', '.join(map(str, df.columns))}")
    if df.empty:
        raise WorkbenchError(f"{what} table is empty; nothing to plot")


def add_slider(fig: go.Figure, groups: list[list[int]], labels: list, prefix: str, active: int = 0) -> None:
    """Adds a slider whose step i shows only the traces in `groups[i]` (trace indices).

    Traces that belong to no group stay visible in every step.
    """
    grouped = {i for g in groups for i in g}
    n = len(fig.data)
    steps = []
    for g, label in zip(groups, labels):
        visible = [(i in g) or (i not in grouped) for i in range(n)]
        steps.append(dict(method="update", args=[{"visible": visible}], label=str(label)))
    for i, trace in enumerate(fig.data):
        if i in grouped:
            trace.visible = i in groups[active]
    fig.update_layout(sliders=[dict(active=active, steps=steps, currentvalue=dict(prefix=prefix),
                                    pad=dict(t=45), len=1.0)])


def hline(x0: float, x1: float, y: float, name: str, dash: str = "dash", color: str = INK,
          showlegend: bool = True, **kwargs) -> go.Scatter:
    """Returns a horizontal reference line as a trace (so it is named, in the legend and in the CSV)."""
    return go.Scatter(x=[x0, x1], y=[y, y], mode="lines", name=name, showlegend=showlegend,
                      line=dict(color=color, dash=dash, width=1.5), hovertemplate=f"{name}<extra></extra>",
                      **kwargs)


def wilson(k, n) -> tuple[np.ndarray, np.ndarray]:
    """Returns the 95% Wilson interval (low, high) of each k successes out of n trials, elementwise, NaN where n is 0.

    Each interval is `workbench.analysis.stats.wilson`'s, the one the headlines give, so a figure's error bar and the
    headline's interval of the same proportion are the same numbers.
    """
    k, n = np.broadcast_arrays(np.asarray(k, dtype=float), np.asarray(n, dtype=float))
    bounds = [stats.wilson(int(round(a)), int(b)) if b >= 1 else (np.nan, np.nan) for a, b in zip(k.ravel(), n.ravel())]
    low, high = (np.array([b[i] for b in bounds], dtype=float).reshape(k.shape) for i in (0, 1))
    return low, high


def class_fractions(df: pd.DataFrame, by: list[str], classes: list[str], col: str = "cls") -> pd.DataFrame:
    """Returns one row per `by` group with the fraction of each class in `classes` and the count `n`.

    Classes seen in the data but not in `classes` are pooled into the last listed class ("other").
    """
    cls = df[col].where(df[col].isin(classes), classes[-1])
    counts = pd.crosstab([df[c] for c in by], cls).reindex(columns=classes, fill_value=0)
    n = counts.sum(axis=1)
    frac = counts.div(n, axis=0)
    frac["n"] = n
    return frac.reset_index()
