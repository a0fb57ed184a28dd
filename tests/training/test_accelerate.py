"""Scale-out: two CPU processes over gloo under `accelerate launch` train what one process trains
on the same global batch (each rank takes a shard; gradients are summed before clipping)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from workbench.train.trainer import train

LAUNCHER = "import sys\nfrom workbench.train.trainer import train\ntrain(sys.argv[1], out=sys.argv[2], progress=False)\n"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.multiprocess  # an end-to-end run: two training processes over gloo
@pytest.mark.timeout(600)
def test_two_gloo_processes_match_one_process(write_recipe, tmp_path):
    accelerate = shutil.which("accelerate", path=str(Path(sys.executable).parent))
    assert accelerate, "accelerate's launcher is not installed next to this Python"
    recipe = write_recipe(optim={"lr": 1e-3, "batch_size": 6}, eval={"every": 1000, "per_depth": 2},
                          stages=[{"depths": [1], "steps": 1}, {"depths": [1, 2], "steps": 2}])
    one = train(recipe, out=tmp_path / "one", progress=False)
    script = tmp_path / "launch.py"
    script.write_text(LAUNCHER)
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"}
    cmd = [accelerate, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
           "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port()),
           str(script), recipe, str(tmp_path / "two")]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stderr[-3000:]
    import json

    assert json.loads((tmp_path / "two" / "provenance.json").read_text())["processes"] == 2
    a = load_file(str(tmp_path / "one" / "trainable.safetensors"))
    b = load_file(str(tmp_path / "two" / "trainable.safetensors"))
    assert a.keys() == b.keys() and one["finished"]
    start = load_file(str(tmp_path / "one" / "checkpoints" / "step_2" / "trainable.safetensors"))
    moved = max(float((a[k] - start[k]).abs().max()) for k in a)
    assert moved > 1e-4  # the last step moved the weights well beyond the tolerance below
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-4, atol=2e-6, msg=k)
