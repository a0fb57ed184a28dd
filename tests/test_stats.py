"""Statistics: exact McNemar, Fisher, paired bootstrap, frontier, paired comparison of reader results."""

import math

import numpy as np
import pandas as pd
import pytest
from scipy.stats import fisher_exact

from workbench.analysis.stats import fisher, frontier, mcnemar, paired_bootstrap, paired_compare, paired_counts
from workbench.errors import WorkbenchError
from workbench.tasks.reader import ReadResult


@pytest.mark.parametrize("b,c,p", [
    (0, 0, 1.0),
    (0, 2, 0.5),  # the retrofit paper's guardrail stop: "exact paired p of 0.50"
    (5, 0, 2 / 32),
    (1, 3, 2 * 5 / 16),
    (3, 3, 1.0),  # 2·P(X <= 3) > 1 for Bin(6, 1/2): capped
    (10, 0, 2 / 1024),
])
def test_mcnemar_hand_cases(b, c, p):
    assert mcnemar(b, c) == pytest.approx(p, rel=1e-12)
    assert mcnemar(c, b) == pytest.approx(p, rel=1e-12)


def test_mcnemar_is_the_doubled_binomial_tail():
    """mcnemar is scipy's binomtest: held here to the definition, summed exactly with math.comb."""
    for b in range(0, 40, 3):
        for c in range(0, 40, 5):
            if b + c:
                n, k = b + c, min(b, c)
                tail = sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n
                assert mcnemar(b, c) == pytest.approx(min(1.0, 2 * tail), rel=1e-9, abs=1e-15)
    assert mcnemar(763, 193) == pytest.approx(2 * sum(math.comb(956, i) for i in range(194)) / 2 ** 956, rel=1e-9)
    assert mcnemar(763, 193) < 1e-60


def test_mcnemar_rejects_negative_counts():
    with pytest.raises(WorkbenchError):
        mcnemar(-1, 2)


def test_paired_counts_on_a_constructed_case():
    # 12 rows: both right on 4, neither on 2, only B on 5 (helped), only A on 1 (hurt)
    a = [1] * 4 + [0] * 2 + [0] * 5 + [1] * 1
    b = [1] * 4 + [0] * 2 + [1] * 5 + [0] * 1
    c = paired_counts(a, b)
    assert (c.n, c.a_correct, c.b_correct, c.helped, c.hurt) == (12, 5, 9, 5, 1)
    assert (c.tied, c.both, c.neither) == (6, 4, 2)
    assert c.p_mcnemar == pytest.approx(2 * (1 + 6) / 64, rel=1e-12)  # 2·P(X <= 1), X ~ Bin(6, 1/2)
    swapped = paired_counts(b, a)  # A's view: helped and hurt trade places, the p does not move
    assert (swapped.helped, swapped.hurt, swapped.p_mcnemar) == (1, 5, c.p_mcnemar)
    rows = pd.Series(b, index=range(12), dtype=float)  # 0/1 floats and bools count alike
    assert paired_counts(pd.Series(a, index=range(12)).astype(bool), rows) == c


def test_paired_counts_refuses_rows_that_are_not_the_same():
    with pytest.raises(WorkbenchError, match="equal length"):
        paired_counts([1, 0, 1], [1, 0])
    with pytest.raises(WorkbenchError, match="indexes differ"):
        paired_counts(pd.Series([1, 0], index=[0, 1]), pd.Series([1, 0], index=[1, 0]))
    with pytest.raises(WorkbenchError, match="0/1"):
        paired_counts([1, 2], [1, 0])


def test_fisher_hand_cases_and_the_papers_gate():
    # [[3, 0], [0, 3]]: each extreme table has probability 1 / C(6, 3) = 1/20.
    assert fisher(3, 3, 0, 3) == pytest.approx(0.1)
    assert fisher(3, 3, 0, 3, "greater") == pytest.approx(0.05)
    assert fisher(3, 3, 0, 3, "less") == pytest.approx(1.0)
    # Retrofit paper, adapter vs full block at depth 4: 53 vs 59 of 64, one-sided p = 0.090.
    assert round(fisher(53, 64, 59, 64, "less"), 3) == 0.090


