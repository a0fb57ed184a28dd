"""The shipped accelerate presets on this CPU (gloo): `workbench launch --preset ddp|fsdp2|zero2 --cpu` with two
processes trains what one process trains, and each run directory loads strictly in one process. Under zero2
(DeepSpeed ZeRO-2, installed by `make setup`: its absence fails here) the gradient records match one process's
and a run resumed from a ZeRO-2 checkpoint ends where the uninterrupted one-process run ends."""

from __future__ import annotations

import ast
import json
import math
import os
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from workbench.runs import load_run, verify_files
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


def launch(root, preset: str, out: str, *extra: str) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}   # --cpu sets DS_ACCELERATOR=cpu for zero2
    done = subprocess.run([sys.executable, "-m", "workbench", "launch", str(root / "recipe.toml"), "--preset", preset,
                           "--processes", "2", "--cpu", "--out", str(root / out), *extra],
                          env=env, capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def train_records(run) -> list[dict]:
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "train"]


@pytest.mark.multiprocess   # two training processes per preset (about 13 s each on a quiet 2-core machine; zero2 ~100 s loaded)
@pytest.mark.timeout(600)
@pytest.mark.parametrize("preset", ["ddp", "fsdp2", "zero2"])
def test_two_processes_under_a_preset_match_one_and_load_strictly(one_process, preset):
    root = one_process
    launch(root, preset, preset)
    prov = verify_files(root / preset)
    assert prov["processes"] == 2 and prov["engine"]["engine"] == preset
    if preset == "zero2":
        assert prov["engine"]["world_size"] == 2 and prov["engine"]["stage"] == 2
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


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_zero2_records_the_gradients_and_movement_one_process_records(one_process):
    """grad_norm, grad_rms and move_rms per group, and the liveness reading, come from the FULL gradients and the
    summed loss under ZeRO-2 (a rank holds half); the re-entry's groups, untouched on the one-loop first step, are
    skipped there as one process skips them (no movement, no AdamW step counted: the checkpoints' states match)."""
    root = one_process
    if not (root / "zero2" / "provenance.json").is_file():   # run alone (-k), without the preset test
        launch(root, "zero2", "zero2")
    one, two = train_records(root / "one"), train_records(root / "zero2")
    assert [r["step"] for r in one] == [r["step"] for r in two] == [1, 2, 3]
    assert one[0]["move_rms"]["prelude_proj"] == two[0]["move_rms"]["prelude_proj"] == 0.0   # loops = 1: untouched
    for a, b in zip(one, two):
        assert math.isclose(b["loss"], a["loss"], rel_tol=1e-5) and math.isclose(b["grad_norm"], a["grad_norm"],
                                                                                rel_tol=1e-5)
        for key in ("grad_rms", "move_rms"):
            assert a[key].keys() == b[key].keys() == {"lora", "prelude_proj", "reentry"}
            for g in a[key]:
                assert math.isclose(b[key][g], a[key][g], rel_tol=1e-5, abs_tol=1e-12), (a["step"], key, g)
        assert ("liveness" in a) == ("liveness" in b)
        for n, v in a.get("liveness", {}).items():   # the gate's gradient is tiny and cancels: rel 1e-3
            assert (b["liveness"][n] == 0.0) == (v == 0.0) and math.isclose(b["liveness"][n], v, rel_tol=1e-3), n
    for step in (2, 3):   # the gathered AdamW state is one process's, in its format (so either resumes the other)
        a = load_file(str(root / "one" / "checkpoints" / f"step_{step}" / "optimizer.safetensors"))
        b = load_file(str(root / "zero2" / "checkpoints" / f"step_{step}" / "optimizer.safetensors"))
        assert a.keys() == b.keys()
        for k in a:
            torch.testing.assert_close(b[k], a[k], rtol=1e-4, atol=1e-7, msg=k)


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_zero2_resumes_from_its_checkpoint_where_the_uninterrupted_run_ends(one_process):
    root = one_process
    if not (root / "zero2" / "provenance.json").is_file():
        launch(root, "zero2", "zero2")
    cut = root / "zero2-resumed"   # the zero2 run as if stopped after its step-2 checkpoint
    shutil.copytree(root / "zero2", cut)
    shutil.rmtree(cut / "checkpoints" / "step_3")
    for name in ("trainable.safetensors", "provenance.json"):
        (cut / name).unlink()
    out = launch(root, "zero2", "zero2-resumed", "--resume", "--json")
    assert json.loads(out)["finished"] is True   # stdout holds the summary alone (DeepSpeed's prints go to stderr)
    a = load_file(str(root / "one" / "trainable.safetensors"))
    b = load_file(str(cut / "trainable.safetensors"))
    start = load_file(str(cut / "checkpoints" / "step_2" / "trainable.safetensors"))
    assert max(float((b[k] - start[k]).abs().max()) for k in b) > 1e-4   # the resumed step moved the weights
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-4, atol=2e-6, msg=k)
    assert [r["step"] for r in train_records(cut)] == [1, 2, 3]
    load_run(cut)


