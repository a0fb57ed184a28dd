"""Paired exact tests, Fisher gates, Wilson and bootstrap intervals and the validity frontier (docs/analyses.md)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

import numpy as np
import pandas as pd

from workbench.errors import WorkbenchError


def _scipy_stats():
    """scipy.stats, imported when a statistic is asked for: its import costs 1-2 s of CPU, and a command that only
    prints a table never computes one."""
    from scipy import stats  # noqa: PLC0415 - see above

    return stats


FRONTIER_BAR = 0.71  # ≈ 0.25 ** (1 / 4), registered; sensitivity at 0.60 and 0.80


def mcnemar(helped: int, hurt: int) -> float:
    """Returns the exact two-sided McNemar p: min(1, 2·P(X <= min(b, c))), X ~ Bin(b + c, 1/2) (scipy's `binomtest`).

    Args:
        helped: b, discordant rows only the second system gets right.
        hurt: c, discordant rows only the first system gets right.
    """
    if helped < 0 or hurt < 0:
        raise WorkbenchError(f"McNemar counts must be >= 0, got {helped} and {hurt}")
    if helped + hurt == 0:
        return 1.0
    return float(_scipy_stats().binomtest(helped, helped + hurt, 0.5).pvalue)


@dataclass(frozen=True)
class PairedCounts:
    """Right/wrong counts of two systems A and B on the same rows, with the exact McNemar p of the discordant ones.

    `helped` counts the rows only B gets right, `hurt` the rows only A gets right ("B's view").
    """

    n: int
    a_correct: int
    b_correct: int
    helped: int
    hurt: int
    p_mcnemar: float

    @property
    def tied(self) -> int:
        """Rows both get right or both get wrong."""
        return self.n - self.helped - self.hurt

    @property
    def both(self) -> int:
        """Rows both get right."""
        return self.a_correct - self.hurt

    @property
    def neither(self) -> int:
        """Rows both get wrong."""
        return self.n - self.a_correct - self.helped


def paired_counts(a, b) -> PairedCounts:
    """Returns the paired counts of A and B (B's view: helped = B right and A wrong) with the exact McNemar p.

    Args:
        a, b: per-row correctness (bool or 0/1), length R, the same rows in the same order; two pandas Series
            must carry the same index.

    Raises:
        WorkbenchError: the two are not the same rows (lengths or indexes differ) or hold values other than 0/1.
    """
    if isinstance(a, pd.Series) and isinstance(b, pd.Series) and not a.index.equals(b.index):
        raise WorkbenchError("paired counts need the same rows in the same order; the two indexes differ")
    a, b = np.asarray(a), np.asarray(b)
    if a.ndim != 1 or a.shape != b.shape:
        raise WorkbenchError(f"paired counts need two 1-D arrays of equal length, got {a.shape} and {b.shape}")
    if not np.isin(a, (0, 1)).all() or not np.isin(b, (0, 1)).all():
        raise WorkbenchError("paired counts need 0/1 (or bool) correctness per row")
    a, b = a.astype(bool), b.astype(bool)
    helped, hurt = int((b & ~a).sum()), int((a & ~b).sum())
    return PairedCounts(len(a), int(a.sum()), int(b.sum()), helped, hurt, mcnemar(helped, hurt))


def fisher(a_correct: int, a_total: int, b_correct: int, b_total: int, alternative: str = "two-sided") -> float:
    """Returns Fisher's exact p for the 2x2 table of correct/wrong counts of A and B.

    `alternative="greater"` tests whether A's odds of a correct row exceed B's; "less" the reverse.
    """
    if alternative not in ("two-sided", "greater", "less"):
        raise WorkbenchError(f"alternative '{alternative}' is unknown; accepted: two-sided, greater, less")
    if not (0 <= a_correct <= a_total and 0 <= b_correct <= b_total):
        raise WorkbenchError(
            f"counts must satisfy 0 <= correct <= total, got {a_correct}/{a_total}, {b_correct}/{b_total}"
        )
    table = [[a_correct, a_total - a_correct], [b_correct, b_total - b_correct]]
    return float(_scipy_stats().fisher_exact(table, alternative=alternative).pvalue)


@dataclass(frozen=True)
class Interval:
    """A point estimate with a percentile bootstrap interval."""

    estimate: float
    low: float
    high: float
    level: float
    n_boot: int


def wilson(successes: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Returns the Wilson score interval (low, high) of a proportion `successes` / `n`.

    Raises:
        WorkbenchError: n < 1 or successes outside 0..n.
    """
    if n < 1 or not 0 <= successes <= n:
        raise WorkbenchError(f"a Wilson interval needs 0 <= successes <= n and n >= 1, got {successes} of {n}")
    z = float(_scipy_stats().norm.ppf(1 - (1 - level) / 2))
    p, z2 = successes / n, z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z / (1 + z2 / n) * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def paired_difference(a_only: int, b_only: int, both: int, neither: int, level: float = 0.95) -> tuple[float, float, float]:
    """Returns (p_A − p_B, low, high): two proportions on the same rows, Newcombe's hybrid score interval (method 10).

    The Wilson intervals of both proportions are combined with the rows' correlation (phi of the 2x2 table), so the
    interval stays inside [-1, 1] and is exact-ish at small counts where a Wald interval is not. Newcombe (1998),
    "Improved confidence intervals for the difference between binomial proportions based on paired data".

    Args:
        a_only: rows only A gets right; b_only: rows only B gets right; both, neither: the concordant rows.
    """
    counts = (a_only, b_only, both, neither)
    if min(counts) < 0 or sum(counts) == 0:
        raise WorkbenchError(f"a paired difference needs counts >= 0 and at least one row, got {counts}")
    n = sum(counts)
    pa, pb = (both + a_only) / n, (both + b_only) / n
    la, ua = wilson(both + a_only, n, level)
    lb, ub = wilson(both + b_only, n, level)
    marg = (both + a_only) * (b_only + neither) * (both + b_only) * (a_only + neither)
    phi = 0.0 if marg == 0 else (both * neither - a_only * b_only) / math.sqrt(marg)
    low = math.sqrt(max(0.0, (pa - la) ** 2 - 2 * phi * (pa - la) * (ub - pb) + (ub - pb) ** 2))
    high = math.sqrt(max(0.0, (ua - pa) ** 2 - 2 * phi * (ua - pa) * (pb - lb) + (pb - lb) ** 2))
    d = pa - pb
    return d, max(-1.0, d - low), min(1.0, d + high)


def bootstrap_mean(values, n_boot: int = 10_000, seed: int = 0, clusters=None, level: float = 0.95) -> Interval:
    """Returns mean(values) with a percentile bootstrap interval.

    Args:
        values: per-row values, length R.
        n_boot: bootstrap resamples.
        seed: seed of the resampling generator.
        clusters: optional length-R group labels; whole groups are resampled (rows that come in groups,
            e.g. every loop of one prompt).
        level: interval coverage.
    """
    values = np.asarray(values, dtype=float)
    if values.ndim != 1 or values.size == 0:
        raise WorkbenchError(f"a bootstrap needs a non-empty 1-D array, got shape {values.shape}")
    rng = np.random.default_rng(seed)
    if clusters is None:
        sums, counts = values, np.ones_like(values)
    else:
        labels, inverse = np.unique(np.asarray(clusters), return_inverse=True)
        if inverse.size != values.size:
            raise WorkbenchError(f"clusters has {inverse.size} labels for {values.size} rows")
        sums = np.bincount(inverse, weights=values, minlength=labels.size)
        counts = np.bincount(inverse, minlength=labels.size).astype(float)
    draws = rng.integers(0, sums.size, size=(n_boot, sums.size))
    means = sums[draws].sum(axis=1) / counts[draws].sum(axis=1)
    tail = (1 - level) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    return Interval(float(values.mean()), float(low), float(high), level, n_boot)


def paired_bootstrap(a, b, n_boot: int = 10_000, seed: int = 0, clusters=None, level: float = 0.95) -> Interval:
    """Returns mean(b − a) over paired rows with a percentile bootstrap interval.

    Args:
        a, b: per-row values of the two systems (e.g. 0/1 correctness), same order, length R.
        n_boot: bootstrap resamples.
        seed: seed of the resampling generator.
        clusters: optional length-R group labels; whole groups are resampled (rows that come in groups).
        level: interval coverage.
    """
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.ndim != 1 or a.size == 0 or a.shape != b.shape:
        raise WorkbenchError(
            f"paired_bootstrap needs two non-empty 1-D arrays of equal length, got {a.shape} and {b.shape}"
        )
    return bootstrap_mean(b - a, n_boot=n_boot, seed=seed, clusters=clusters, level=level)


def frontier(acc_by_depth: Mapping[int, float] | pd.Series, bar: float = FRONTIER_BAR) -> float:
    """Returns the threshold-crossing depth of the diagonal accuracy.

    NaN if the first depth is below `bar`; at the first adjacent pair with a_i >= bar > a_{i+1},
    d_i + (a_i − bar) / (a_i − a_{i+1}) · (d_{i+1} − d_i); the last depth if it never crosses.
    """
    pairs = sorted(dict(acc_by_depth).items())
    if not pairs:
        raise WorkbenchError("frontier needs accuracy at one depth at least")
    if pairs[0][1] < bar:
        return math.nan
    for (d0, a0), (d1, a1) in zip(pairs, pairs[1:]):
        if a0 >= bar > a1:
            return d0 + (a0 - bar) / (a0 - a1) * (d1 - d0)
    return float(pairs[-1][0])


def paired_compare(result_a, result_b) -> pd.DataFrame:
    """Returns final-answer (loop = depth) helped/hurt/tied counts per depth with the McNemar p.

    Rows are paired by row_id; "helped" counts rows B gets right and A wrong. The last row
    (depth <NA>) pools every depth.

    Args:
        result_a, result_b: objects with `manifest_sha256` and `frame()` (a `ReadResult`).

    Raises:
        WorkbenchError: the results come from manifests with different digests, or lack loop = depth.
    """
    if result_a.manifest_sha256 != result_b.manifest_sha256:
        raise WorkbenchError(
            f"refusing to compare results from different manifests "
            f"({result_a.manifest_sha256[:12]} vs {result_b.manifest_sha256[:12]})"
        )
    a, b = (_final(r.frame()) for r in (result_a, result_b))
    paired = a.merge(b, on=["row_id", "depth"], suffixes=("_a", "_b"), validate="one_to_one")
    if len(paired) != len(a) or len(paired) != len(b):
        raise WorkbenchError("the two results do not hold the same rows")
    groups = [(int(d), g) for d, g in paired.groupby("depth")] + [(pd.NA, paired)]
    return pd.DataFrame([_counts(d, g) for d, g in groups]).astype({"depth": "Int64"})


def _final(frame: pd.DataFrame) -> pd.DataFrame:
    final = frame[frame["loop"] == frame["depth"]][["row_id", "depth", "correct"]]
    if final["row_id"].nunique() != frame["row_id"].nunique():
        raise WorkbenchError("a result lacks loop = depth for some rows; read at least max(depth) loops")
    return final.astype({"correct": bool})


def _counts(depth, g: pd.DataFrame) -> dict:
    c = paired_counts(g["correct_a"], g["correct_b"])
    return {"depth": depth, "n": c.n, "a_correct": c.a_correct, "b_correct": c.b_correct, "helped": c.helped,
            "hurt": c.hurt, "tied": c.tied, "p_mcnemar": c.p_mcnemar}
