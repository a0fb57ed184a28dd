"""A real training run on a tiny model: depth-1 chase rows, the loss falls and loop 1 learns the lookup.

This fails if training is broken (no gradient reaching the block, an optimizer that does not
step, targets misaligned with the reader): the random tiny model starts below chance.
"""

from __future__ import annotations

import json

import pytest

from workbench.train.trainer import train


@pytest.mark.slow  # an end-to-end run: 300 real training steps of the random tiny-llama (batch 32)
@pytest.mark.timeout(600)
def test_depth_one_training_lowers_loss_and_lifts_loop_one_accuracy(write_recipe, tmp_path):
    """The recipe is tests/training/conftest.py's TINY_RECIPE: the base trained here is tiny-llama, not SmolLM2."""
    # All six layers looped and trainable (a tiny random model needs the capacity to learn an
    # in-context lookup); N = 4 symbols: chance 0.25, and "anything but the start" scores 1/3.
    recipe = write_recipe(model={"block": "0:6", "max_loops": 2},
                          optim={"lr": 3e-3, "batch_size": 32, "warmup_steps": 20, "schedule": "cosine"},
                          eval={"every": 1000, "per_depth": 128, "depths": [1]},
                          checkpoint={"every": 1000},
                          stages=[{"name": "depth-1", "depths": [1], "steps": 300}])
    summary = train(recipe, out=tmp_path / "real", progress=False)
    assert json.loads((tmp_path / "real" / "retrofit.json").read_text())["base"]["spec"] == "tiny-llama"
    before, after = summary["before"]["1"]["1"], summary["after"]["1"]["1"]
    losses = [json.loads(x)["loss"] for x in (tmp_path / "real" / "metrics.jsonl").read_text().splitlines()
              if '"train"' in x]
    assert len(losses) == 300
    first, last = sum(losses[:30]) / 30, sum(losses[-30:]) / 30
    assert last < first - 0.15, (first, last)
    assert before < 0.3
    assert after >= 0.42, after  # P(>= 54/128 | p = 1/3) < 0.02: more than the start-avoiding shortcut
