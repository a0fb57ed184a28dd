"""The gradient map's trust rule (issue 58) on planted arrays: the noise floor, the permutation p, ties, and what a
run stored before the rule is re-read from.

A planted table has BIG cells with large exact shares whose intervals exclude 0 and NOISE cells near zero whose
intervals cross it; the rule compares the gradient map on the big cells only.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from workbench.analysis.headlines import attribution as rule
from workbench.errors import WorkbenchError
from workbench.probes import attribution, patching

BIG, NOISE = 12, 60


def planted(seed: int = 0):
    """(exact, low, high): BIG cells spread over 0.2..1.0 with intervals of half-width 0.05; NOISE cells of
    0.002..0.01 either sign, half with intervals that cross 0 (half-width 0.05), half tiny but sure (0.001)."""
    rng = np.random.default_rng(seed)
    big = np.linspace(0.2, 1.0, BIG) * rng.choice([-1, 1], BIG)
    noise = rng.uniform(0.002, 0.01, NOISE) * rng.choice([-1, 1], NOISE)
    exact = np.concatenate([big, noise])
    half = np.concatenate([np.full(BIG, 0.05), np.tile([0.05, 0.001], NOISE // 2)])
    return exact, exact - half, exact + half


def test_the_exact_map_itself_is_trusted_and_a_random_one_is_not():
    exact, low, high = planted()
    same = rule.agreement_of(exact, low, high, exact)
    assert (same.cleared, same.verdict, same.reason) == (BIG, rule.TRUSTED, "")
    assert same.spearman == pytest.approx(1.0) and same.sign_share == 1.0
    assert same.p == pytest.approx(1 / (rule.N_PERM + 1), abs=1e-15)     # no permutation of 12 reaches rho = 1
    random = rule.agreement_of(exact, low, high, np.random.default_rng(7).standard_normal(exact.size))
    assert random.verdict == rule.UNTRUSTED and random.cleared == BIG
    assert random.p > rule.P_BAR and random.spearman < rule.SPEARMAN_BAR


def test_a_high_spearman_that_chance_reaches_is_not_trusted():
    """Eight cleared cells, the gradient map's ranks 3 2 1 4 5 8 7 6 (two swaps): rho = 1 - 16/84 = 0.81 clears
    the bar, but about 1 in 60 permutations of eight cells does as well."""
    exact = np.linspace(0.3, 1.0, 8)
    gradient = exact[[2, 1, 0, 3, 4, 7, 6, 5]]
    a = rule.agreement_of(exact, exact - 0.1, exact + 0.1, gradient)
    assert a.cleared == 8 and a.spearman == pytest.approx(1 - 16 / 84)
    assert rule.P_BAR < a.p < 0.03 and (a.verdict, a.reason) == (rule.UNTRUSTED, f"p {a.p:.4f} > {rule.P_BAR}")


def test_a_map_constant_on_the_cleared_cells_has_no_ranking():
    exact, low, high = planted()
    flat = np.where(np.abs(exact) > 0.1, 0.5, exact)        # constant where it is compared, varied on the noise
    a = rule.agreement_of(exact, low, high, flat)
    assert (a.verdict, a.reason, a.cleared) == (rule.UNTRUSTED, "no ranking", BIG)
    assert np.isnan(a.spearman) and np.isnan(a.p)


def test_tiny_cells_and_intervals_crossing_zero_are_not_comparable():
    exact, low, high = planted()
    one_big = exact.copy()
    one_big[0] = 50.0                                        # every other cell now under 0.1 of the largest
    a = rule.agreement_of(one_big, one_big - 0.05, one_big + 0.05, one_big)
    assert (a.verdict, a.cleared) == (rule.NOT_COMPARABLE, 1) and np.isnan(a.spearman)
    wide = rule.agreement_of(exact, exact - 2.0, exact + 2.0, exact)           # every interval crosses 0
    assert (wide.verdict, wide.cleared) == (rule.NOT_COMPARABLE, 0)
    assert "0 cells clear the noise floor, 8 needed" in wide.reason
    seven = rule.agreement_of(exact[:7], low[:7], high[:7], exact[:7])        # one short of the bar, all clear
    assert (seven.verdict, seven.cleared) == (rule.NOT_COMPARABLE, 7)


def test_the_floor_is_why_a_map_right_on_the_big_cells_is_trusted():
    """Right on every big cell, random on the noise: the old rule's Spearman over all cells is dragged under its bar
    by the noise cells' ranks; on the cleared cells the map is trusted. Without either half of the floor (the
    interval, or 0.1 of the largest) noise cells join the ranking."""
    exact, low, high = planted()
    gradient = exact.copy()
    gradient[BIG:] = np.random.default_rng(3).uniform(-0.01, 0.01, NOISE)
    assert sps.spearmanr(exact, gradient).statistic < rule.SPEARMAN_BAR
    a = rule.agreement_of(exact, low, high, gradient)
    assert (a.verdict, a.cleared) == (rule.TRUSTED, BIG)


def test_ties_in_the_gradient_map_take_average_ranks():
    """The gradient map is the exact shares rounded to 2 levels: its ranks are the averages 3 (cells 1-5) and 8
    (cells 6-10), so rho is the Pearson correlation of 1..10 with them; the permutations keep the ties, and only the
    1 in C(10, 5) = 252 splits that put the same five cells on top reaches it."""
    exact = np.linspace(0.1, 1.0, 10)
    gradient = np.where(exact > 0.55, 1.0, 0.0)
    a = rule.agreement_of(exact, exact - 0.01, exact + 0.01, gradient)
    assert a.spearman == pytest.approx(np.corrcoef(np.arange(1, 11), [3] * 5 + [8] * 5)[0, 1], abs=1e-12)
    assert a.p == pytest.approx(1 / 252, abs=0.002) and a.verdict == rule.TRUSTED


def test_the_permutations_draw_from_their_own_seeded_generator():
    exact, low, high = planted()
    gradient = exact + np.random.default_rng(5).normal(0, 0.8, exact.size)       # rho 0.64: p near the bar
    state = np.random.get_state()
    ps = []
    for global_seed in (1, 2):
        np.random.seed(global_seed)
        ps.append(rule.agreement_of(exact, low, high, gradient).p)
    np.random.set_state(state)
    assert ps[0] == ps[1]
    assert rule.agreement_of(exact, low, high, gradient, seed=1).p != ps[0]
    k = round(ps[0] * (rule.N_PERM + 1)) - 1                 # p = (1 + k) / (1 + N), k permutations at or above rho
    assert k > 0 and ps[0] == pytest.approx((1 + k) / (1 + rule.N_PERM), abs=1e-12)


def per_pair(n_rows: int = 4) -> pd.DataFrame:
    """A patching table of one entry pair per clean row over 10 cells: cells 0-7 recover 0.1..0.8 (plus a row's
    jitter), cells 8-9 nothing but the jitter."""
    rng = np.random.default_rng(0)
    out = []
    for pid in range(n_rows):
        for cell in range(10):
            share = 0.1 * (cell + 1) if cell < 8 else 0.0
            out.append(dict(pair_id=pid, row_id=f"r{pid}", depth=3, corruption="entry", step=1, loop=1, layer=cell,
                            position="edited", component="mlp", n_positions=1, ld_clean=4.0, ld_corrupted=-4.0,
                            ld_patched=-4.0 + 8 * (share + 0.02 * rng.standard_normal())))
    return pd.DataFrame(out)


def test_a_run_stored_before_the_rule_is_reread_from_its_per_pair_values():
    frame = per_pair(n_rows=6)                       # the patching probe's pairs; the exact check ran on 4 of them
    exact = patching.grid(frame[frame["pair_id"] < 4])
    check = exact[attribution.KEYS].assign(exact=exact["recovered"], gradient=exact["recovered"] * 0.9)
    pairs = frame.drop_duplicates("pair_id")[["pair_id", "row_id", "corruption", "ld_clean", "ld_corrupted"]]
    tables = {"attribution__check": check, "attribution__pairs": pairs, "patching": frame,
              "attribution__cost": pd.DataFrame([dict(pairs=4, cells=10, exact_s=40.0, gradient_s=2.0, ratio=20.0)])}
    rebuilt = attribution.stored_check(tables)
    assert rebuilt["exact_low"].tolist() == exact["low"].tolist() and rebuilt["exact_n"].tolist() == [4] * 10
    a = attribution.agreement(rebuilt).set_index("component")
    assert (a.loc["mlp", "cleared"], a.loc["mlp", "verdict"]) == (8, rule.TRUSTED)

    tampered = dict(tables, attribution__check=check.assign(exact=check["exact"] + 1e-9))
    with pytest.raises(WorkbenchError, match="do not give attribution__check's exact shares"):
        attribution.stored_check(tampered)


def test_the_headline_says_what_would_make_a_table_comparable():
    frame = per_pair(n_rows=2)
    shift = frame["layer"] < 6                                 # cells 0-5: one pair up, the other down
    frame.loc[shift, "ld_patched"] += np.where(frame.loc[shift, "pair_id"] == 0, 6.0, -6.0)
    g = patching.grid(frame)
    check = g[attribution.KEYS].assign(exact=g["recovered"], exact_low=g["low"], exact_high=g["high"],
                                       exact_n=g["n"], gradient=g["recovered"])
    tables = {"attribution__agreement": attribution.agreement(check),
              "attribution__cost": pd.DataFrame([dict(pairs=2, cells=10, exact_s=300.0, gradient_s=5.0, ratio=60.0)]),
              "attribution__pairs": frame.drop_duplicates("pair_id")}
    sentence = attribution.headline(tables).sentence
    assert "is not comparable: 2 of 10 cells clear the noise floor (8 needed)" in sentence
    assert "more pairs in the exact grid would make it comparable (2 now, measured 150 s a pair)" in sentence
    stored = json.loads(json.dumps(attribution.summarize(tables), allow_nan=False))    # summary.json: no NaN
    assert stored["agreement"][0]["spearman"] is None and stored["agreement"][0]["verdict"] == rule.NOT_COMPARABLE


def test_a_headline_of_a_table_stored_under_the_replaced_rule_says_so():
    """A results directory written before issue 58 (workbench report reads its stored agreement) gives no verdict
    of the replaced rule as the current one's."""
    old = pd.DataFrame([dict(corruption="entry", component=c, cells=240, spearman=0.89, top10=8, top_k=10, trusted=True)
                        for c in ("all", "attn")])
    tables = {"attribution__agreement": old, "attribution__pairs": pd.DataFrame({"pair_id": range(30)}),
              "attribution__cost": pd.DataFrame([dict(pairs=4, cells=480, exact_s=300.0, gradient_s=5.0, ratio=60.0)])}
    h = attribution.headline(tables)
    assert h.sentence.startswith("The gradient map's agreement here was stored under the rule issue 58 replaced")
    assert "trusted" not in h.sentence and [n.key for n in h.numbers] == ["exact_over_gradient"]
