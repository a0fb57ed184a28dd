"""The attribution probe's headline: per corruption, whether the gradient estimate ranks the exact patching grid
where the grid measured an effect, and what it costs; and the trust rule that decides it.

Read from the probe's tables alone (`workbench.probes.attribution` writes them), so a results directory is read
again without the model.

Trust rule (issue 58, fixed before any table was read; it replaces the rule of issue 46, Spearman >= 0.8 over all
cells and 7 of the exact grid's 10 largest cells among the gradient map's 10 largest, where near-zero cells
dominated the ranking and a handful of big cells let chance pass):

1. Per table (one corruption and one component, or "all" of them), a cell clears the noise floor when the exact
   grid's 95% row-bootstrap interval of its recovered share across its pairs excludes 0 and its |share| is at
   least 0.1 of the largest |share| in the table.
2. n = the cells that clear it. n < 8 reads "not comparable": the exact grid's effects are too few or too noisy
   at its number of pairs; more pairs in the exact grid would make it comparable (at its measured seconds a pair).
3. On the cleared cells: Spearman's rho of the gradient map against the exact shares (average ranks, so ties are
   handled), and the share of cells whose signs agree (information). A gradient map constant on them has no
   ranking and fails.
4. Chance: the one-sided permutation p = (1 + #{rho_perm >= rho}) / (1 + N) over N = 9,999 permutations of the
   gradient values among the cleared cells, drawn from a generator of its own seeded 0 (never the global one).
5. Trusted when n >= 8, rho >= 0.8 and p <= 0.01; otherwise "cannot be trusted", with n, rho, p and the sign share.

The overlap of the two maps' 10 largest cells is kept as information; it decides nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats as sps

from workbench.analysis.headlines import Headline, Number, measured

FLOOR, MIN_CELLS = 0.1, 8                 # a cell's |share| against the table's largest; cleared cells to compare
SPEARMAN_BAR, P_BAR = 0.8, 0.01           # the bars of rule 5
N_PERM, PERM_SEED = 9_999, 0              # rule 4's permutations and their generator's seed
TOP = 10                                  # the top-k overlap, shown as information
TRUSTED, UNTRUSTED, NOT_COMPARABLE = "trusted", "cannot be trusted", "not comparable"


@dataclass(frozen=True)
class Agreement:
    """The trust rule's reading of one table (module docstring).

    Attributes:
        cells: cells in the table (with an exact and a gradient value).
        cleared: cells that clear the noise floor (n).
        spearman: rho on the cleared cells (NaN where n < 8 or either side has no ranking).
        p: the permutation p of rho (NaN where rho is).
        sign_share: share of the cleared cells whose gradient value has the exact share's sign (NaN where n = 0).
        verdict: TRUSTED, UNTRUSTED or NOT_COMPARABLE.
        reason: "" when trusted; "no ranking" where a side is constant on the cleared cells; else what failed.
    """

    cells: int
    cleared: int
    spearman: float
    p: float
    sign_share: float
    verdict: str
    reason: str


def clears_floor(exact, low, high) -> np.ndarray:
    """Returns the mask of cells whose exact interval [low, high] excludes 0 and whose |exact| is at least FLOOR
    of the table's largest |exact| (rule 1), [cells]."""
    exact, low, high = (np.asarray(v, dtype=float) for v in (exact, low, high))
    size = np.abs(exact)
    largest = np.nanmax(size) if size.size and np.isfinite(size).any() else np.nan
    return ((low > 0) | (high < 0)) & (size >= FLOOR * largest)


def spearman_permutation_p(exact, gradient, n_perm: int = N_PERM, seed: int = PERM_SEED) -> float:
    """Returns the one-sided p of Spearman's rho against permutations of `gradient` among the cells (rule 4):
    (1 + #{rho_perm >= rho}) / (1 + n_perm), from a generator seeded `seed` (the global one is never drawn)."""
    fixed = sps.rankdata(exact)
    fixed = (fixed - fixed.mean()) / np.linalg.norm(fixed - fixed.mean())

    def rho(ranks, axis=-1):    # Pearson of average ranks = Spearman; permuting values permutes their ranks
        centred = ranks - ranks.mean(axis=axis, keepdims=True)
        return (centred * fixed).sum(axis=axis) / np.linalg.norm(centred, axis=axis)

    test = sps.permutation_test((sps.rankdata(gradient),), rho, permutation_type="pairings", vectorized=True,
                                n_resamples=n_perm, alternative="greater", rng=np.random.default_rng(seed))
    return float(test.pvalue)