def test_zero2_refuses_an_optimizer_other_than_adamw_before_writing(write_recipe, monkeypatch, tmp_path):
    from workbench.errors import WorkbenchError
    from workbench.train import trainer
    from workbench.train.recipe import Recipe

    monkeypatch.setattr(trainer, "requested_engine", lambda n: "zero2")   # as under the preset with 2 processes
    recipe = Recipe.from_toml(write_recipe(optim={"name": "sgd", "prelude_lr_mult": 1.0}), None)
    with pytest.raises(WorkbenchError, match="optim.name = 'sgd' under the zero2 preset"):
        trainer.Trainer(recipe, tmp_path / "run", progress=False, device="cpu")
    assert not (tmp_path / "run").exists()


TOY = """import os
import torch
import torch.distributed as dist
from workbench.errors import WorkbenchError
from workbench.train.optim import step_with_movement
from workbench.train.zero2 import Zero2Optimizer

dist.init_process_group("gloo", rank=0, world_size=1, init_method="tcp://127.0.0.1:" + os.environ["PORT"])


class Toy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = torch.nn.Parameter(torch.randn(3, 3)), torch.nn.Parameter(torch.randn(3))
        self.c1, self.c2 = torch.nn.Parameter(torch.randn(3)), torch.nn.Parameter(torch.randn(3))

    def forward(self, x, use_b, use_c2):
        h = (x @ self.a).tanh()
        h = h + self.b if use_b else h
        h = h * self.c1 + (self.c2 if use_c2 else 0)
        return h.pow(2).sum()


def opt(m):
    return torch.optim.AdamW([{"name": "a", "params": [m.a], "lr": 1e-2}, {"name": "b", "params": [m.b], "lr": 1e-1},
                              {"name": "c", "params": [m.c1, m.c2], "lr": 1e-2}], foreach=False, weight_decay=0.1)


x = torch.randn(4, 3)
one, two = Toy(), Toy()
o1 = opt(one)
z = Zero2Optimizer(two, opt(two), clip=0.0, world_size=1)
for step, (use_b, use_c2) in enumerate([(False, True), (True, True), (True, False)]):
    o1.zero_grad(set_to_none=True)
    one(x, use_b, use_c2).backward()
    m1 = step_with_movement(o1)
    z.zero_grad()
    z.backward(two(x, use_b, use_c2))
    try:
        m2 = z.step_with_movement([["a"], ["b"], ["c1", "c2"]])
    except WorkbenchError as err:
        print("REFUSED", step + 1, err)
        break
    print("MOVE", step + 1, {k: (m1[k], m2[k]) for k in m1})
    print("MAXDIFF", step + 1, max(float((p - q).abs().max()) for p, q in zip(one.parameters(), two.parameters())))
"""


@pytest.mark.multiprocess   # one process with DeepSpeed's engine (about 50 s loaded: its import and start-up)
@pytest.mark.timeout(300)
def test_zero2_skips_an_untouched_group_as_adamw_does_and_refuses_a_partly_touched_one(tmp_path):
    """A toy with three groups against plain per-tensor AdamW, bit for bit: group b gets no gradient on step 1 (no
    move, no AdamW step counted, so step 2's bias correction is one process's), and on step 3 one of group c's two
    tensors gets none, which ZeRO-2 cannot skip alone: one line naming it."""
    from tests.training.test_accelerate import free_port

    (tmp_path / "toy.py").write_text(TOY)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu", "LOCAL_RANK": "0", "RANK": "0",
           "WORLD_SIZE": "1", "PORT": str(free_port())}
    done = subprocess.run([sys.executable, str(tmp_path / "toy.py")], env=env, capture_output=True, text=True,
                          timeout=240, cwd=str(tmp_path))
    lines = [line for line in done.stdout.splitlines() if line.split(" ")[0] in ("MOVE", "MAXDIFF", "REFUSED")]
    assert [line.split(" ")[:2] for line in lines] == [["MOVE", "1"], ["MAXDIFF", "1"], ["MOVE", "2"],
                                                        ["MAXDIFF", "2"], ["REFUSED", "3"]], done.stderr[-3000:]
    moves = [ast.literal_eval(lines[i].split(" ", 2)[2]) for i in (0, 2)]   # {group: (one process, zero2)}
    assert all(a == b for m in moves for a, b in m.values()) and moves[0]["b"] == (0.0, 0.0) and moves[1]["b"][0] > 0
    assert lines[1] == "MAXDIFF 1 0.0" and lines[3] == "MAXDIFF 2 0.0"
    assert "trained tensor 'c2' got no gradient while the rest of its group 'c' did" in lines[4]
