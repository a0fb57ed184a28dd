"""The shipped accelerate presets on this CPU (gloo): `workbench launch --preset ddp|fsdp2 --cpu` with two
processes trains what one process trains, and each run directory loads strictly in one process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from workbench.train.rundir import load_run, verify_files
from workbench.train.trainer import train

# LoRA on the looped block (frozen base): under fsdp2 the layers outside the block are sharded.
TABLES = dict(optim={"lr": 1e-3, "batch_size": 6}, eval={"every": 1000, "per_depth": 2},
              lora={"enabled": True, "r": 2, "alpha": 4}, train={"block": False},
              checkpoint={"every": 2, "keep": 2},
              stages=[{"depths": [1], "steps": 1}, {"depths": [1, 2], "steps": 2}])


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    import tomli_w

    from tests.training.conftest import TINY_RECIPE, merge

    root = tmp_path_factory.mktemp("engines")
    (root / "recipe.toml").write_text(tomli_w.dumps(merge(TINY_RECIPE, TABLES)))
    train(root / "recipe.toml", out=root / "one", progress=False, device="cpu")
    return root


@pytest.mark.slow   # two training processes per preset (about 13 s each on a quiet 2-core machine)
@pytest.mark.timeout(600)
@pytest.mark.parametrize("preset", ["ddp", "fsdp2"])
def test_two_processes_under_a_preset_match_one_and_load_strictly(one_process, preset):
    root = one_process
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "workbench", "launch", str(root / "recipe.toml"), "--preset", preset,
                           "--processes", "2", "--cpu", "--out", str(root / preset)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    prov = verify_files(root / preset)
    assert prov["processes"] == 2 and prov["engine"]["engine"] == preset
    if preset == "fsdp2":   # tiny-llama has 6 layers, the block is 2:4
        assert prov["engine"]["sharded_layers"] == [0, 1, 4, 5] and prov["engine"]["whole"]["block"] == [2, 4]
    a = load_file(str(root / "one" / "trainable.safetensors"))
    b = load_file(str(root / preset / "trainable.safetensors"))
    assert a.keys() == b.keys() and any("lora_B" in k for k in a)
    start = load_file(str(root / "one" / "checkpoints" / "step_2" / "trainable.safetensors"))
    assert max(float((a[k] - start[k]).abs().max()) for k in a) > 1e-4   # the last step moved the weights
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-4, atol=2e-6, msg=k)
    looped, _, _ = load_run(root / preset)   # strict: every trained tensor present, none extra, same shapes
    named = dict(looped.named_parameters())
    for k in a:
        assert torch.equal(named[k].detach(), b[k]), k
    assert json.loads((root / preset / "provenance.json").read_text())["base_unchanged"] is True
