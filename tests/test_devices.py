"""Device-correct by construction, checked on a CPU (`workbench.devicecheck`).

The model is put on the stand-in accelerator (`SIMULATED`, the CPU under another name) and every
training stage kind and halting objective, the forced and the adaptive read, the identity check,
block selection and every probe of the battery run inside `DeviceCheck`, which records each
operation a GPU would refuse (a host tensor meeting a device one, a host tensor given to a
collective, `.numpy()` of a device tensor). The planted cases show the checker sees each kind.
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import tomli_w
import torch

from tests.conftest import PROMPTS, perturb
from tests.training.conftest import TINY_RECIPE, merge
from workbench.devicecheck import HOST, SIMULATED, DeviceCheck, checked_reduce
from workbench.loop.config import Block, RetrofitConfig
from workbench.loop.halting import HaltPolicy
from workbench.loop.surgery import retrofit
from workbench.models import load_base
from workbench.train import kinds
from workbench.train.losses import halting_objective
from workbench.train.recipe import HaltingTable, Recipe
from workbench.train.trainer import Trainer


# ----------------------------------------------------------------------------- the checker itself
def test_a_host_factory_meeting_a_device_tensor_is_recorded_where_it_was_called():
    x = torch.ones(4).to(SIMULATED)
    with DeviceCheck() as check:
        y = x + torch.arange(4)                                  # the classic: arange without device=
    assert torch.equal(y, torch.tensor([1.0, 2.0, 3.0, 4.0]))   # it still computes (on the CPU)
    assert len(check.violations) == 1 and check.violations[0].op == "add"
    assert check.violations[0].where.startswith("tests/test_devices.py:")
    with pytest.raises(AssertionError, match="would mix host and device"):
        check.assert_clean()


def test_what_a_gpu_accepts_is_not_recorded():
    x = torch.ones(4).to(SIMULATED)
    with DeviceCheck() as check:
        ids = torch.tensor([[1, 2, 3]])                          # a tokenizer's output: host, then moved
        moved = ids.to(x.device)
        assert moved.device == SIMULATED and ids.device == HOST
        z = x + torch.arange(4, device=x.device) + torch.tensor(2.0)   # 0-d host scalars are fine on CUDA
        w = x[torch.tensor([0, 2])]                              # host indices may index a device tensor
        host = (z.detach().cpu() * 2).numpy()                    # numpy after .cpu()
        _ = torch.zeros_like(x) + torch.ones(4, device=SIMULATED) + moved.sum()
    assert not check.violations, check.violations
    assert host.tolist() == [6.0, 8.0, 10.0, 12.0] and w.tolist() == [1.0, 1.0]


def test_numpy_of_a_device_tensor_and_host_indexed_by_device_are_recorded():
    x = torch.ones(3).to(SIMULATED)
    with DeviceCheck() as check:
        np.asarray(x * 2)
        torch.ones(3)[torch.tensor([0]).to(SIMULATED)]
        torch.from_numpy(np.ones(3)).float() * x
    assert [v.op for v in check.violations] == ["__array__", "__getitem__", "mul"]


def test_a_host_tensor_given_to_a_collective_is_recorded():
    class Acc:
        device = SIMULATED

    with DeviceCheck() as check:
        acc = checked_reduce(Acc(), check)
        acc.reduce(torch.ones(2, device=SIMULATED))
        assert not check.violations
        acc.reduce(torch.tensor([1.0]))
    assert [v.op for v in check.violations] == ["reduce"]


# ----------------------------------------------------------------------------- the known failures
CFG = HaltingTable(margin=0.01, depth_cost=0.0, probe_depths=[1, 2, 4], act_cost=0.01, ponder_lambda=0.2,
                   ponder_kl=0.01)


@pytest.mark.parametrize("objective", ["oracle", "act", "pondernet"])
def test_the_halting_objectives_make_no_host_tensor(objective):
    losses = torch.tensor([[3.0, 2.0, 2.0, 1.0], [1.0, 1.0, 1.0, 1.0]]).to(SIMULATED)
    probs = torch.full((2, 4), 0.3).to(SIMULATED)
    with DeviceCheck() as check:
        loss, _ = halting_objective(losses, probs, replace(CFG, objective=objective))
        assert loss.device == SIMULATED
    check.assert_clean()
    assert torch.isfinite(loss)


# ----------------------------------------------------------------------------- training, every stage kind
# Each registered stage kind's example runs (`StageKind.example`): a kind added by its module is trained here too.
RUNS = {name: tables for kind in kinds.kinds().values() for name, tables in kind.example.items()}


def test_the_runs_cover_every_stage_kind():
    covered = {s.get("kind", "chain") for run in RUNS.values() for s in run["stages"]}
    assert covered == set(kinds.names()), f"stage kinds no device test trains: {set(kinds.names()) - covered}"


def checked_training(tmp_path, tables: dict, ranks: int = 2) -> tuple[DeviceCheck, dict]:
    """Trains TINY_RECIPE + tables on SIMULATED inside a DeviceCheck, the accelerator reporting `ranks` ranks."""
    recipe = merge(TINY_RECIPE, {"eval": {"every": 1000, "per_depth": 2, "depths": [1, 2]}, **tables})
    path = tmp_path / "recipe.toml"
    path.write_text(tomli_w.dumps(recipe))
    with DeviceCheck() as check:
        trainer = Trainer(Recipe.from_toml(path), tmp_path / "run", progress=False, device=SIMULATED)
        if ranks > 1:
            trainer.acc = checked_reduce(trainer.acc, check, ranks)
        summary = trainer.run()
    return check, summary


@pytest.mark.parametrize("name", list(RUNS))
def test_every_stage_kind_and_objective_trains_without_a_host_tensor(tmp_path, name):
    check, summary = checked_training(tmp_path, RUNS[name])
    check.assert_clean()
    assert summary["finished"] and summary["device"]["used"] == "cpu:0"
    prov = json.loads((tmp_path / "run" / "provenance.json").read_text())
    assert prov["device"] == summary["device"]


# ----------------------------------------------------------------------------- reads, identity, selection
@pytest.fixture
def halting_model():
    base, tok = load_base("tiny-llama")
    looped = retrofit(base, RetrofitConfig(Block(2, 4), reentry="inject", memory=True, halting=True, max_loops=4)).eval()
    perturb(looped.halting, 0.5, seed=3)
    return looped.to(SIMULATED), tok


def test_the_forced_and_the_adaptive_read_make_no_host_tensor(halting_model):
    looped, tok = halting_model
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    with DeviceCheck() as check, torch.no_grad():
        ids, mask = enc.input_ids.to(SIMULATED), enc.attention_mask.to(SIMULATED)
        forced = looped.read(ids, mask, loops=4, candidates=torch.arange(50, 70, device=SIMULATED))
        probs = forced.halt_probs[:, :-1].flatten().sort().values
        tau = float((probs[len(probs) // 2 - 1] + probs[len(probs) // 2]) / 2)
        out = looped.adaptive_read(ids, mask, policy=HaltPolicy(tau=tau), candidates=torch.arange(50, 70))
    check.assert_clean()
    assert len(set(out.loops_used.tolist())) > 1   # rows left the batch at different loops


def test_identity_and_block_selection_make_no_host_tensor():
    from workbench.loop.identity import identity_report
    from workbench.selection.stage1 import select_block

    base, tok = load_base("tiny-llama")
    base.to(SIMULATED)
    with DeviceCheck() as check:
        rows = identity_report(base, tok, Block(2, 4), loops=2)
        sel = select_block(base, tok, texts=[f"{p} {i}" for i in range(4) for p in PROMPTS], window=2)
    check.assert_clean()
    assert max(r["max_abs_diff"] for r in rows) == 0.0 and sel.recommended


# ----------------------------------------------------------------------------- every probe
def test_every_probe_of_the_battery_makes_no_host_tensor(tmp_path):
    from workbench.probes import PROBES
    from workbench.probes.battery import run_battery
    from workbench.tasks import build_rows
    from workbench.tasks.manifest import write_manifest
    from workbench.train.trainer import train

    run = tmp_path / "run"
    recipe = merge(TINY_RECIPE, {**RUNS["sampled+oracle"], "eval": {"every": 1000, "per_depth": 2, "depths": [1, 2]}})
    (tmp_path / "recipe.toml").write_text(tomli_w.dumps(recipe))
    train(tmp_path / "recipe.toml", out=run, progress=False, device="cpu")
    _, tok = load_base("tiny-llama")
    write_manifest(build_rows("chase", [1, 2, 3], 4, 7, alphabet=4, tokenizer=tok), tmp_path / "rows.jsonl")
    small = {"identity": {"loops": 2, "n_rows": 2}, "overshoot": {"extra": 1}, "halting": {"loops": 3},
             "splice": {"depths": [2, 3], "k0s": [1], "horizon": 1, "sites": ["state"], "spans": ["all"]},
             "heads": {"depths": [2, 3], "per_depth": 4}, "linear_probe": {"depths": [1, 2, 3]},
             "logit_lens": {"depths": [1, 2, 3]}, "drift": {"depths": [2, 3]}, "latency": {"repeats": 1},
             "gradient_audit": {}, "depth_matrix": {}, "loop_accuracy": {},
             "lens_agreement": {"depths": [1, 2], "per_depth": 4, "loops": 3, "max_causal": 4},
             "dynamics": {"depths": [1, 2], "per_depth": 2, "loops": 3},
             "exit_rules": {"depths": [1, 2], "per_depth": 4, "loops": 3},
             "patching": {"depths": [2], "per_depth": 1, "positions": ["edited", "read"]},
             "attribution": {"depths": [2], "per_depth": 1, "positions": ["edited", "read"], "check_pairs": 1},
             "paths": {"depths": [2], "per_depth": 1}}
    battery = tmp_path / "battery.toml"  # a probe without small options here runs with its defaults
    battery.write_text(tomli_w.dumps({"battery": {"manifest": str(tmp_path / "rows.jsonl"), "batch_size": 4},
                                      "probes": {n: small.get(n, {}) for n in PROBES}}))
    with DeviceCheck() as check:
        summary = run_battery(str(run), str(battery), tmp_path / "out", progress=False, device=SIMULATED)
    check.assert_clean()
    ran = {n for n, p in summary["probes"].items() if p.get("status") != "not_applicable"}
    assert ran == set(PROBES), {n: p for n, p in summary["probes"].items() if n not in ran}
    assert summary["device"]["used"] == "cpu:0" and summary["model"]["device"] == "cpu:0"
