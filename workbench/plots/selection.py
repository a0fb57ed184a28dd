"""Block-selection figure: the angular-distance curve with its knees, the span and the chosen window,
above the damage of every ablated window."""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.plots.theme import COLORWAY, INK, apply_theme

SPAN_FILL, CHOSEN_FILL = "rgba(0,114,178,0.08)", "rgba(0,158,115,0.25)"


def curve_frame(selection: Mapping) -> pd.DataFrame:
    """Returns a tidy DataFrame of a block selection's curve: layer, angular_distance, region (prelude / span / coda).

    `selection` is a block_selection.json record (`workbench.selection.stage1.BlockSelection.to_dict()`).
    """
    n, start, end = len(selection["angular_distance"]), selection["prelude_end"], selection["coda_start"]
    region = ["prelude" if i < start else "coda" if i >= end else "span" for i in range(n)]
    return pd.DataFrame({"layer": range(n), "angular_distance": selection["angular_distance"], "region": region})


def windows_frame(selection: Mapping) -> pd.DataFrame:
    """Returns one row per ablated window of a block selection record (a, b, rank, damage and its parts)."""
    return pd.DataFrame([{"a": w["block"][0], "b": w["block"][1], **{k: v for k, v in w.items() if k != "block"}}
                         for w in selection["windows"]])


def angular_distance_figure(data, prelude_end: int | None = None, coda_start: int | None = None,
                            recommended: tuple[int, int] | None = None, windows: pd.DataFrame | None = None,
                            knees: dict | None = None, title: str | None = None) -> go.Figure:
    """Returns the figure: curve (top) and per-window damage (bottom, when windows are given).

    Args:
        data: a block selection record (block_selection.json, `BlockSelection.to_dict()`; everything
            else is read from it), or a DataFrame with columns `layer` and `angular_distance`.
        prelude_end, coda_start: the span [prelude_end, coda_start), shaded.
        recommended: the chosen window (a, b), shaded and marked in the damage panel.
        windows: DataFrame with columns a, b, damage (and loss_increase, accuracy_drop for hover).
        knees: {"prelude_end": {"layer", "reason"}, "coda_start": {...}}; knee layers get a line.
    """
    if isinstance(data, Mapping):
        curve, windows = curve_frame(data), windows_frame(data)
        prelude_end, coda_start, knees = data["prelude_end"], data["coda_start"], data["knees"]
        recommended = tuple(data["recommended"])
        title = title or f"Angular distance between adjacent layers: {data['model']}"
    else:
        curve = data
    has_windows = windows is not None and len(windows) > 0
    fig = make_subplots(rows=2 if has_windows else 1, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        row_heights=[0.65, 0.35] if has_windows else [1.0])
    _curve(fig, curve, prelude_end, coda_start, recommended, knees or {})
    if has_windows:
        _damage(fig, windows, recommended)
    fig.update_layout(title=title or "Angular distance between adjacent layers", showlegend=False,
                      height=620 if has_windows else 420)
    return apply_theme(fig)


def _curve(fig, curve: pd.DataFrame, prelude_end, coda_start, recommended, knees: dict) -> None:
    fig.add_trace(go.Scatter(
        x=curve["layer"], y=curve["angular_distance"], mode="lines+markers", line=dict(color=COLORWAY[0]),
        hovertemplate="layer %{x}<br>d(x_l, x_l+1) = %{y:.4f}<extra></extra>"), row=1, col=1)
    if prelude_end is not None and coda_start is not None:
        fig.add_vrect(x0=prelude_end - 0.5, x1=coda_start - 0.5, fillcolor=SPAN_FILL, line_width=0,
                      annotation_text=f"span {prelude_end}:{coda_start}", annotation_position="top left",
                      row=1, col=1)
    if recommended is not None:
        a, b = recommended
        fig.add_vrect(x0=a - 0.5, x1=b - 0.5, fillcolor=CHOSEN_FILL, line_width=0,
                      annotation_text=f"loop {a}:{b}", annotation_position="top right", row=1, col=1)
    for key, label in (("prelude_end", "Prelude knee"), ("coda_start", "Coda knee")):
        layer = (knees.get(key) or {}).get("layer")
        if layer is not None:
            fig.add_vline(x=layer, line=dict(color=COLORWAY[3], dash="dash", width=1.5), row=1, col=1,
                          annotation_text=f"{label} {layer}", annotation_position="bottom right")
    fig.update_yaxes(title_text="arccos(cos) / π", rangemode="tozero", row=1, col=1)