def agreement_of(exact, low, high, gradient, n_perm: int = N_PERM, seed: int = PERM_SEED) -> Agreement:
    """Returns the trust rule's reading (module docstring) of one table's cells.

    Args:
        exact: the exact grid's recovered share per cell, [cells].
        low, high: its 95% row-bootstrap interval across the pairs, [cells].
        gradient: the gradient map's recovered share of the same cells, [cells].
        n_perm, seed: the permutations of rule 4 and their generator's seed.
    """
    exact, gradient = np.asarray(exact, dtype=float), np.asarray(gradient, dtype=float)
    keep = clears_floor(exact, low, high) & np.isfinite(gradient)
    e, g = exact[keep], gradient[keep]
    n = int(keep.sum())
    signs = float(np.mean(np.sign(g) == np.sign(e))) if n else np.nan
    if n < MIN_CELLS:
        return Agreement(len(exact), n, np.nan, np.nan, signs, NOT_COMPARABLE,
                         f"{n} cell{'' if n == 1 else 's'} clear{'s' if n == 1 else ''} the noise floor, {MIN_CELLS} needed")
    if np.ptp(g) == 0 or np.ptp(e) == 0:
        return Agreement(len(exact), n, np.nan, np.nan, signs, UNTRUSTED, "no ranking")
    rho = float(sps.spearmanr(e, g).statistic)
    p = spearman_permutation_p(e, g, n_perm, seed)
    failed = ([f"Spearman {rho:.2f} < {SPEARMAN_BAR}"] if rho < SPEARMAN_BAR else []) + \
             ([f"p {p:.4f} > {P_BAR}"] if p > P_BAR else [])
    return Agreement(len(exact), n, rho, p, signs, UNTRUSTED if failed else TRUSTED, "; ".join(failed))


def reading(r, seconds_a_pair: float) -> str:
    """The verdict of one agreement row in words, with its numbers; what would make it comparable where it is not."""
    if r.verdict == NOT_COMPARABLE:
        cost = f", measured {seconds_a_pair:.0f} s a pair" if np.isfinite(seconds_a_pair) else ""
        return (f"is not comparable: {r.cleared} of {r.cells} cells clear the noise floor ({MIN_CELLS} needed), the "
                f"exact grid's effects too few or too noisy at {r.pairs} pairs; more pairs in the exact grid would make "
                f"it comparable ({r.pairs} now{cost})")
    numbers = (f"{r.cleared} of {r.cells} cells clear the noise floor; "
               + (f"Spearman {r.spearman:.2f}, permutation p {r.p:.4f}" if r.reason != "no ranking" else "no ranking")
               + f", signs agree on {r.sign_share:.0%}")
    return f"{'can' if r.verdict == TRUSTED else 'cannot'} be trusted ({numbers})"


def headline(tables: dict[str, pd.DataFrame]) -> Headline:
    """Per corruption: the trust rule's reading of the gradient map against the exact grid, and the cost ratio."""
    a, cost = tables["attribution__agreement"], tables["attribution__cost"].iloc[0]
    per_pair = cost["exact_s"] / cost["pairs"] if cost["pairs"] else np.nan
    numbers, parts = [], []
    if "verdict" not in a.columns and len(a):   # stored before issue 58: its verdicts are the replaced rule's
        parts.append("the gradient map's agreement here was stored under the rule issue 58 replaced (Spearman over "
                     "every cell and the top-10 overlap); `workbench.probes.attribution.stored_check` and `agreement` "
                     "re-read it under the current one")
        a = a.iloc[:0]
    for r in a[a["component"] == "all"].itertuples():
        numbers.append(Number(f"cleared_{r.corruption}", f"{r.corruption} edit: cells of the exact grid that clear "
                              "the noise floor", int(r.cleared), int(r.cells), kind="count",
                              expect=f">= {MIN_CELLS} to compare"))
        numbers.append(Number(f"spearman_{r.corruption}", f"{r.corruption} edit: Spearman of the gradient map against "
                              f"the exact grid over the {r.cleared} cleared cells", None if not np.isfinite(r.spearman)
                              else float(r.spearman), int(r.cleared), kind="value", expect=f">= {SPEARMAN_BAR} to trust"))
        numbers.append(Number(f"p_{r.corruption}", f"{r.corruption} edit: permutation p of that Spearman ({N_PERM:,} "
                              "permutations)", None if not np.isfinite(r.p) else float(r.p), int(r.cleared),
                              kind="value", expect=f"<= {P_BAR} to trust"))
        comps = a[(a["corruption"] == r.corruption) & (a["component"] != "all")]
        trusted = [x.component for x in comps.itertuples() if x.verdict == TRUSTED]
        parts.append(f"for the {r.corruption} edit the gradient map {reading(r, per_pair)}"
                     + (f", though trusted for {', '.join(trusted)}" if trusted and r.verdict != TRUSTED else ""))
    if np.isfinite(cost["ratio"]):
        numbers.append(measured("exact_over_gradient", "exact grid's time over the gradient map's, same pairs",
                                float(cost["ratio"]), kind="ratio", n=int(cost["pairs"])))
        parts.append(f"the exact grid took {cost['ratio']:.0f}x the gradient map's time on {int(cost['pairs'])} pairs "
                     f"({cost['exact_s']:.0f} s against {cost['gradient_s']:.1f} s)")
    sentence = "; ".join(parts) if parts else "No pair was checked against the exact grid (check_pairs = 0)"
    n = len(tables["attribution__pairs"])
    return Headline("attribution", numbers, sentence[0].upper() + sentence[1:] + f"; {n} pairs mapped.")
