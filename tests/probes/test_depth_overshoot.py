"""depth_matrix and overshoot on executors whose right answers are known by construction."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from tests.executors import ParkingExecutor, PerfectExecutor, ShuffledExecutor
from workbench.probes import depth_matrix, overshoot


def test_perfect_executor_scores_a_full_depth_matrix(tok, rows):
    tables = depth_matrix.run(PerfectExecutor(tok), tok, rows, support=2)
    frame = tables["depth_matrix"]
    assert len(frame) == len(rows) * 4 and not frame.duplicated(["row_id", "loop"]).any()
    active = frame[frame["loop"] <= frame["depth"]]
    assert active["correct"].all() and len(active) == 8 * (1 + 2 + 3 + 4)
    assert frame[frame["loop"] > frame["depth"]]["correct"].isna().all()
    front = tables["depth_matrix__frontier"].set_index("bar")
    assert list(front.index) == [0.60, 0.71, 0.80]
    assert (front["frontier"] == 4.0).all() and (front["frontier_over_support"] == 2.0).all()
    summary = depth_matrix.summarize(tables)
    assert summary["diagonal"] == {"1": 1.0, "2": 1.0, "3": 1.0, "4": 1.0}
    assert summary["final_correct"] == summary["final_total"] == 32


def test_frontier_interpolates_the_diagonal():
    # 1.0, 0.9, 0.5: crosses 0.71 between depths 2 and 3 at 2 + (0.9 - 0.71) / 0.4.
    frame = pd.DataFrame({"row_id": [f"r{i}" for i in range(30)], "depth": [1] * 10 + [2] * 10 + [3] * 10,
                          "correct": [True] * 10 + [True] * 9 + [False] + [True] * 5 + [False] * 5})
    frame["loop"] = frame["depth"]
    table = depth_matrix.frontier_table(frame, support=2).set_index("bar")
    assert table.loc[0.71, "frontier"] == pytest.approx(2 + 0.19 / 0.4)
    assert table.loc[0.71, "frontier_over_support"] == pytest.approx((2 + 0.19 / 0.4) / 2)
    assert table.loc[0.80, "frontier"] == pytest.approx(2 + 0.1 / 0.4)


def test_a_shuffled_readout_reads_at_chance(tok, rows):
    tables = depth_matrix.run(ShuffledExecutor(PerfectExecutor(tok), seed=1), tok, rows)
    frame = tables["depth_matrix"]
    active = frame[frame["loop"] <= frame["depth"]]
    assert active["correct"].mean() < 0.3  # chance is 1/8
    assert math.isnan(tables["depth_matrix__frontier"]["frontier"].iloc[1])


def test_perfect_executor_iterates_on_every_extra_loop(tok, rows):
    tables = overshoot.run(PerfectExecutor(tok), tok, rows, extra=3)
    frame = tables["overshoot"]
    assert len(frame) == len(rows) * 3 and set(frame["extra"]) == {1, 2, 3}
    assert (frame["cls"] == "iterate").all()
    summary = overshoot.summarize(tables)
    assert summary["split"]["iterate"] == {"count": 96, "share": 1.0}
    assert summary["split"]["park"]["count"] == 0


def test_parking_executor_parks(tok, rows):
    tables = overshoot.run(ParkingExecutor(tok), tok, rows, extra=3)
    frame = tables["overshoot"]
    # Where the continued chain returns to x_d the two classes coincide and iterate has priority.
    assert (frame[~frame["coincide"]]["cls"] == "park").all()
    assert (frame[frame["coincide"]]["cls"] == "iterate").all()
    assert (~frame["coincide"]).sum() >= 40  # 54 of 96 with these rows
    cost = tables["overshoot__cost"]
    assert (cost["answer_acc"] == 1.0).all()
    assert set(cost["depth"]) == {1, 2, 3, 4} and (cost["n"] == 8).all()


def test_overshoot_classes_are_exclusive_in_priority():
    assert overshoot.classify("A", "A", "A") == "iterate"
    assert overshoot.classify("B", "A", "B") == "park"
    assert overshoot.classify("C", "A", "B") == "other"