def _damage(fig, windows: pd.DataFrame, recommended) -> None:
    chosen = [recommended is not None and (a, b) == tuple(recommended) for a, b in zip(windows["a"], windows["b"])]
    custom = windows[[c for c in ("b", "loss_increase", "accuracy_drop") if c in windows]].to_numpy()
    fig.add_trace(go.Bar(
        x=windows["a"], y=windows["damage"], customdata=custom,
        marker_color=[COLORWAY[2] if c else COLORWAY[5] for c in chosen], marker_line_color=INK,
        marker_line_width=[1.5 if c else 0 for c in chosen],
        hovertemplate="loop %{x}:%{customdata[0]}<br>damage %{y:.4f}<br>Δloss %{customdata[1]:.4f} nats"
                      "<br>accuracy drop %{customdata[2]:.3f}<extra></extra>"), row=2, col=1)
    fig.update_yaxes(title_text="damage at loop 2", row=2, col=1)
    fig.update_xaxes(title_text="layer (bottom: first layer of the looped window)", row=2, col=1)


def sweep_frame(record: Mapping) -> pd.DataFrame:
    """One row per candidate of the window sweep (its table's rows): window, role, rank, held-out CE and its interval,
    loop-2 accuracy at depth 2 and its interval, seeds."""
    rows = []
    for r in record["table"]:
        ce, acc = r.get("heldout_ce") or {}, r.get("acc_d2_loop2") or {}
        rows.append({"window": r["window"], "role": r["role"], "rank": r["rank"], "seeds": r["seeds"],
                     "ce": ce.get("value"), "ce_low": ce.get("low"), "ce_high": ce.get("high"),
                     "acc": acc.get("value"), "acc_low": acc.get("low"), "acc_high": acc.get("high"),
                     "stopped": r["stopped_by_guardrail"]})
    return pd.DataFrame(rows)


def sweep_figure(record: Mapping, title: str | None = None) -> go.Figure:
    """The window sweep: held-out CE per candidate window with its 95% interval (left, lower is better) and loop-2
    accuracy at depth 2 with its Wilson interval (right), in rank order, the recommendation marked."""
    df = sweep_frame(record)
    df = df[df["ce"].notna()]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("held-out CE (nats, lower is better)",
                                                        "accuracy at depth 2, loop 2"), horizontal_spacing=0.12)
    labels = [f"{w} ({role}, {s} seed{'s' if s > 1 else ''})" for w, role, s in zip(df["window"], df["role"], df["seeds"])]
    chosen = [w == record.get("recommended") for w in df["window"]]
    colors = [COLORWAY[2] if c else COLORWAY[0] for c in chosen]
    fig.add_trace(go.Scatter(
        x=df["ce"], y=labels, mode="markers", marker=dict(color=colors, size=10),
        error_x=dict(type="data", symmetric=False, array=df["ce_high"] - df["ce"], arrayminus=df["ce"] - df["ce_low"]),
        hovertemplate="%{y}<br>CE %{x:.4f}<extra></extra>"), row=1, col=1)
    has_acc = df["acc"].notna()
    fig.add_trace(go.Scatter(
        x=df.loc[has_acc, "acc"], y=[lab for lab, h in zip(labels, has_acc) if h], mode="markers",
        marker=dict(color=[c for c, h in zip(colors, has_acc) if h], size=10),
        error_x=dict(type="data", symmetric=False, array=(df["acc_high"] - df["acc"])[has_acc],
                     arrayminus=(df["acc"] - df["acc_low"])[has_acc]),
        hovertemplate="%{y}<br>accuracy %{x:.3f}<extra></extra>"), row=1, col=2)
    fig.update_yaxes(autorange="reversed", row=1, col=1)
    fig.update_yaxes(autorange="reversed", showticklabels=False, row=1, col=2)
    fig.update_xaxes(range=[0, 1.02], row=1, col=2)
    fig.update_layout(title=title or f"Block selection, the window sweep: {record.get('budget', '')}",
                      showlegend=False, height=180 + 48 * max(len(df), 1))
    fig = apply_theme(fig)
    fig.update_layout(margin=dict(l=260))   # the window labels
    return fig
