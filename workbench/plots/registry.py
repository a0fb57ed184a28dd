"""Which report section and figures each probe's results get, declared by the plots modules and found by probe name.

A plots module that draws a probe's results declares them at its foot, keyed by the probe's name:

    SECTIONS = {"loop_accuracy": Section(title=..., about=..., figures=(Figure(loop_accuracy_figure, "caption"),))}

`SECTION_MODULES` finds every module of this package whose top level assigns such a dict (the files are parsed, not
imported, the way `workbench.probes.discover` finds the probes) and lists the probes in
`workbench.defaults.PROBE_ORDER`. Nothing here imports the probes: the report and `workbench figures` draw a results
directory from its tables alone.

A builder takes the result's table as its first argument. Its other DataFrame parameters
name parts of the result and receive those tables: `top` of "logit_lens" receives the
`logit_lens__top` table. A part parameter without a default is required: the builder is
skipped when that part is absent; one with a default is passed only when present.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping

import pandas as pd
import plotly.graph_objects as go

from workbench.defaults import probe_order
from workbench.errors import WorkbenchError
from workbench.plots.theme import apply_theme

Builder = Callable[..., go.Figure]


@dataclass(frozen=True)
class Figure:
    """One figure of a probe's results.

    Attributes:
        builder: the plot function; it takes the probe's main table (further DataFrame parameters receive its part
            tables) and returns a plotly Figure. Its name without `_figure` names the figure ("frontier").
        caption: what the figure shows, then what the looped mechanism predicts ("Predicted: ...").
    """

    builder: Builder
    caption: str

    def __post_init__(self):
        name = getattr(self.builder, "__name__", "")
        if not callable(self.builder) or not name.endswith("_figure"):
            raise WorkbenchError(f"figure builder {self.builder!r} is not a function named '<name>_figure'")


@dataclass(frozen=True)
class Section:
    """A probe's section of the report.

    Attributes:
        title: the section's heading.
        about: the sentence under the heading: what the probe measures.
        figures: the figures the report draws in the section and `workbench figures` exports, in order.
        table_caption: for a probe shown as its main table instead of figures (identity), the caption under it.
    """

    title: str
    about: str
    figures: tuple[Figure, ...] = ()
    table_caption: str | None = None


def declared_sections(source: str) -> list[str]:
    """The probe names a module's top-level `SECTIONS = {"<probe>": ..., ...}` declares (parsed, so a docstring that
    shows one does not count); [] for a module without one."""
    return [key.value for node in ast.parse(source).body
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict)
            and any(isinstance(t, ast.Name) and t.id == "SECTIONS" for t in node.targets)
            for key in node.value.keys if isinstance(key, ast.Constant) and isinstance(key.value, str)]


def discover(folder: Path) -> dict[str, str]:
    """{probe name: module path} for every module in `folder` that declares `SECTIONS`, in probe order
    (`workbench.defaults.probe_order`).

    Raises:
        WorkbenchError: two modules declare one probe's section.
    """
    found: dict[str, str] = {}
    for path in sorted(folder.glob("*.py")):
        if path.stem.startswith("_"):
            continue
        for name in declared_sections(path.read_text(encoding="utf-8")):
            if name in found:
                raise WorkbenchError(f"the section of probe '{name}' is declared twice: {found[name]} and "
                                     f"workbench.plots.{path.stem}")
            found[name] = f"workbench.plots.{path.stem}"
    return {name: found[name] for name in probe_order(found)}


SECTION_MODULES: dict[str, str] = discover(Path(__file__).parent)   # probe name -> the module declaring its section


def section(name: str) -> Section:
    """Returns probe `name`'s section, from the `SECTIONS` of the module that declares it.

    Raises:
        WorkbenchError: no module declares it, or the module's `SECTIONS` lacks it.
    """
    if name not in SECTION_MODULES:
        raise WorkbenchError(f"no plots module declares a section for probe '{name}'; declared: "
                             f"{', '.join(SECTION_MODULES)}")
    found = getattr(importlib.import_module(SECTION_MODULES[name]), "SECTIONS", {}).get(name)
    if not isinstance(found, Section):
        raise WorkbenchError(f"{SECTION_MODULES[name]} declares no SECTIONS[\"{name}\"] = Section(...)")
    return found


TABLE_ROWS = 200  # rows of a probe's main table drawn by its table section


def table_section(name: str) -> Section:
    """The section of probe `name` when no plots module declares one: its main table, drawn as a table figure that
    the report shows and `workbench figures` exports as `<name>`. A probe module is then all a probe needs to reach the
    battery, the report and the figures; a section of its own (`SECTIONS`) replaces this one."""
    def draw(frame: pd.DataFrame) -> go.Figure:
        shown = frame.head(TABLE_ROWS)
        cells = [[_cell(v) for v in shown[c].tolist()] for c in shown.columns]
        return apply_theme(go.Figure(go.Table(header=dict(values=[str(c) for c in shown.columns]),
                                              cells=dict(values=cells))))

    draw.__name__ = draw.__qualname__ = f"{name}_figure"
    return Section(title=name, about=f"No plots module declares a section for probe '{name}': its main table as the "
                                     f"probe wrote it (docs/adding-a-probe.md, section 3).",
                   figures=(Figure(draw, f"The probe's main table, {name}.parquet (its first {TABLE_ROWS} rows)."),))


def _cell(value) -> str | float | int | bool | None:
    """A table cell as plotly draws it: numbers and flags as they are, anything else (a list, an array) as text."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value.tolist() if hasattr(value, "tolist") else value)


