"""Which figures each probe result gets, read from the probes' declarations (`ProbeSpec.figures`).

A builder takes the result's table as its first argument. Its other DataFrame parameters
name parts of the result and receive those tables: `top` of "logit_lens" receives the
`logit_lens__top` table. A part parameter without a default is required: the builder is
skipped when that part is absent; one with a default is passed only when present.

A probe names its builders ("workbench.plots.lens:logit_lens_figure"); they are imported here, when
a figure is wanted, so the probes never import plotting code.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Callable, Mapping

import pandas as pd
import plotly.graph_objects as go

from workbench.errors import WorkbenchError
from workbench.probes import PROBES, get_probe
from workbench.probes.spec import Figure, ProbeSpec

Builder = Callable[..., go.Figure]

# The order the report shows the probes' sections in and `workbench figures` exports their figures: the
# report reads like a results section. A probe not named here follows them, in `PROBES` order.
ORDER = ("identity", "logit_lens", "depth_matrix", "overshoot", "splice", "patching", "attribution", "paths", "heads",
         "linear_probe", "drift", "halting", "lens_agreement", "dynamics", "exit_rules", "gradient_audit", "latency",
         "loop_accuracy")


def probe_specs() -> list[ProbeSpec]:
    """Returns every probe's declaration, in `ORDER` (then the probes it does not name, in `PROBES` order)."""
    names = [n for n in ORDER if n in PROBES] + [n for n in PROBES if n not in ORDER]
    return [get_probe(n) for n in names]


def resolve(figure: Figure) -> Builder:
    """Returns the builder function a probe's `Figure` names.

    Raises:
        WorkbenchError: the module or the function does not exist.
    """
    module, _, name = figure.builder.partition(":")
    try:
        builder = getattr(importlib.import_module(module), name, None)
    except ModuleNotFoundError as err:
        raise WorkbenchError(f"figure builder '{figure.builder}': no module '{err.name}'") from None
    if not callable(builder):
        raise WorkbenchError(f"figure builder '{figure.builder}': '{module}' has no function '{name}'")
    return builder


def figures() -> dict[str, list[Builder]]:
    """Returns {result name: [builder, ...]}: the figures of every probe that declares some, in `ORDER`."""
    return {spec.name: [resolve(f) for f in spec.figures] for spec in probe_specs() if spec.figures}


def captions() -> dict[str, str]:
    """Returns {figure name: its caption} over every probe's figures, and {probe: caption} for a probe shown
    as its main table (`ProbeSpec.table_caption`)."""
    out = {}
    for spec in probe_specs():
        out.update({figure_key(resolve(f)): f.caption for f in spec.figures})
        if spec.table_caption is not None:
            out[spec.name] = spec.table_caption
    return out


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
    return {part for b in figures().get(result, []) for part, _ in builder_parts(result, b).values()}


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
    for result, builders in figures().items():
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
    registry = figures()
    for result, builders in registry.items():
        for builder in builders:
            if figure_key(builder) == name:
                return result, builder
    known = ", ".join(figure_key(b) for bs in registry.values() for b in bs)
    raise WorkbenchError(f"figure '{name}' is unknown; accepted: {known}")
