"""Headlines: Wilson and row-bootstrap intervals, paired tests, and what the probes declare on executors with known answers."""

from __future__ import annotations

import io
import json

import numpy as np
import pandas as pd
import pytest
from rich.console import Console

from tests.executors import ParkingExecutor, PerfectExecutor, ShuffledExecutor
from tests.probes.machines import TableMachine
from workbench.analysis.headlines import (
    Headline,
    Number,
    clustered_mean,
    compare_headlines,
    failed_predictions,
    headlines_from_summary,
    headlines_from_tables,
    judge_above,
    pair,
    proportion,
)
from workbench.analysis.stats import bootstrap_mean, wilson
from workbench.errors import WorkbenchError
from workbench.plots.report import failed_note, headline_html
from workbench.plots.terminal import print_comparison, print_headlines
from workbench.probes import depth_matrix, logit_lens, overshoot, splice


@pytest.mark.parametrize("k,n,low,high", [
    (32, 32, 0.8928, 1.0),      # the "1.00 [0.89, 1.00], n = 32"
    (0, 8, 0.0, 0.3244),
    (8, 10, 0.4902, 0.9433),
    (49, 64, 0.6487, 0.8525),
])
def test_wilson_hand_values(k, n, low, high):
    lo, hi = wilson(k, n)
    assert lo == pytest.approx(low, abs=5e-4) and hi == pytest.approx(high, abs=5e-4)


@pytest.mark.parametrize("k,n", [(1, 3), (7, 19), (49, 64), (200, 201)])
def test_wilson_bounds_are_where_the_score_test_just_rejects(k, n):
    """Each bound p0 solves (k/n − p0)² = z² p0 (1 − p0) / n: the defining property, not the formula."""
    z = 1.959963984540054
    for p0 in wilson(k, n):
        assert (k / n - p0) ** 2 == pytest.approx(z * z * p0 * (1 - p0) / n, rel=1e-9)


def test_wilson_rejects_impossible_counts():
    with pytest.raises(WorkbenchError):
        wilson(3, 2)
    with pytest.raises(WorkbenchError):
        wilson(0, 0)


def test_bootstrap_mean_by_cluster_is_wider_when_entries_move_together():
    rng = np.random.default_rng(0)
    per_row = rng.random(40) < 0.5
    values = np.repeat(per_row, 5).astype(float)          # 5 identical entries per row
    clusters = np.repeat(np.arange(40), 5)
    plain = bootstrap_mean(values, n_boot=2000)
    grouped = bootstrap_mean(values, n_boot=2000, clusters=clusters)
    assert grouped.estimate == plain.estimate == values.mean()
    assert (grouped.high - grouped.low) > 1.8 * (plain.high - plain.low)


def test_numbers_and_their_intervals():
    ids = [f"r{i}" for i in range(10)]
    p = proportion("acc", "accuracy", pd.Series([True] * 8 + [False] * 2, index=ids))
    assert (p.value, p.n, p.method, p.text()) == (0.8, 10, "Wilson", "0.80 [0.49, 0.94]")
    entries = pd.Series([1.0] * 12, index=[f"r{i // 3}@{i % 3}" for i in range(12)])
    rows = pd.Series([i.split("@")[0] for i in entries.index], index=entries.index)
    agree = clustered_mean("all", "every entry right", entries, rows)
    assert agree.text() == "1.00 [0.51, 1.00]"  # all agree: Wilson over the 4 rows, not a point
    assert (agree.low, agree.high) == pytest.approx(wilson(4, 4))


def test_pair_is_paired_and_refuses_other_rows():
    ids = [f"r{i}" for i in range(20)]
    a = proportion("acc", "accuracy", pd.Series([False] * 20, index=ids))
    b = proportion("acc", "accuracy", pd.Series([True] * 15 + [False] * 5, index=ids))
    got = pair(a, b)
    assert got.diff == pytest.approx(0.75) and got.low < 0.75 < got.high and got.n == 20
    assert got.p_mcnemar == pytest.approx(2 * 0.5 ** 15)
    same = pair(b, b)
    assert same.diff == 0 and same.low == same.high == 0 and same.p_mcnemar == 1.0
    other = proportion("acc", "accuracy", pd.Series([True] * 20, index=[f"s{i}" for i in range(20)]))
    assert pair(a, other).diff is None and pair(a, other).text() == "rows differ"


