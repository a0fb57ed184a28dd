"""The probe battery: one module per probe, each computing tidy DataFrames from a model and rows.

Every probe module has

    run(model, tokenizer, rows, **options) -> DataFrame | {"<name>": df, "<name>__<part>": df2, ...}
    summarize(tables: dict[str, DataFrame]) -> dict      # numbers for summary.json, with "headline"
    SPEC = ProbeSpec(name, run, summarize, needs)        # `workbench.probes.spec`: what it computes

Its headline (`workbench.analysis.headlines.<name>`) and its report section and figures (`SECTIONS` in a module of
`workbench.plots`) are declared on the reading side under the probe's name: rendering a results directory imports no
probe.

`model` is a `LoopedLM` (or a stand-in with its `read` signature and hook names), `rows` are
manifest rows (`workbench.tasks`); nothing is read from globals. A probe that does not apply
to a model (the halting probe on a model without a halting head) raises `NotApplicable`.
Result schemas: the module docstrings; the CLI (`workbench probe`) writes each table as
`DIR/<table>.parquet` through `workbench.probes.battery`. Adding a probe: its module (found by its
`SPEC`, `discover`), its test and its battery entry; a headline and a section of its own are optional, each found by
the probe's name (docs/adding-a-probe.md).
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

from workbench.defaults import probe_order
from workbench.errors import WorkbenchError
from workbench.probes.spec import ProbeSpec


def declares_spec(source: str) -> bool:
    """Whether a module's top level assigns `SPEC = ProbeSpec(...)` (parsed, so a docstring that shows one does not
    count): what makes a module of this package a probe."""
    return any(isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "SPEC" for t in node.targets)
               and isinstance(node.value, ast.Call) and getattr(node.value.func, "id", None) == "ProbeSpec"
               for node in ast.parse(source).body)


def discover(folder: Path) -> dict[str, str]:
    """{probe name: module path} for every module in `folder` that declares `SPEC = ProbeSpec(...)` at its top
    level, in probe order (`workbench.defaults.PROBE_ORDER`, then by name): a new probe's module is found without an
    entry anywhere else. The files are parsed, not imported, so listing the probes loads none of them."""
    found = [p.stem for p in folder.glob("*.py")
             if not p.stem.startswith("_") and declares_spec(p.read_text(encoding="utf-8"))]
    return {name: f"workbench.probes.{name}" for name in probe_order(found)}


PROBES: dict[str, str] = discover(Path(__file__).parent)   # name -> module path, in probe order


class NotApplicable(Exception):
    """Raised by a probe whose question does not apply to the given model (the reason is the message)."""


def get_probe(name: str) -> ProbeSpec:
    """Returns probe `name`'s declaration: its module's `SPEC` (run, summarize, needs).

    Raises:
        WorkbenchError: an unknown probe name, listing the known ones, or a module without its `SPEC`.
    """
    if name not in PROBES:
        raise WorkbenchError(f"probe '{name}' is unknown; known probes: {', '.join(PROBES)}")
    spec = getattr(importlib.import_module(PROBES[name]), "SPEC", None)
    if not isinstance(spec, ProbeSpec) or spec.name != name:
        raise WorkbenchError(f"{PROBES[name]} declares no SPEC = ProbeSpec(name=\"{name}\", ...) (docs/adding-a-probe.md)")
    return spec


def parse_only(only: str | None) -> list[str] | None:
    """Returns the probe names of a comma list ("depth_matrix,splice"), each checked, or None.

    Raises:
        WorkbenchError: an unknown name (listing the known ones) or an empty list.
    """
    if only is None:
        return None
    names = [n.strip() for n in only.split(",") if n.strip()]
    if not names:
        raise WorkbenchError(f"--only '{only}' names no probe; known probes: {', '.join(PROBES)}")
    unknown = [n for n in names if n not in PROBES]
    if unknown:
        raise WorkbenchError(f"--only names unknown probe '{unknown[0]}'; known probes: {', '.join(PROBES)}")
    return names
