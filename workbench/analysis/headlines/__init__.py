"""Headlines: the few named numbers each probe's results give, with n, a 95% interval and one sentence.

Each probe's headline is a module of this package named after the probe (`workbench.analysis.headlines.depth_matrix`)
whose `headline(tables) -> Headline` reads the probe's tables only, so a results directory is read again without the
model. `HEADLINE_MODULES` finds them the way `workbench.probes.PROBES` finds the probes (by name, the files parsed,
not imported) and lists them in `workbench.defaults.PROBE_ORDER`. The battery stores `Headline.to_dict()` in
summary.json (`probes.<name>.headline`, through the probe's `summarize`); the terminal, the report and the claims
ledger read the same objects, and the terminal and the report lay out the same table (`headline_table`).
Intervals, where a number has one:

    Wilson           a proportion over independent rows (`proportion`, `counted`);
    row bootstrap    a mean over entries that come in groups (every loop of one prompt), whole
                     groups resampled (`clustered_mean`); when every entry agrees, Wilson over
                     the number of rows instead (the bootstrap would collapse to a point);
    paired bootstrap a difference between two specimens over the same rows (`pair`), with the
                     exact McNemar p when the values are 0/1 and one per row.

A `Number` keeps its per-row values (`units`, never written to JSON), so two specimens probed on
the same rows can be compared number by number (`compare_headlines`).

This package reads what the probes wrote and imports neither the probes nor any model code (`tests/test_imports.py`).
"""
from __future__ import annotations

import ast
import html
import importlib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Mapping

import numpy as np
import pandas as pd

from workbench.analysis.stats import bootstrap_mean, paired_bootstrap, paired_counts, wilson
from workbench.defaults import probe_order
from workbench.errors import WorkbenchError

LEVEL = 0.95
N_BOOT = 4_000


@dataclass
class Number:
    """One headline number.

    Attributes:
        key: stable name, the same across specimens ("final_d5"); numbers are paired by it.
        label: what it is, in words ("final answer (t = d), d = 5").
        value: the estimate (None when undefined, e.g. no frontier).
        n: how many units it is over (rows, entries); None for measured values.
        low, high: the 95% interval, when it has one.
        method: "Wilson", "row bootstrap", or "" (an exact or measured value).
        kind: "proportion" (printed to 2 decimals), "difference" (signed, 2 decimals), "value" (4
            significant digits), "ratio" (2 decimals and ×), "count" (an integer), or "text".
        expect: what the mechanism (or a guarantee) predicts for it, in a few words.
        holds: whether the number meets `expect`, where that prediction is a rule a number can be checked
            against (True / False, set by the probe beside the rule; `judge`); None where it is not judged.
            The printout and the report flag each False as a failed prediction.
        units: per-unit values indexed by unit id (row id), for paired tests; not serialised.
        clusters: unit id -> group (row id) when units come in groups; not serialised.
    """

    key: str
    label: str
    value: float | str | None
    n: int | None = None
    low: float | None = None
    high: float | None = None
    method: str = ""
    kind: str = "value"
    expect: str = ""
    holds: bool | None = None
    units: pd.Series | None = field(default=None, repr=False, compare=False)
    clusters: pd.Series | None = field(default=None, repr=False, compare=False)

    def text(self) -> str:
        """The value with its interval: "0.94 [0.80, 0.98]", "6.02", "1.50×", "–"."""
        value = fmt(self.value, self.kind)
        if self.low is None or self.high is None:
            return value
        return f"{value} [{fmt(self.low, self.kind)}, {fmt(self.high, self.kind)}]"

    def to_dict(self) -> dict:
        out = {k: getattr(self, k) for k in ("key", "label", "value", "n", "low", "high", "method", "kind", "expect")}
        if self.holds is not None:   # only judged numbers carry it: summaries of unjudged ones keep their bytes
            out["holds"] = bool(self.holds)
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in out.items()}

    @classmethod
    def from_dict(cls, d: Mapping) -> "Number":
        holds = d.get("holds")
        return cls(**{k: d.get(k) for k in ("key", "label", "value", "n", "low", "high")},
                   method=d.get("method") or "", kind=d.get("kind") or "value", expect=d.get("expect") or "",
                   holds=None if holds is None else bool(holds))

    def verdict(self) -> str:
        """"failed" where the prediction is judged and missed, "holds" where judged and met, else ""."""
        return "" if self.holds is None else "holds" if self.holds else "failed"


