"""A run that cannot go on stops cleanly, and a stopped run resumes from a checkpoint or not at all.

The run directory is locked while a process trains into it; a non-finite loss or parameter stops
the run with no keeper-like output; `--resume` refuses a run stopped before its first checkpoint
(starting over would empty its metrics.jsonl) and falls back past a damaged checkpoint to the
newest intact one.
"""

import json
import os

import pytest

from tests.test_cli_errors import assert_clean_error, invoke
from workbench.errors import WorkbenchError
from workbench.io import locked_dir
from workbench.train.trainer import train

RUN_FILES = ("trainable.safetensors", "provenance.json")


def train_steps(run) -> list[int]:
    records = map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
    return [r["step"] for r in records if r["kind"] == "train"]


def test_a_second_trainer_on_a_locked_run_directory_is_refused(capsys, monkeypatch, tmp_path, write_recipe):
    recipe, run = write_recipe(), tmp_path / "run"
    with locked_dir(run, "run directory"):  # as a first `workbench train` holds it
        code, _, err = invoke(capsys, monkeypatch, "train", recipe, "--out", run)
    assert_clean_error(code, err, f"run directory '{run}' is in use by another process (pid {os.getpid()})")
    assert not run.exists()  # the lock's directory held nothing else, and went with it


def test_a_non_finite_loss_stops_the_run_without_output(tmp_path, write_recipe):
    recipe, run = write_recipe(optim={"lr": 1e30}), tmp_path / "run"
    with pytest.raises(WorkbenchError, match=r"step \d+: (the loss is nan|the loss is inf|the update made trained "
                                             r"tensor '.*' non-finite); the run stops without saving"):
        train(recipe, out=run, progress=False)
    assert not any((run / name).exists() for name in RUN_FILES)  # nothing a keeper or a probe would load


def test_resume_keeps_the_history_of_a_run_stopped_before_its_first_checkpoint(tmp_path, write_recipe):
    """Nothing to continue from: resuming would restart at step 0 and empty metrics.jsonl, so it is refused."""
    recipe, run = write_recipe(), tmp_path / "run"
    first = train(recipe, out=run, stop_after=1, progress=False)  # checkpoints come every 2 steps
    assert not first["finished"] and not (run / "checkpoints").exists()
    with pytest.raises(WorkbenchError, match="already holds a run; pass --resume"):
        train(recipe, out=run, progress=False)
    metrics = (run / "metrics.jsonl").read_bytes()
    with pytest.raises(WorkbenchError, match="no checkpoint to continue from"):
        train(recipe, out=run, resume=True, progress=False)
    assert (run / "metrics.jsonl").read_bytes() == metrics and metrics


def test_resume_falls_back_past_a_damaged_checkpoint(tmp_path, write_recipe):
    recipe, run = write_recipe(), tmp_path / "run"
    train(recipe, out=run, stop_after=4, progress=False)
    newest = run / "checkpoints" / "step_4" / "trainable.safetensors"
    newest.write_bytes(newest.read_bytes()[:100])  # cut short, as by a full disk
    done = train(recipe, out=run, resume=True, progress=False)
    assert done["finished"] and train_steps(run) == list(range(1, 7))  # steps 3 and 4 again, once each
