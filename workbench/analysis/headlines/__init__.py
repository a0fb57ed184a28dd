"""Headlines: the few named numbers each probe's results give, with n, a 95% interval and one sentence.

Each probe's headline is a module of this package named after the probe (`workbench.analysis.headlines.depth_matrix`)
whose `headline(tables) -> Headline` reads the probe's tables only, so a results directory is read again without the
model. `HEADLINE_MODULES` finds them the way `workbench.probes.PROBES` finds the probes (by name, the files parsed,
not imported) and lists them in `workbench.defaults.PROBE_ORDER`. The battery stores `Headline.to_dict()` in
summary.json (`probes.<name>.headline`, through the probe's `summarize`); the terminal, the report and the claims
ledger read the same objects, and the terminal and the report lay out the same table (`headline_table`).
A headline's values, their formatting and the intervals that build them are in `values` (Wilson for a proportion,
a row bootstrap for a mean over grouped entries); comparing two specimens number by number is `comparison` (a paired
bootstrap, and the exact McNemar p for 0/1 rows). A `Number` keeps its per-row values (`units`, never written to
JSON), so two specimens probed on the same rows can be compared. Both are re-exported here, where the headline modules
import them from.

This package reads what the probes wrote and imports neither the probes nor any model code (`tests/test_imports.py`).
"""
from __future__ import annotations

import ast
import importlib
from pathlib import Path
from typing import Callable, Iterable, Mapping

import pandas as pd

from workbench.analysis.headlines.comparison import Pairing, compare_headlines, pair
from workbench.analysis.headlines.values import (
    LEVEL,
    N_BOOT,
    Headline,
    Number,
    clustered_mean,
    counted,
    depth_ranges,
    fmt,
    fmt_number,
    judge,
    judge_above,
    measured,
    proportion,
    ranges,
    span,
)
from workbench.defaults import probe_order
from workbench.errors import WorkbenchError

# ----------------------------------------------------------------------------- each probe's headline, by name
HeadlineOf = Callable[[Mapping[str, pd.DataFrame]], Headline]  # a probe's `headline(tables)`


def defines_headline(source: str) -> bool:
    """Whether a module's top level defines `headline` (parsed, so a docstring that shows one does not count): what
    makes a module of this package a probe's headline."""
    return any(isinstance(node, ast.FunctionDef) and node.name == "headline" for node in ast.parse(source).body)


def discover(folder: Path) -> dict[str, str]:
    """{probe name: module path} for every module in `folder` that defines `headline` at its top level, named after its
    probe, in probe order (`workbench.defaults.probe_order`). The files are parsed, not imported."""
    found = [p.stem for p in folder.glob("*.py")
             if not p.stem.startswith("_") and defines_headline(p.read_text(encoding="utf-8"))]
    return {name: f"workbench.analysis.headlines.{name}" for name in probe_order(found)}


HEADLINE_MODULES: dict[str, str] = discover(Path(__file__).parent)   # probe name -> the module of its headline


def headline_of(name: str) -> HeadlineOf:
    """Returns probe `name`'s `headline` function, from its module of this package.

    Raises:
        WorkbenchError: no module of this package is the probe's headline.
    """
    if name not in HEADLINE_MODULES:
        raise WorkbenchError(f"probe '{name}' has no headline module; known: {', '.join(HEADLINE_MODULES)}")
    return importlib.import_module(HEADLINE_MODULES[name]).headline


# ----------------------------------------------------------------------------- reading results
def headlines_from_tables(tables: Mapping[str, pd.DataFrame],
                          probes: Mapping[str, HeadlineOf] | None = None) -> dict[str, Headline]:
    """Returns {probe: Headline} recomputed from the tables (with per-row values) for every probe whose main table is
    present, in probe order.

    Args:
        tables: {table name: DataFrame} of a results directory (`workbench.analysis.results.load_results`).
        probes: {probe name: headline function} to use instead of every probe's (`HEADLINE_MODULES`), in their order.
    """
    if probes is None:
        probes = {name: headline_of(name) for name in HEADLINE_MODULES if name in tables}
    return {name: headline({k: v for k, v in tables.items() if k == name or k.startswith(name + "__")})
            for name, headline in probes.items() if name in tables}


def headlines_from_summary(summary: Mapping, order: Iterable[str] | None = None) -> dict[str, Headline]:
    """Returns {probe: Headline} from a summary.json's stored headlines (no per-row values): the probes named in
    `order` first, in that order (default: probe order, `workbench.defaults.probe_order`), then the others sorted."""
    probes = summary.get("probes") or {}
    order = probe_order(probes) if order is None else list(order)
    names = [n for n in order if n in probes] + sorted(n for n in probes if n not in order)
    return {name: Headline.from_dict(probes[name]["headline"]) for name in names
            if isinstance(probes[name], Mapping) and "headline" in probes[name]}


# ----------------------------------------------------------------------------- the headline table
HeadlineRow = tuple[str, Headline | None, str | None]   # (probe, its headline, why it did not apply)


def headline_table(headlines: Mapping[str, Headline], skipped: Mapping[str, str] | None = None) -> list[HeadlineRow]:
    """The headline table the report draws as HTML (`workbench.plots.report`) and the terminal prints
    (`workbench.plots.terminal`): one (probe, headline, why it did not apply) per probe, each headline's probe in its
    order, then each probe of `skipped` ({probe: reason}) that has none. A row's headline holds its sentence and its
    numbers, each with n and its 95% interval."""
    skipped = skipped or {}
    return ([(name, h, skipped.get(name)) for name, h in headlines.items()]
            + [(name, None, reason) for name, reason in skipped.items() if name not in headlines])


def judged_predictions(headlines: Mapping[str, Headline]) -> list[tuple[str, Number]]:
    """(probe, number) for every number whose prediction was judged against its rule, in headline order."""
    return [(name, n) for name, h in headlines.items() for n in h.numbers if n.holds is not None]


def failed_predictions(headlines: Mapping[str, Headline]) -> list[tuple[str, Number]]:
    """(probe, number) for every judged prediction that failed, in headline order."""
    return [(name, n) for name, n in judged_predictions(headlines) if n.holds is False]


__all__ = ["HEADLINE_MODULES", "LEVEL", "N_BOOT", "Headline", "Number", "Pairing", "clustered_mean",
           "compare_headlines", "counted", "depth_ranges", "failed_predictions", "fmt", "fmt_number", "headline_of",
           "headline_table", "headlines_from_summary", "headlines_from_tables", "judge", "judge_above",
           "judged_predictions", "measured", "pair", "proportion", "ranges", "span"]
