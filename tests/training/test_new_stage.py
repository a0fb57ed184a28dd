"""Adding a training stage kind is one module: dropped in and registered through `workbench.train.kinds.register`,
its kind is a recipe value at once (its own checks run when the recipe is read) and the trainer trains it, with no
other file edited.

The module, `final_loop.py`, is written into a temporary folder and imported from there, as a contributor's own
module would be: a step function and its `StageKind` record, nothing else. Nothing in the package names it.
"""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from workbench.errors import WorkbenchError
from workbench.train import kinds
from workbench.train.recipe import Recipe
from workbench.train.trainer import train

FINAL_LOOP = '''"""final_loop: each step grades the answer alone, read at the batch's deepest depth (no intermediate loop)."""

from workbench.errors import WorkbenchError
from workbench.train.kinds import StageKind, register
from workbench.train.losses import answer_loss
from workbench.train.optim import MAIN
from workbench.train.steps import StepLoss


def final_step(model, x, run):
    loops = max(r["depth"] for r in x.rows)
    loss = answer_loss(model, x.batch, loops, denominator=len(x.rows))
    return StepLoss(loss, loops, {"graded_loop": loops})


def check(recipe, i):
    if recipe.stages[i].chain_weight != 1.0:
        raise WorkbenchError(f"stage {i} is a final_loop stage, which grades no intermediate loop: "
                             f"leave stages.{i}.chain_weight at 1")


register(StageKind("final_loop", final_step, MAIN, loops=lambda recipe, stage: max(stage.depths), check=check))
'''


@pytest.fixture
def final_loop(tmp_path):
    """Imports final_loop.py from a folder outside the package (its last line registers the kind); unregisters it
    after the test."""
    path = tmp_path / "contrib" / "final_loop.py"
    path.parent.mkdir()
    path.write_text(FINAL_LOOP)
    spec = importlib.util.spec_from_file_location("final_loop", path)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    yield kinds.stage_kind("final_loop")
    kinds.unregister("final_loop")


def stages(**extra) -> list[dict]:
    return [{"name": "graded", "kind": "final_loop", "depths": [1, 2], "steps": 2, **extra}]


def test_an_unregistered_kind_is_refused_in_one_line(write_recipe):
    with pytest.raises(WorkbenchError, match="'stages.0.kind' = 'final_loop' is not accepted; accepted: chain, "):
        Recipe.from_toml(write_recipe(stages=stages()))


@pytest.mark.slow  # a tiny training end to end: a few seconds
def test_a_stage_kind_dropped_in_is_validated_and_trains(final_loop, write_recipe, tmp_path):
    assert "final_loop" in kinds.names()
    with pytest.raises(WorkbenchError, match="final_loop stage, which grades no intermediate loop"):
        Recipe.from_toml(write_recipe(stages=stages(chain_weight=0.5)))    # the module's own check, when read
    path = write_recipe(stages=stages())
    assert Recipe.from_toml(path).kinds == {"final_loop"}
    summary = train(path, out=tmp_path / "run", progress=False)
    assert summary["finished"] and summary["steps"] == 2
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["kind"] == "train"]
    assert [r["stage"] for r in steps] == ["graded", "graded"]
    assert all(r["graded_loop"] == r["loops"] and r["loss"] > 0 for r in steps)   # its own step's record
    assert all(r["move_rms"]["block"] > 0 for r in steps)                        # the main optimizer stepped
    assert summary["after"] is not None and json.loads((tmp_path / "run" / "provenance.json").read_text())["steps"] == 2
    assert torch.isfinite(torch.tensor([r["loss"] for r in steps])).all()