@dataclass(repr=False)
class Headline:
    """A probe's headline: its numbers and one sentence that reads them (printed as text, drawn as a table
    in a notebook)."""

    probe: str
    numbers: list[Number]
    sentence: str

    def __getitem__(self, key: str) -> Number:
        for n in self.numbers:
            if n.key == key:
                return n
        raise KeyError(f"headline '{self.probe}' has no number '{key}'; it has {[n.key for n in self.numbers]}")

    def keys(self) -> list[str]:
        return [n.key for n in self.numbers]

    def to_dict(self) -> dict:
        return {"probe": self.probe, "sentence": self.sentence, "numbers": [n.to_dict() for n in self.numbers]}

    @classmethod
    def from_dict(cls, d: Mapping) -> "Headline":
        return cls(d["probe"], [Number.from_dict(n) for n in d.get("numbers", [])], d.get("sentence", ""))

    def frame(self) -> pd.DataFrame:
        """One row per number: quantity, value, 95% interval, n, interval method, expected."""
        return pd.DataFrame([{"quantity": n.label, "value": fmt(n.value, n.kind),
                              "95% interval": _interval(n), "n": "" if n.n is None else n.n,
                              "method": n.method, "expected": n.expect} for n in self.numbers])

    def __repr__(self) -> str:
        return str(self)

    def __str__(self) -> str:
        lines = [f"{self.probe}: {self.sentence}"]
        lines += [f"  {n.label}: {n.text()}" + (f"  (n = {n.n})" if n.n is not None else "") for n in self.numbers]
        return "\n".join(lines)

    def _repr_html_(self) -> str:  # notebooks
        return (f"<p><b>{html.escape(self.probe)}</b>: {html.escape(self.sentence)}</p>"
                + self.frame().to_html(index=False, escape=True))


# ----------------------------------------------------------------------------- building numbers
def fmt_number(x) -> str:
    """Returns a short human string for a headline number (NaN as an en dash)."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    if isinstance(x, (bool, np.bool_)):
        return str(bool(x))
    if isinstance(x, (int, np.integer)):
        return f"{int(x):,}"
    if isinstance(x, (float, np.floating)):
        ax = abs(float(x))
        return f"{x:.3g}" if ax != 0 and (ax < 1e-3 or ax >= 1e5) else f"{x:.4g}"
    return str(x)


def fmt(x, kind: str = "value") -> str:
    """A number as the headlines print it (None and NaN as an en dash)."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    if kind == "text" or isinstance(x, str):
        return str(x)
    if kind == "proportion":
        return f"{float(x):.2f}"
    if kind == "difference":
        return f"{float(x):+.2f}"
    if kind == "ratio":
        return f"{float(x):.2f}×"
    if kind == "count":
        return f"{int(x):,}"
    return fmt_number(x)


def _interval(n: Number) -> str:
    if n.low is None or n.high is None:
        return ""
    return f"[{fmt(n.low, n.kind)}, {fmt(n.high, n.kind)}]"


def judge(number: Number, holds) -> Number:
    """Sets `number.holds` from a rule's outcome (None, or a NaN outcome, leaves it unjudged) and returns it."""
    number.holds = None if holds is None or (isinstance(holds, float) and math.isnan(holds)) else bool(holds)
    return number


def judge_above(number: Number, bar: float) -> Number:
    """Judges "above `bar`": the interval's lower end (the value itself when it has no interval) exceeds it."""
    if number.value is None or not isinstance(number.value, (int, float)) or math.isnan(float(number.value)):
        return number
    return judge(number, (number.low if number.low is not None else number.value) > bar)


def proportion(key: str, label: str, values: pd.Series, expect: str = "") -> Number:
    """A proportion of 0/1 `values` (indexed by row id, one per row) with its Wilson interval."""
    values = values.astype(float)
    n = int(len(values))
    if n == 0:
        return Number(key, label, None, 0, kind="proportion", expect=expect)
    k = int(values.sum())
    low, high = wilson(k, n, LEVEL)
    return Number(key, label, k / n, n, low, high, "Wilson", "proportion", expect, units=values)


def counted(key: str, label: str, k: int, n: int, expect: str = "") -> Number:
    """A proportion k / n from counts alone (no per-row values, so never paired) with its Wilson interval."""
    if n < 1:
        return Number(key, label, None, 0, kind="proportion", expect=expect)
    low, high = wilson(int(k), int(n), LEVEL)
    return Number(key, label, k / n, int(n), low, high, "Wilson", "proportion", expect)


def clustered_mean(key: str, label: str, values: pd.Series, clusters: pd.Series, expect: str = "",
                   kind: str = "proportion", seed: int = 0) -> Number:
    """A mean over entries grouped in `clusters` (same index) with a row-bootstrap interval.

    When every entry is 0 (or every one 1) the bootstrap collapses to a point; the interval is then
    the Wilson interval over the number of rows.
    """
    values = values.astype(float)
    if len(values) == 0:
        return Number(key, label, None, 0, kind=kind, expect=expect)
    groups = clusters.loc[values.index]
    iv = bootstrap_mean(values.to_numpy(), n_boot=N_BOOT, seed=seed, clusters=groups.to_numpy(), level=LEVEL)
    low, high = iv.low, iv.high
    if iv.estimate in (0.0, 1.0):  # every entry agrees: the bootstrap collapses to a point
        rows = int(groups.nunique())
        low, high = wilson(int(iv.estimate) * rows, rows, LEVEL)
    return Number(key, label, iv.estimate, int(len(values)), low, high, "row bootstrap", kind, expect,
                  units=values, clusters=groups)


