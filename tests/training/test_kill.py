"""A training process killed with SIGKILL in the middle of a checkpoint save loses nothing it had saved.

The kill is made deterministic: a child process runs `workbench train` with the checkpoint
writer wrapped so that, while writing the step-4 checkpoint, it writes half of the optimizer
file and then sends itself SIGKILL (no cleanup, no atexit, no flush: what a kill leaves).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from workbench.train.rundir import checkpoints

ROOT = Path(__file__).resolve().parents[2]

CHILD = """
import os, signal, sys
from pathlib import Path
import workbench.train.rundir as rundir
from workbench import cli

real = rundir.save_tensors

def dying_save(path, tensors, metadata=None):
    path = Path(path)
    if path.parent.name.startswith(".step_4.tmp") and path.name == "optimizer.safetensors":
        real(path, tensors, metadata)
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
        os.kill(os.getpid(), signal.SIGKILL)
    real(path, tensors, metadata)

rundir.save_tensors = dying_save
sys.argv = ["workbench", "train", sys.argv[1], "--out", sys.argv[2]]
cli.run()
"""


def workbench_train(*args):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", "from workbench import cli; cli.run()", "train", *map(str, args)],
                          cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.multiprocess  # an end-to-end run: a training subprocess killed, then resumed
def test_sigkill_during_a_checkpoint_save_then_resume(finished_run, tmp_path):
    recipe = finished_run / "recipe.toml"
    run = tmp_path / "run"
    child = subprocess.run([sys.executable, "-c", CHILD, str(recipe), str(run)], cwd=ROOT, capture_output=True,
                           text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]

    # what the kill left: step 2 complete, step 4 half-written under its temporary name, no final files
    assert checkpoints(run) == [2]
    stale = list((run / "checkpoints").glob(".step_4.tmp*"))
    assert len(stale) == 1 and (stale[0] / "optimizer.safetensors").exists()
    assert not (run / "trainable.safetensors").exists() and not (run / "provenance.json").exists()
    assert not (run / "checkpoints" / "step_4").exists()

    # the previous checkpoint is whole: every tensor file loads and its state says step 2
    step2 = run / "checkpoints" / "step_2"
    assert json.loads((step2 / "state.json").read_text())["step"] == 2
    for name in ("trainable.safetensors", "optimizer.safetensors", "rng.safetensors"):
        assert load_file(str(step2 / name))

    resumed = workbench_train(recipe, "--out", run, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert not list((run / "checkpoints").glob(".step_*.tmp*"))  # the half-written save is cleared
    want = load_file(str(finished_run / "trainable.safetensors"))
    got = load_file(str(run / "trainable.safetensors"))
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