def test_perfect_executor_headline_reads_in_words(tok, rows):
    tables = depth_matrix.run(PerfectExecutor(tok), tok, rows, support=2)
    head = depth_matrix.headline(tables)
    assert head["worst_cell"].text() == "1.00 [0.68, 1.00]" and head["worst_cell"].n == 8
    assert head.sentence.startswith("Loop t decodes x_t at 1.00 [0.68, 1.00], n = 8, for every t ≤ d, d = 1-2 "
                                    "(the trained support); past it the final answer reads 1.00 [0.68, 1.00] at d = 3")
    assert "the diagonal never falls below 0.71 through d = 4" in head.sentence and "2.00× the trained support of 2" \
        in head.sentence
    assert head["frontier_over_support_0.71"].text() == "2.00×"
    assert depth_matrix.summarize(tables)["headline"] == head.to_dict()


def test_a_shuffled_readout_has_no_frontier_and_says_so(tok, rows):
    tables = depth_matrix.run(ShuffledExecutor(PerfectExecutor(tok), seed=1), tok, rows)
    head = depth_matrix.headline(tables)
    assert head.sentence.startswith("With no trained support, the final answer (t = d) reads")
    assert "so there is no frontier" in head.sentence and head["frontier_0.71"].value is None
    assert "frontier_over_support_0.71" not in head.keys()
    perfect = depth_matrix.headline(depth_matrix.run(PerfectExecutor(tok), tok, rows))
    rows_out = {r["key"]: r for r in compare_headlines({"depth_matrix": head}, {"depth_matrix": perfect})}
    d1 = rows_out["final_d1"]
    assert d1["diff_value"] == pytest.approx(1 - head["final_d1"].value) and d1["p_mcnemar"] < 0.05


def test_overshoot_headline_iterate_against_park(tok, rows):
    it = overshoot.headline(overshoot.run(PerfectExecutor(tok), tok, rows, extra=3))
    parking = overshoot.run(ParkingExecutor(tok), tok, rows, extra=3)
    park = overshoot.headline(parking)
    assert it["iterate"].value == 1.0 and len(parking["overshoot"]) == 96
    # the parking executor reads x_d at every extra loop; where the chain returns to x_d (coincide) the symbol is
    # both, so those loops are counted apart and the shares read over the others: one denominator for both
    coincide = parking["overshoot"]["coincide"]
    assert 0 < coincide.sum() < len(coincide)
    assert park["park"].value == 1.0 and park["iterate"].value == 0.0
    assert park["park"].n == park["iterate"].n == int((~coincide).sum())
    assert f"{int(coincide.sum())} further extra loops, where the chain returns to x_d" in park.sentence
    assert "are counted apart" in park.sentence
    first = parking["overshoot"]["extra"] == 1
    assert it["iterate"].n == park["iterate"].n and it["iterate_k1"].n == int((~coincide[first]).sum())
    assert pair(park["iterate"], it["iterate"]).low > 0  # paired over the same (row, loop) entries
    assert it.sentence.startswith("Forced past their depth (d = 1-4, loops 2-7), rows iterate the rule in 1.00")


def test_logit_lens_headline_counts_the_diagonal(tiny_looped, rows):
    looped, tok = tiny_looped
    tables = logit_lens.run(looped, tok, rows, loops=4)
    head = logit_lens.headline(tables)
    f = tables["logit_lens"]
    diag = f[(f["chain_index"] == f["loop"]) & (f["lens"] == "coda")]
    assert head.keys() == ["top1_coda", "top1_raw", "top1_tuned"]
    assert head["top1_coda"].value == pytest.approx((diag["rank"] == 0).mean()) and head["top1_coda"].n == len(diag)
    assert head["top1_coda"].method == "row bootstrap" and head["top1_coda"].clusters.nunique() == diag["row_id"].nunique()


@pytest.mark.parametrize("mode, span, verdict, share", [("prelude", "read", "lawful", 1.0),
                                                        ("carry", "all", "source_orbit", 1.0),
                                                        ("carry", "read", "source_orbit", 0.0)])