def test_fisher_agrees_with_scipy():
    rng = np.random.default_rng(0)
    for _ in range(60):
        at, bt = rng.integers(1, 130, size=2)
        ac, bc = rng.integers(0, at + 1), rng.integers(0, bt + 1)
        for alt in ("two-sided", "greater", "less"):
            expected = fisher_exact([[ac, at - ac], [bc, bt - bc]], alternative=alt).pvalue
            assert fisher(ac, at, bc, bt, alt) == pytest.approx(expected)
    with pytest.raises(WorkbenchError, match="alternative"):
        fisher(1, 2, 1, 2, "bigger")
    with pytest.raises(WorkbenchError, match="correct <= total"):
        fisher(3, 2, 1, 2)


def test_paired_bootstrap_degenerate_and_known_cases():
    same = paired_bootstrap([1, 0, 1, 1], [1, 0, 1, 1], n_boot=500)
    assert (same.estimate, same.low, same.high) == (0.0, 0.0, 0.0)
    shift = paired_bootstrap([0, 0, 0, 0], [1, 1, 1, 1], n_boot=500)
    assert (shift.estimate, shift.low, shift.high) == (1.0, 1.0, 1.0)
    rng = np.random.default_rng(1)
    a = rng.integers(0, 2, 2000)
    b = np.where(rng.random(2000) < 0.2, 1, a)  # B fixes ~20% of rows
    iv = paired_bootstrap(a, b, n_boot=2000, seed=4)
    assert iv.low < iv.estimate < iv.high and iv.low > 0
    assert iv.estimate == pytest.approx((b - a).mean())
    assert paired_bootstrap(a, b, n_boot=2000, seed=4) == iv
    se = (b - a).std() / math.sqrt(2000)
    assert iv.high - iv.low == pytest.approx(2 * 1.96 * se, rel=0.15)


def test_clustered_bootstrap_widens_for_correlated_groups():
    rng = np.random.default_rng(2)
    clusters = np.repeat(np.arange(40), 25)  # 40 groups of 25 identical differences
    diff = np.repeat(rng.normal(0, 1, 40), 25)
    plain = paired_bootstrap(np.zeros(1000), diff, n_boot=2000, seed=0)
    clustered = paired_bootstrap(np.zeros(1000), diff, n_boot=2000, seed=0, clusters=clusters)
    assert clustered.estimate == plain.estimate
    assert (clustered.high - clustered.low) > 3 * (plain.high - plain.low)
    with pytest.raises(WorkbenchError):
        paired_bootstrap([1, 2], [1, 2, 3])


@pytest.mark.parametrize("acc,bar,expected", [
    ({1: 0.5, 2: 0.9}, 0.71, math.nan),  # first depth below the bar
    ({1: 1.0, 2: 0.9, 3: 0.5}, 0.71, 2 + (0.9 - 0.71) / 0.4),
    ({1: 1.0, 2: 0.71, 3: 0.70}, 0.71, 2 + 0.0 / 0.01),  # a_i == bar counts as at or above
    ({1: 1.0, 2: 0.9, 4: 0.5}, 0.71, 2 + (0.9 - 0.71) / 0.4 * 2),  # gap between depths
    ({1: 1.0, 2: 0.8, 3: 0.75}, 0.71, 3.0),  # never crosses: last depth
    ({3: 0.5, 1: 0.9, 2: 0.8}, 0.71, 2 + (0.8 - 0.71) / 0.3),  # unsorted input
    ({1: 0.9, 2: 0.5, 3: 0.9, 4: 0.2}, 0.71, 1 + 0.19 / 0.4),  # first crossing wins
    ({1: 0.9, 2: 0.7}, 0.60, 2.0),
    ({1: 0.9, 2: 0.7}, 0.80, 1.5),
])
def test_frontier_hand_cases(acc, bar, expected):
    got = frontier(acc, bar=bar)
    assert (math.isnan(got) and math.isnan(expected)) or got == pytest.approx(expected)
    got_series = frontier(pd.Series(acc), bar=bar)
    assert (math.isnan(got_series) and math.isnan(expected)) or got_series == pytest.approx(expected)


