"""Which figures each probe result gets: `FIGURES` maps a result name to its builders.

A builder takes the result's table as its first argument. Its other DataFrame parameters
name parts of the result and receive those tables: `top` of "logit_lens" receives the
`logit_lens__top` table. A part parameter without a default is required: the builder is
skipped when that part is absent; one with a default is passed only when present.
"""

from __future__ import annotations

import inspect
from typing import Callable, Mapping

import pandas as pd
import plotly.graph_objects as go

from workbench.errors import WorkbenchError
from workbench.plots.audit import gradient_audit_figure, latency_figure
from workbench.plots.classes import (
    overshoot_cost_figure,
    overshoot_figure,
    splice_figure,
)
from workbench.plots.depth import depth_matrix_figure, frontier_figure
from workbench.plots.drift import drift_figure, drift_heads_figure
from workbench.plots.halting import halting_figure
from workbench.plots.heads import head_concentration_figure, heads_figure
from workbench.plots.lens import lens_agreement_figure, logit_lens_figure
from workbench.plots.linear_probe import linear_probe_figure
from workbench.plots.loop_accuracy import loop_accuracy_figure
from workbench.plots.loop_dynamics import (
    dynamics_figure,
    dynamics_heads_figure,
    exit_rules_figure,
    lens_causal_figure,
    lens_passes_figure,
)

Builder = Callable[..., go.Figure]

FIGURES: dict[str, list[Builder]] = {
    "logit_lens": [logit_lens_figure, lens_agreement_figure],
    "depth_matrix": [depth_matrix_figure, frontier_figure],
    "loop_accuracy": [loop_accuracy_figure],
    "overshoot": [overshoot_figure, overshoot_cost_figure],
    "splice": [splice_figure],
    "heads": [heads_figure, head_concentration_figure],
    "linear_probe": [linear_probe_figure],
    "drift": [drift_figure, drift_heads_figure],
    "halting": [halting_figure],
    "lens_agreement": [lens_passes_figure, lens_causal_figure],
    "dynamics": [dynamics_figure, dynamics_heads_figure],
    "exit_rules": [exit_rules_figure],
    "gradient_audit": [gradient_audit_figure],
    "latency": [latency_figure],
}


def figure_key(builder: Builder) -> str:
    """Returns a builder's figure name: its function name without `_figure` (e.g. "frontier")."""
    return builder.__name__.removesuffix("_figure")


def builder_parts(result: str, builder: Builder) -> dict[str, tuple[str, bool]]:
    """Returns {parameter: (part table name, required)} for `builder`'s DataFrame parameters after the first."""
    params = list(inspect.signature(builder).parameters.values())[1:]
    return {p.name: (f"{result}__{p.name}", p.default is inspect.Parameter.empty)
            for p in params if "DataFrame" in str(p.annotation)}


def part_names(result: str) -> set[str]:
    """Returns the part tables the builders of `result` read (e.g. {"logit_lens__top"})."""
    return {part for b in FIGURES.get(result, []) for part, _ in builder_parts(result, b).values()}


def build(result: str, builder: Builder, tables: Mapping[str, pd.DataFrame], **options) -> go.Figure | None:
    """Returns `builder`'s figure from `tables` (result name -> DataFrame), or None if a required part is absent.

    `options` are further keyword arguments of the builder (e.g. `lens="raw"`).
    """
    kwargs = dict(options)
    for param, (part, required) in builder_parts(result, builder).items():
        if part in tables:
            kwargs[param] = tables[part]
        elif required:
            return None
    return builder(tables[result], **kwargs)


def build_all(tables: Mapping[str, pd.DataFrame], only: list[str] | None = None) -> list[tuple[str, str, go.Figure]]:
    """Returns (result, figure name, figure) for every registered figure whose tables are present.

    Args:
        tables: result name -> DataFrame, as loaded from a results directory.
        only: figure names to build (default: all), in registry order.
    """
    out = []
    for result, builders in FIGURES.items():
        if result not in tables:
            continue
        for builder in builders:
            if only is not None and figure_key(builder) not in only:
                continue
            fig = build(result, builder, tables)
            if fig is not None:
                out.append((result, figure_key(builder), fig))
    return out


def find_builder(name: str) -> tuple[str, Builder]:
    """Returns (result, builder) for a figure name such as "frontier"; WorkbenchError if unknown."""
    for result, builders in FIGURES.items():
        for builder in builders:
            if figure_key(builder) == name:
                return result, builder
    known = ", ".join(figure_key(b) for bs in FIGURES.values() for b in bs)
    raise WorkbenchError(f"figure '{name}' is unknown; accepted: {known}")