def test_splice_headline_reports_the_predicted_class(tok, rows, mode, span, verdict, share):
    """The number is the share of the class the mechanism predicts for the span (lawful for a read-position
    splice, source orbit for an all-position one); the verdict is in words."""
    deep = [r for r in rows if r["depth"] >= 2]
    machine = TableMachine(tok, deep[0]["symbols"], mode=mode)
    tables = splice.run(machine, tok, deep, k0s=(1,), sites=("state",), spans=(span,))
    head = splice.headline(tables)
    (number,) = head.numbers
    assert number.key.startswith("lawful" if span == "read" else "source_orbit") and number.value == share
    assert {"lawful": "(lawful)", "source_orbit": "(source orbit)"}[verdict] in head.sentence


def test_headlines_round_trip_and_print_within_100_columns(tok, rows):
    tables = {**depth_matrix.run(PerfectExecutor(tok), tok, rows, support=2),
              **overshoot.run(PerfectExecutor(tok), tok, rows, extra=3)}
    heads = headlines_from_tables(tables, {"depth_matrix": depth_matrix.headline, "overshoot": overshoot.headline,
                                           "splice": splice.headline})
    assert list(heads) == ["depth_matrix", "overshoot"]  # a probe without its table is left out
    only = headlines_from_tables(tables, {"overshoot": overshoot.headline})  # only the probes handed in, in their order
    assert list(only) == ["overshoot"] and only["overshoot"].to_dict() == heads["overshoot"].to_dict()
    summary = json.loads(json.dumps({"probes": {n: {"headline": h.to_dict()} for n, h in heads.items()}}))
    back = headlines_from_summary(summary)
    assert list(back) == ["depth_matrix", "overshoot"]  # no order given: the probe order
    assert list(headlines_from_summary(summary, ["overshoot", "depth_matrix"])) == ["overshoot", "depth_matrix"]
    assert {n: h.to_dict() for n, h in back.items()} == {n: h.to_dict() for n, h in heads.items()}
    buf = io.StringIO()
    print_headlines(back, {"halting": "no halting head"}, out=Console(file=buf, width=100))
    print_comparison(compare_headlines(heads, heads), "a", "b", out=Console(file=buf, width=100))
    text = buf.getvalue()
    assert max(len(line) for line in text.splitlines()) <= 100
    assert "1.00 [0.68, 1.00]" in text and "not applicable: no halting head" in text and "{" not in text
    assert isinstance(back["depth_matrix"], Headline) and back["depth_matrix"]["worst_cell"].units is None
    dm = heads["depth_matrix"]  # as a notebook shows it: the sentence, then a table with the intervals
    assert repr(dm) == str(dm) and str(dm).startswith(f"depth_matrix: {dm.sentence}\n")
    assert "<table" in dm._repr_html_() and "[0.68, 1.00]" in dm._repr_html_()


def test_a_prediction_judged_against_its_rule_is_flagged_when_it_fails():
    """"Above the null" is judged on the interval's lower end: the issue's 0.58 [0.32, 0.81] against a null of
    0.50 fails it; the printout and the report say FAILED for that number and count it."""

    at_chance = judge_above(Number("p", "probe accuracy", 0.58, 24, 0.32, 0.81, "Wilson", "proportion",
                                   "95% interval above the null's p95"), 0.50)
    clear = judge_above(Number("q", "probe accuracy", 0.95, 24, 0.80, 0.99, "Wilson", "proportion",
                               "95% interval above the null's p95"), 0.50)
    unjudged = Number("r", "a measured value", 3.0)
    heads = {"linear_probe": Headline("linear_probe", [at_chance, clear, unjudged], "s")}
    assert (at_chance.holds, clear.holds, unjudged.holds) == (False, True, None)
    assert failed_predictions(heads) == [("linear_probe", at_chance)]
    assert Number.from_dict(at_chance.to_dict()).holds is False and "holds" not in unjudged.to_dict()
    out = io.StringIO()
    print_headlines(heads, out=Console(file=out, width=200, color_system=None))
    text = out.getvalue()
    assert "FAILED" in text and "predictions judged: 2; failed: 1" in text
    html = headline_html(heads) + failed_note(heads)
    assert html.count(">FAILED<") == 1 and "failed: 1" in html and ">holds<" in html