def test_frontier_default_bar_and_empty_input():
    assert frontier({1: 1.0, 2: 0.72, 3: 0.70}) == pytest.approx(2 + 0.01 / 0.02)
    with pytest.raises(WorkbenchError):
        frontier({})


def _result(correct_at_depth: dict[str, bool], depths: dict[str, int], digest="m1") -> ReadResult:
    """A ReadResult whose final loop is right or wrong as asked (symbols 'A','B'; answer 'A')."""
    ids = list(correct_at_depth)
    loops = max(depths.values())
    scores = np.zeros((len(ids), loops, 2), dtype=np.float32)
    for i, rid in enumerate(ids):
        scores[i, :, 0 if correct_at_depth[rid] else 1] = 1.0
    return ReadResult(ids, np.array([depths[r] for r in ids]), [["A"] * depths[r] for r in ids],
                      [["A", "B"]] * len(ids), scores, digest)


def test_paired_compare_counts_per_depth_and_pooled():
    depths = {f"r{i}": 1 + i % 2 for i in range(12)}
    a = {r: i < 6 for i, r in enumerate(depths)}  # r0..r5 right
    b = {r: i % 3 != 0 for i, r in enumerate(depths)}  # all but r0, r3, r6, r9 right
    table = paired_compare(_result(a, depths), _result(b, depths))
    by_depth = table.set_index("depth")
    # depth 1: r0 r2 r4 | r6 r8 r10. A: r0 r2 r4. B: r2 r4 r8 r10 -> helped 2 (r8 r10), hurt 1 (r0).
    assert by_depth.loc[1, ["n", "a_correct", "b_correct", "helped", "hurt", "tied"]].tolist() == [6, 3, 4, 2, 1, 3]
    # depth 2: r1 r3 r5 | r7 r9 r11. A: r1 r3 r5. B: r1 r5 r7 r11 -> helped 2, hurt 1.
    assert by_depth.loc[2, ["helped", "hurt"]].tolist() == [2, 1]
    pooled = table[table["depth"].isna()].iloc[0]
    assert (pooled["n"], pooled["helped"], pooled["hurt"]) == (12, 4, 2)
    assert pooled["p_mcnemar"] == pytest.approx(mcnemar(4, 2))


def test_paired_compare_pairs_by_row_id_not_order():
    depths = {"x": 1, "y": 1, "z": 1}
    a = _result({"x": True, "y": False, "z": True}, depths)
    b = _result({"z": True, "y": True, "x": False}, depths)
    row = paired_compare(a, b).iloc[0]
    assert (row["helped"], row["hurt"], row["tied"]) == (1, 1, 1)


def test_paired_compare_refuses_different_manifests_and_short_reads():
    depths = {"x": 1, "y": 2}
    with pytest.raises(WorkbenchError, match="different manifests"):
        paired_compare(_result({"x": True, "y": True}, depths), _result({"x": True, "y": True}, depths, "m2"))
    short = _result({"x": True, "y": True}, {"x": 1, "y": 1})
    short.depths = np.array([1, 2])
    with pytest.raises(WorkbenchError, match="loop = depth"):
        paired_compare(short, short)


def test_the_paired_difference_interval_covers_and_stays_inside_its_range():
    from workbench.analysis.stats import paired_difference

    d, lo, hi = paired_difference(30, 35, 21, 138)           # head alone 30, fixed alone 35, of 224
    assert d == pytest.approx(-5 / 224) and lo < d < hi and -0.1 < lo < -0.08 and 0.04 < hi < 0.06
    d, lo, hi = paired_difference(7, 7, 3, 3)                # level: the interval is symmetric about 0
    assert d == 0 and lo == pytest.approx(-hi)
    assert paired_difference(10, 0, 0, 0)[2] == 1.0 and paired_difference(0, 10, 0, 0)[1] == -1.0
    rng = np.random.default_rng(0)
    truth, hits = -0.05, 0
    for counts in rng.multinomial(100, [0.10, 0.15, 0.15, 0.60], size=2000):
        _, lo, hi = paired_difference(*counts)
        hits += lo <= truth <= hi
    assert 0.93 <= hits / 2000 <= 0.97                       # a 95% interval covers about 95% of the time
    with pytest.raises(WorkbenchError, match="counts >= 0"):
        paired_difference(-1, 2, 3, 4)
