"""A headline's values: `Number` (a named number with n, its 95% interval and its per-row values), `Headline` (a
probe's few numbers and its sentence), how each is formatted, and the intervals that build them:

    Wilson           a proportion over independent rows (`proportion`, `counted`);
    row bootstrap    a mean over entries that come in groups (every loop of one prompt), whole
                     groups resampled (`clustered_mean`); when every entry agrees, Wilson over
                     the number of rows instead (the bootstrap would collapse to a point).

The package (`workbench.analysis.headlines`) finds each probe's headline and reads results; these are what it reads
them into.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from typing import Iterable, Mapping

import numpy as np
import pandas as pd

from workbench.analysis.stats import bootstrap_mean, wilson

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
