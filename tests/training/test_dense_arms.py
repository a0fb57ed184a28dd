"""The dense controls train through the same trainer and evaluate in the looped arm's matrix shape."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workbench.errors import WorkbenchError
from workbench.train.recipe import Recipe
from workbench.train.trainer import train


def _metrics(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("kind", ["direct", "scratchpad"])
def test_a_dense_arm_trains_at_loop_1_and_reports_the_final_cell(write_recipe, tmp_path, kind):
    path = write_recipe(train={"block": False}, lora={"enabled": True, "r": 4, "alpha": 8},
                        eval={"every": 3, "per_depth": 4, "depths": [1, 2, 3]},
                        stages=[{"kind": kind, "depths": [1, 2, 3], "steps": 3}])
    assert Recipe.from_toml(path).needed_loops() == 3   # the held-out depths bound it; every training step runs loop 1
    summary = train(path, out=tmp_path / "run", progress=False)
    assert summary["finished"]
    lines = _metrics(tmp_path / "run")
    steps = [r for r in lines if r["kind"] == "train"]
    assert [r["loops"] for r in steps] == [1, 1, 1]
    assert all(r["loss"] > 0 for r in steps)
    if kind == "scratchpad":
        assert all(1 <= len(r["position_ce"]) <= 3 for r in steps)   # up to the deepest row of the batch
    ev = [r for r in lines if r["kind"] == "eval"][-1]["acc"]
    if kind == "direct":
        assert ev.keys() == {"1", "2", "3"} and all(list(v) == [d] for d, v in ev.items())
    else:
        assert all(list(v) == [str(k) for k in range(1, int(d) + 1)] for d, v in ev.items())
    assert all(0.0 <= x <= 1.0 for v in ev.values() for x in v.values())


def test_dense_stages_do_not_mix_with_looped_ones(write_recipe):
    path = write_recipe(stages=[{"kind": "direct", "depths": [1], "steps": 1}, {"depths": [1, 2], "steps": 1}])
    with pytest.raises(WorkbenchError, match="dense control"):
        Recipe.from_toml(path)
