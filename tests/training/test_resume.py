"""--resume after a stop gives bitwise the same trained tensors as an uninterrupted run (CPU, tiny)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from workbench.errors import WorkbenchError
from workbench.train.trainer import train


def train_losses(run):
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in lines if r["kind"] == "train"]


def test_resume_after_a_stop_is_bitwise_identical(finished_run, tmp_path):
    recipe = finished_run / "recipe.toml"  # the resolved recipe is itself a recipe
    out = tmp_path / "stopped"
    summary = train(recipe, out=out, stop_after=5, progress=False)  # last checkpoint at step 4
    assert summary["finished"] is False and not (out / "provenance.json").exists()
    # what a kill leaves behind: a half-written metrics line and a checkpoint never renamed into place
    with open(out / "metrics.jsonl", "a") as f:
        f.write('{"kind": "train", "step": 6, "lo')
    (out / "checkpoints" / ".step_6.tmp999").mkdir()
    summary = train(recipe, out=out, resume=True, progress=False)
    assert summary["finished"] is True and summary["steps"] == 6
    want = load_file(str(finished_run / "trainable.safetensors"))
    got = load_file(str(out / "trainable.safetensors"))
    assert want.keys() == got.keys()
    assert all(torch.equal(want[k], got[k]) for k in want)
    assert train_losses(out) == train_losses(finished_run)  # steps 5-6 recomputed, nothing duplicated


def test_resume_refuses_another_recipe_and_a_fresh_run_refuses_an_existing_dir(finished_run, tmp_path):
    recipe = finished_run / "recipe.toml"
    out = tmp_path / "stopped"
    train(recipe, out=out, stop_after=2, progress=False)
    with pytest.raises(WorkbenchError, match=r"resolved recipe differs .*lr = 0\.5"):
        train(recipe, out=out, overrides=["optim.lr=0.5"], resume=True, progress=False)
    with pytest.raises(WorkbenchError, match="already holds a run; pass --resume"):
        train(recipe, out=out, progress=False)
    with pytest.raises(WorkbenchError, match="holds no recipe.toml; nothing to resume"):
        train(recipe, out=tmp_path / "never", resume=True, progress=False)


def test_a_run_written_before_an_option_existed_resumes(finished_run, tmp_path):
    """A key added later with its default (here [train] compile) does not block --resume of an older run."""
    recipe = finished_run / "recipe.toml"
    out = tmp_path / "older"
    train(recipe, out=out, stop_after=5, progress=False)
    stored = out / "recipe.toml"
    text = stored.read_text()
    assert "compile = false" in text
    stored.write_text(text.replace("compile = false\n", ""))  # what a run started before the option holds
    summary = train(recipe, out=out, resume=True, progress=False)
    assert summary["finished"] is True and summary["steps"] == 6
    assert train_losses(out) == train_losses(finished_run)


def test_the_same_tiny_run_twice_gives_identical_weights(finished_run, tmp_path):
    summary = train(finished_run / "recipe.toml", out=tmp_path / "again", progress=False)
    assert summary["finished"] is True
    want = load_file(str(finished_run / "trainable.safetensors"))
    got = load_file(str(tmp_path / "again" / "trainable.safetensors"))
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
    assert train_losses(tmp_path / "again") == train_losses(finished_run)
