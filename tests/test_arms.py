"""Paired arm comparisons (workbench.analysis.arms): counts, tests, frontier sensitivity and the crossover on known cases."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from workbench.analysis.arms import Arm, compare_arms, crossover, trained_support
from workbench.errors import WorkbenchError
from workbench.plots.arms import arms_accuracy_figure, frontier_support_figure


def _arm(name, correct_by_depth, support, n=64):
    rows = []
    for d, k in correct_by_depth.items():
        rows += [{"row_id": f"r{d}-{i}", "depth": d, "correct": i < k} for i in range(n)]
    return Arm(name, None, None, pd.DataFrame(rows), support, "sha")


def test_crossover_interpolates_the_first_sign_change_and_skips_ties():
    a = pd.Series({1: 1.0, 2: 0.9, 3: 0.5, 4: 0.2})
    b = pd.Series({1: 1.0, 2: 0.8, 3: 0.6, 4: 0.3})
    # diff: 0, +0.1, -0.1, -0.1 -> crosses halfway between 2 and 3
    assert crossover(a, b) == pytest.approx(2.5)
    assert crossover(a, a) is None
    assert crossover(b, a) == pytest.approx(2.5)


def test_compare_arms_counts_tests_and_frontier():
    # The paper's depth-4 case: 53 vs 59 of 64, one-sided Fisher p = 0.090
    a = _arm("lora", {1: 64, 2: 64, 3: 60, 4: 53}, support=4)
    b = _arm("full", {1: 64, 2: 64, 3: 62, 4: 59}, support=4)
    out = compare_arms(a, b)
    d4 = out["depths"].set_index("depth").loc[4]
    assert (d4["a_correct"], d4["b_correct"], d4["n"]) == (53, 59, 64)
    assert d4["p_fisher_b_greater"] == pytest.approx(0.090, abs=0.001)
    # rows are paired by id: B gets the same first 53 right plus 6 more -> 6 helped, 0 hurt, exact p = 2 / 2**6
    assert (d4["b_helped"], d4["b_hurt"]) == (6, 0)
    assert d4["p_mcnemar"] == pytest.approx(2 / 64)
    fr = out["frontier"].set_index(["arm", "bar"])["frontier"]
    assert fr[("lora", 0.71)] == 4.0 and fr[("full", 0.71)] == 4.0   # never below the bar: the last depth
    assert out["frontier"]["censored"].all()
    assert out["crossover"] is None and out["pooled"]["all"]["n"] == 256


def test_compare_arms_refuses_different_rows():
    a = _arm("a", {1: 10, 2: 5}, 2)
    b = _arm("b", {1: 10, 3: 5}, 2)
    with pytest.raises(WorkbenchError, match="do not hold the same rows"):
        compare_arms(a, b)


def test_trained_support_and_figures_draw_what_was_computed():
    assert trained_support({"stages": [{"depths": [1]}, {"depths": [1, 2, 3]}]}) == 3
    with pytest.raises(WorkbenchError):
        trained_support({"stages": []})
    a = _arm("lora", {1: 64, 2: 60, 3: 30, 4: 10}, support=2)
    b = _arm("full", {1: 64, 2: 58, 3: 40, 4: 5}, support=2)
    out = compare_arms(a, b)
    fig = arms_accuracy_figure(out["depths"], out["arms"], (2, 2), out["crossover"])
    ys = [list(t.y) for t in fig.data if t.name in ("lora", "full")]
    assert ys == [[1.0, 60 / 64, 30 / 64, 10 / 64], [1.0, 58 / 64, 40 / 64, 5 / 64]]
    assert fig.layout.meta["crossover"] == pytest.approx(out["crossover"])
    table = pd.DataFrame([{"run": "s2", "support": 2, "bar": b_, "frontier": f, "censored": False}
                          for b_, f in ((0.6, 3.2), (0.71, 3.0), (0.8, 2.8))])
    fig2 = frontier_support_figure(table)
    marker = [t for t in fig2.data if t.name == "s2"][0]
    assert list(marker.y) == [3.0] and math.isclose(marker.error_y.array[0], 0.2)
    censored = table.assign(run="s6", support=6, frontier=7.0, censored=True)  # the rows end above every bar
    fig3 = frontier_support_figure(pd.concat([table, censored]))
    hollow = [t for t in fig3.data if t.name.startswith("s6")][0]
    assert hollow.name == "s6 (censored: at least this)" and hollow.marker.symbol == "circle-open"
    assert [t for t in fig3.data if t.name == "s2"][0].marker.symbol == "circle"