def sections(results: Iterable[str] = ()) -> dict[str, Section]:
    """Returns {probe name: Section} of every declared section, in probe order, then the table section
    (`table_section`) of each probe of `results` that no module declares one for.

    Args:
        results: names of probes whose results are at hand (a results directory's `summary.json` lists them).
    """
    out = {name: section(name) for name in SECTION_MODULES}
    return out | {name: table_section(name) for name in probe_order(set(results) - set(out))}


def figures(results: Iterable[str] = ()) -> dict[str, list[Builder]]:
    """Returns {result name: [builder, ...]}: the figures of every probe that declares some, in probe order, and
    the table figure of each probe of `results` without a declared section."""
    return {name: [f.builder for f in s.figures] for name, s in sections(results).items() if s.figures}


def captions(results: Iterable[str] = ()) -> dict[str, str]:
    """Returns {figure name: its caption} over every probe's figures, and {probe: caption} for a probe shown
    as its main table (`Section.table_caption`); `results` as for `sections`."""
    out = {}
    for name, s in sections(results).items():
        out.update({figure_key(f.builder): f.caption for f in s.figures})
        if s.table_caption is not None:
            out[name] = s.table_caption
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


def build_all(tables: Mapping[str, pd.DataFrame], only: list[str] | None = None,
              results: Iterable[str] = ()) -> list[tuple[str, str, go.Figure]]:
    """Returns (result, figure name, figure) for every registered figure whose tables are present.

    Args:
        tables: result name -> DataFrame, as loaded from a results directory.
        only: figure names to build (default: all), in registry order.
        results: probes whose results these are (`summary.json`'s): one without a declared section gets its table
            figure (`table_section`).
    """
    out = []
    for result, builders in figures(results).items():
        if result not in tables:
            continue
        for builder in builders:
            if only is not None and figure_key(builder) not in only:
                continue
            fig = build(result, builder, tables)
            if fig is not None:
                out.append((result, figure_key(builder), fig))
    return out


def find_builder(name: str, results: Iterable[str] = ()) -> tuple[str, Builder]:
    """Returns (result, builder) for a figure name such as "frontier" (`results` as for `figures`); WorkbenchError if
    unknown."""
    registry = figures(results)
    for result, builders in registry.items():
        for builder in builders:
            if figure_key(builder) == name:
                return result, builder
    known = ", ".join(figure_key(b) for bs in registry.values() for b in bs)
    raise WorkbenchError(f"figure '{name}' is unknown; accepted: {known}")