def measured(key: str, label: str, value, kind: str = "value", expect: str = "", n: int | None = None) -> Number:
    """A number without an interval (an exact check, a ratio of measured values, a count)."""
    if isinstance(value, (np.floating, np.integer)):
        value = value.item()
    return Number(key, label, value, n, kind=kind, expect=expect)


def span(values: Iterable[float], kind: str = "proportion") -> str:
    """ "0.06-0.16" (or one value when they are all equal)."""
    values = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if not values:
        return "–"
    lo, hi = min(values), max(values)
    return fmt(lo, kind) if fmt(lo, kind) == fmt(hi, kind) else f"{fmt(lo, kind)}-{fmt(hi, kind)}"


def ranges(ints: Iterable[int]) -> str:
    """ "1-4", "1-3, 5", "2"."""
    ints = sorted(set(int(i) for i in ints))
    out, start = [], None
    for i, v in enumerate(ints):
        if start is None:
            start = v
        if i + 1 == len(ints) or ints[i + 1] != v + 1:
            out.append(str(start) if start == v else f"{start}-{v}")
            start = None
    return ", ".join(out)


def depth_ranges(depths: Iterable[int]) -> str:
    """`ranges` of the depths given, then "not given" when some row has depth 0 (a user's row without one,
    `workbench.tasks.user`): "1-3", "1-3, not given", "not given"."""
    ints = {int(d) for d in depths}
    known = [d for d in ints if d >= 1]
    return ", ".join(([ranges(known)] if known else []) + (["not given"] if len(known) < len(ints) else []))


# ----------------------------------------------------------------------------- comparing specimens
@dataclass
class Pairing:
    """B − A for one number over the rows both were computed on."""

    key: str
    diff: float | None
    low: float | None
    high: float | None
    p_mcnemar: float | None
    n: int | None
    note: str = ""

    def text(self) -> str:
        if self.diff is None:
            return self.note or "–"
        return f"{self.diff:+.2f} [{self.low:+.2f}, {self.high:+.2f}]"


def pair(a: Number, b: Number, seed: int = 0) -> Pairing:
    """Returns b − a with a paired bootstrap interval over the shared rows, and McNemar's p for 0/1 rows.

    A pairing needs both numbers to carry their per-row values over the same row ids; otherwise
    the result says why there is no paired test.
    """
    if a.units is None or b.units is None:
        return Pairing(a.key, None, None, None, None, None, "")
    if set(a.units.index) != set(b.units.index):
        return Pairing(a.key, None, None, None, None, None, "rows differ")
    ua, ub = a.units.sort_index(), b.units.loc[a.units.sort_index().index]
    clusters = a.clusters.loc[ua.index].to_numpy() if a.clusters is not None else None
    iv = paired_bootstrap(ua.to_numpy(), ub.to_numpy(), n_boot=N_BOOT, seed=seed, clusters=clusters, level=LEVEL)
    p = None
    binary = set(np.unique(np.concatenate([ua.to_numpy(), ub.to_numpy()]))) <= {0.0, 1.0}
    if binary and clusters is None:
        p = paired_counts(ua.to_numpy(), ub.to_numpy()).p_mcnemar
    return Pairing(a.key, iv.estimate, iv.low, iv.high, p, int(len(ua)))


def compare_headlines(a: Mapping[str, Headline], b: Mapping[str, Headline]) -> list[dict]:
    """Returns one record per (probe, number) in either: label, A's and B's text, B − A, McNemar p.

    Probes and numbers keep B's order, then A's extras.
    """
    out = []
    for probe in list(b) + [p for p in a if p not in b]:
        ha, hb = a.get(probe), b.get(probe)
        keys = (hb.keys() if hb else []) + [k for k in (ha.keys() if ha else []) if not hb or k not in hb.keys()]
        for key in keys:
            na = ha[key] if ha and key in ha.keys() else None
            nb = hb[key] if hb and key in hb.keys() else None
            ref = nb or na
            pairing = pair(na, nb) if na is not None and nb is not None else None
            out.append({"probe": probe, "key": key, "label": ref.label, "kind": ref.kind,
                        "a": na.text() if na else "–", "n_a": na.n if na else None,
                        "a_value": fmt(na.value, na.kind) if na else "–",
                        "b": nb.text() if nb else "–", "n_b": nb.n if nb else None,
                        "b_value": fmt(nb.value, nb.kind) if nb else "–",
                        "diff": pairing.text() if pairing else "–",
                        "diff_value": pairing.diff if pairing else None,
                        "diff_low": pairing.low if pairing else None, "diff_high": pairing.high if pairing else None,
                        "p_mcnemar": pairing.p_mcnemar if pairing else None})
    return out


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


__all__ = ["HEADLINE_MODULES", "Headline", "Number", "Pairing", "clustered_mean", "compare_headlines", "counted",
           "failed_predictions", "headline_of", "headline_table", "headlines_from_summary", "headlines_from_tables",
           "judge", "judge_above", "judged_predictions", "measured", "pair", "proportion", "span"]
