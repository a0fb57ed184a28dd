"""`[train] compile = true` compiles every decoder layer in place: the run trains, saves the same tensor names and
follows the eager run's losses to float tolerance."""

from __future__ import annotations

import json

import pytest
from safetensors.torch import load_file

from workbench.train.trainer import train


@pytest.mark.slow
def test_a_compiled_run_matches_the_eager_run(write_recipe, tmp_path):
    losses = {}
    for flag in (False, True):
        path = write_recipe(f"r{flag}.toml", train={"compile": flag},
                            stages=[{"depths": [1, 2], "steps": 3}])
        train(path, out=tmp_path / str(flag), progress=False)
        lines = [json.loads(x) for x in (tmp_path / str(flag) / "metrics.jsonl").read_text().splitlines()]
        losses[flag] = [r["loss"] for r in lines if r["kind"] == "train"]
    assert losses[True] == pytest.approx(losses[False], rel=1e-4, abs=1e-5)
    eager, compiled = (load_file(tmp_path / str(f) / "trainable.safetensors") for f in (False, True))
    assert eager.keys() == compiled.keys()
