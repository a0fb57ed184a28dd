"""Arms side by side: final-answer accuracy by depth for each arm, the trained support shaded, the frontier bar and
the crossover marked; and frontier against support with the paper's 1.44-1.50 band (retrofit paper Sec. 8.1, 9.4).

Draws only what `workbench.analysis.arms` computed (no model code, no statistics here)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.plots.base import hline, nested, require, wilson
from workbench.plots.theme import COLORWAY, INK, apply_theme

PAPER_BAND = (1.44, 1.50)  # frontier / support, retrofit paper Sec. 8.1 (supports 4, 6, 8, 12)


def arms_accuracy_figure(depths: pd.DataFrame, names: tuple[str, str], supports: tuple[int, int],
                         crossover: float | None = None, bar: float = 0.71) -> go.Figure:
    """Returns accuracy vs depth for two arms with Wilson 95% intervals.

    Args:
        depths: `compare_arms(...)["depths"]` (depth, n, a_correct, b_correct, p_mcnemar, ...).
        names: the two arms' names (A, B).
        supports: each arm's trained support; the region up to the larger is shaded.
        crossover: the interpolated depth at which the arms cross, or None.
    """
    require(depths, ["depth", "n", "a_correct", "b_correct", "p_mcnemar"], "arms comparison")
    fig = go.Figure()
    d0, d1 = float(depths["depth"].min()), float(depths["depth"].max())
    fig.add_vrect(x0=d0 - 0.5, x1=max(supports) + 0.5, fillcolor="#888888", opacity=0.12, line_width=0,
                  annotation_text=f"trained support (1-{max(supports)})", annotation_position="top left")
    for i, (col, name) in enumerate((("a_correct", names[0]), ("b_correct", names[1]))):
        k, n = depths[col].to_numpy(), depths["n"].to_numpy()
        acc = k / n
        lo, hi = wilson(k, n)
        fig.add_trace(go.Scatter(
            x=depths["depth"], y=acc, mode="lines+markers", name=name,
            line=dict(color=COLORWAY[i], width=2, dash="solid" if i == 0 else "dash"),
            marker=dict(symbol="circle" if i == 0 else "square", size=8),
            customdata=np.stack([k, n, depths["p_mcnemar"]], axis=1),
            error_y=dict(type="data", symmetric=False, array=hi - acc, arrayminus=acc - lo, thickness=1, width=3),
            hovertemplate=f"{name}<br>depth %{{x}}: %{{y:.3f}} (%{{customdata[0]}}/%{{customdata[1]}}), "
                          "McNemar p %{customdata[2]:.3g}<extra></extra>"))
    fig.add_trace(hline(d0 - 0.5, d1 + 0.5, bar, f"bar {bar:.2f}"))
    title = f"{names[0]} vs {names[1]}: final-answer accuracy by depth"
    if crossover is not None and not math.isnan(crossover):
        fig.add_vline(x=crossover, line=dict(color=INK, dash="dot", width=1))
        title += f" (cross at depth {crossover:.2f})"
    else:
        title += " (no crossing)"
    fig.update_xaxes(title="depth d (read at loop t = d)", dtick=1)
    fig.update_yaxes(title="accuracy", range=[0, 1.05])
    fig.update_layout(title=title, height=420, legend=dict(orientation="h", y=-0.2),
                      meta=dict(crossover=crossover, supports=list(supports)))
    return apply_theme(fig)


def frontier_support_figure(table: pd.DataFrame) -> go.Figure:
    """Returns frontier vs trained support: one marker per run at the registered bar, 0.60 / 0.80 as error bars, the
    paper's 1.44-1.50 x support band, and frontiers censored by the task's deepest depth drawn hollow.

    Args:
        table: one row per (run, bar): run, support, bar, frontier, censored, seed.
    """
    require(table, ["run", "support", "bar", "frontier", "censored"], "support scaling")
    fig = go.Figure()
    s_max = float(table["support"].max()) + 1
    xs = np.array([0.0, s_max])
    fig.add_trace(go.Scatter(x=np.r_[xs, xs[::-1]], y=np.r_[PAPER_BAND[0] * xs, PAPER_BAND[1] * xs[::-1]],
                             mode="lines", fill="toself", fillcolor="rgba(0,114,178,0.15)", line=dict(width=0),
                             name=f"paper: {PAPER_BAND[0]}-{PAPER_BAND[1]} x support", hoverinfo="skip"))
    fig.add_trace(go.Scatter(x=xs, y=xs, mode="lines", line=dict(color=INK, dash="dot", width=1),
                             name="frontier = support", hoverinfo="skip"))
    main = table[np.isclose(table["bar"], 0.71)].sort_values(["support", "run"])
    sens = table.pivot_table(index="run", columns="bar", values="frontier")
    for i, (_, r) in enumerate(main.iterrows()):
        lo = sens.loc[r["run"]].get(0.8, np.nan)
        hi = sens.loc[r["run"]].get(0.6, np.nan)
        fig.add_trace(go.Scatter(
            x=[r["support"]], y=[r["frontier"]], mode="markers",
            name=str(r["run"]) + (" (censored: at least this)" if r["censored"] else ""),
            marker=dict(size=11, color=COLORWAY[i % len(COLORWAY)],
                        symbol="circle-open" if r["censored"] else "circle", line=dict(width=2)),
            error_y=dict(type="data", symmetric=False, array=[hi - r["frontier"]],
                         arrayminus=[r["frontier"] - lo], thickness=1, width=4),
            hovertemplate=(f"{r['run']}<br>support {r['support']}: frontier {r['frontier']:.2f} "
                           f"({r['frontier'] / r['support']:.2f} x support; 0.80: {lo:.2f}, 0.60: {hi:.2f})"
                           + (" censored" if r["censored"] else "") + "<extra></extra>")))
    fig.update_xaxes(title="trained support (deepest supervised depth)", range=[0, s_max], dtick=1)
    fig.update_yaxes(title="frontier at 0.71 (bars: 0.80 to 0.60)", rangemode="tozero")
    fig.update_layout(title="Frontier vs support", height=420, legend=dict(orientation="h", y=-0.2))
    return apply_theme(fig)


def controls_figure(table: pd.DataFrame, support: int, bar: float = 0.71) -> go.Figure:
    """Returns the retrofit paper's Fig. 4 view for any set of arms: (A) accuracy by depth with Wilson 95% intervals
    and the trained support shaded; (B) the same accuracies against median batch-1 latency (log scale), one point
    per depth, so each arm's cost of going deeper is read along its line.

    Args:
        table: one row per (arm, depth): arm, kind (looped / direct / scratchpad), depth, correct, n, median_s.
        support: the trained support shaded in panel A (the arms compared share it).
    """
    require(table, ["arm", "kind", "depth", "correct", "n", "median_s"], "controls")
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1,
                        subplot_titles=("A. accuracy by depth", "B. accuracy against latency (batch 1)"))
    d0, d1 = float(table["depth"].min()), float(table["depth"].max())
    # exclude_empty_subplots=False: drawn before the traces, the shade would otherwise be dropped from the empty panel
    fig.add_vrect(x0=d0 - 0.5, x1=support + 0.5, fillcolor="#888888", opacity=0.12, line_width=0, row=1, col=1,
                  exclude_empty_subplots=False, annotation_text=f"trained support (1-{support})",
                  annotation_position="top left")
    for i, (arm, g) in enumerate(table.groupby("arm", sort=False)):
        g = g.sort_values("depth")
        k, n = g["correct"].to_numpy(), g["n"].to_numpy()
        acc = k / n
        lo, hi = wilson(k, n)
        line, marker = nested(i, table["arm"].nunique())
        style = dict(line=dict(color=COLORWAY[i % len(COLORWAY)], **line), marker=marker)
        ms = 1e3 * g["median_s"].to_numpy()
        custom = np.stack([g["depth"], k, n, ms], axis=1)
        hover = (f"{arm} ({g['kind'].iloc[0]})<br>depth %{{customdata[0]}}: %{{customdata[1]}}/%{{customdata[2]}}, "
                 "%{customdata[3]:.0f} ms<extra></extra>")
        fig.add_trace(go.Scatter(x=g["depth"], y=acc, mode="lines+markers", name=arm, legendgroup=arm,
                                 customdata=custom, hovertemplate=hover,
                                 error_y=dict(type="data", symmetric=False, array=hi - acc, arrayminus=acc - lo,
                                              thickness=1, width=3), **style), row=1, col=1)
        fig.add_trace(go.Scatter(x=ms, y=acc, mode="lines+markers+text", name=arm, legendgroup=arm,
                                 showlegend=False, text=[f"d{d}" for d in g["depth"]], textposition="top center",
                                 textfont=dict(size=9), customdata=custom, hovertemplate=hover, **style),
                      row=1, col=2)
    fig.add_trace(hline(d0 - 0.5, d1 + 0.5, bar, f"bar {bar:.2f}"), row=1, col=1)
    fig.update_xaxes(title="depth d", dtick=1, row=1, col=1)
    fig.update_xaxes(title="median latency per row (ms, log)", type="log", row=1, col=2)
    fig.update_yaxes(title="final-answer accuracy", range=[0, 1.08], row=1, col=1)
    fig.update_yaxes(range=[0, 1.08], row=1, col=2)
    fig.update_layout(title="Looped arms and dense controls on the same rows", height=460,
                      legend=dict(orientation="h", y=-0.22))
    return apply_theme(fig)
