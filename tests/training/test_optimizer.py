"""Optimizer safeguards (retrofit paper Sec. 5.1, App. A.2): W_p's own group and rate, refused
multipliers, liveness of the re-entry, realized movement per group in metrics.jsonl."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from workbench.errors import WorkbenchError
from workbench.loop.config import Block, RetrofitConfig
from workbench.loop.surgery import retrofit
from workbench.tasks.chase import chase_row
from workbench.train.losses import chain_loss, make_batch
from workbench.train.optim import check_prelude_group, liveness, make_optimizer
from workbench.train.recipe import OptimTable
from workbench.train.rundir import load_checkpoint, save_checkpoint
from workbench.train.trainer import train

OPTIM = OptimTable(lr=1e-3)


def rows(tok, depths, seed=0):
    return [chase_row(4, d, i, seed, tokenizer=tok, split="train") for i, d in enumerate(depths)]


def test_prelude_projection_has_its_own_group_at_the_multiplied_rate(tiny):
    model, _ = tiny
    looped = retrofit(model, RetrofitConfig(Block(2, 4)))
    opt, _ = make_optimizer(looped, ["block", "reentry"], OPTIM)
    groups = {g["name"]: g for g in opt.param_groups}
    assert set(groups) == {"block", "reentry", "prelude_proj"}
    assert groups["prelude_proj"]["params"] == [looped.reentry.prelude_proj.weight]
    assert groups["prelude_proj"]["lr"] == pytest.approx(1e-2) and groups["reentry"]["lr"] == pytest.approx(1e-3)
    assert all(p is not looped.reentry.prelude_proj.weight for p in groups["reentry"]["params"])
    check_prelude_group(opt, looped, 1e-3, 10.0)
    with pytest.raises(WorkbenchError, match="expected 0.001 × 10.0"):
        groups["prelude_proj"]["lr"] = 1e-3
        check_prelude_group(opt, looped, 1e-3, 10.0)
    merged = torch.optim.AdamW([p for g in opt.param_groups for p in g["params"]], lr=1e-3)
    merged.param_groups[0]["name"] = "all"
    with pytest.raises(WorkbenchError, match="not alone in its own 'prelude_proj'"):
        check_prelude_group(merged, looped, 1e-3, 10.0)


def test_the_optimizer_comes_with_the_parameter_names_of_its_groups(tiny, tmp_path):
    """make_optimizer returns each group's parameter names; a checkpoint stores them and refuses others on load."""
    model, _ = tiny
    looped = retrofit(model, RetrofitConfig(Block(2, 4)))
    opt, names = make_optimizer(looped, ["block", "reentry"], OPTIM)
    by_id = {id(p): n for n, p in looped.named_parameters()}
    assert names == [[by_id[id(p)] for p in g["params"]] for g in opt.param_groups]
    assert [g["name"] for g in opt.param_groups] == ["block", "reentry", "prelude_proj"]
    assert names[2] == ["reentry.prelude_proj.weight"] and "reentry.prelude_proj.weight" not in names[1]
    assert not hasattr(opt, "param_names")
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
    groups = ["block", "reentry"]
    ckpt = save_checkpoint(tmp_path, 1, looped, groups, opt, names, sched, {"optimizer": "main"})
    assert json.loads((ckpt / "optimizer.json").read_text())["param_names"] == names
    assert load_checkpoint(ckpt, looped, groups, opt, names, sched)["step"] == 1
    swapped = [names[1], names[0], names[2]]
    with pytest.raises(WorkbenchError, match="optimizer parameters differ from this run's groups"):
        load_checkpoint(ckpt, looped, groups, opt, swapped, sched)


def test_a_multiplier_the_optimizer_cannot_honour_is_refused(tiny, write_recipe):
    model, _ = tiny
    looped = retrofit(model, RetrofitConfig(Block(2, 4)))
    with pytest.raises(WorkbenchError, match="optim.name = 'sgd' with optim.prelude_lr_mult = 10.0"):
        make_optimizer(looped, ["block", "reentry"], replace(OPTIM, name="sgd"))
    opt, _ = make_optimizer(looped, ["block", "reentry"], replace(OPTIM, name="sgd", prelude_lr_mult=1.0))
    assert isinstance(opt, torch.optim.SGD)
    recipe = write_recipe(optim={"name": "sgd"})
    with pytest.raises(WorkbenchError, match="only adamw honours"):  # and through a recipe, before any step
        train(recipe, out=Path(recipe).parent / "run", progress=False)


def test_bridge_liveness_projections_at_step_0_gate_after_step_1(tiny):
    model, tok = tiny
    looped = retrofit(model, RetrofitConfig(Block(2, 4)))
    for p in looped.parameters():
        p.requires_grad_(False)
    opt, _ = make_optimizer(looped, ["reentry"], OPTIM)
    batch = make_batch(rows(tok, [2, 3, 2, 1]), tok)
    chain_loss(looped, batch)[0].backward()
    g = liveness(looped)
    assert g["prelude_proj.weight"] > 0 and g["state_proj.weight"] > 0
    assert g["gate"] == 0.0  # structurally: translated == h at init
    opt.step()
    opt.zero_grad()
    chain_loss(looped, batch)[0].backward()
    assert liveness(looped)["gate"] > 0


def test_injection_alpha_is_live_at_step_0(tiny):
    model, tok = tiny
    looped = retrofit(model, RetrofitConfig(Block(2, 4), reentry="inject"))
    chain_loss(looped, make_batch(rows(tok, [2, 2]), tok))[0].backward()
    assert liveness(looped)["alpha"] > 0


def test_trainer_refuses_a_dead_reentry(write_recipe, tmp_path):
    from workbench.train.recipe import Recipe
    from workbench.train.trainer import Trainer

    trainer = Trainer(Recipe.from_toml(write_recipe()), tmp_path / "dead", progress=False)
    trainer.setup()
    trainer.build_optimizer("main")
    trainer.looped.reentry.prelude_proj.weight.register_hook(torch.zeros_like)
    with pytest.raises(WorkbenchError, match="liveness: the re-entry's prelude_proj.weight got exactly zero"):
        trainer.run()


def test_realized_movement_per_group_shows_the_10x_rate(finished_run):
    records = [json.loads(line) for line in (finished_run / "metrics.jsonl").read_text().splitlines()]
    train_lines = [r for r in records if r["kind"] == "train"]
    assert all(set(r["move_rms"]) == {"block", "reentry", "prelude_proj"} for r in train_lines)
    first = train_lines[0]
    # Adam's first update moves every element with a gradient by ~lr: the block at step 1 ...
    assert first["move_rms"]["block"] == pytest.approx(first["lr"]["block"], rel=0.05)
    # ... and W_p on its first step through the re-entry (a depth-1 step leaves it untouched) by 10 lr.
    live = next(r for r in train_lines if r["loops"] >= 2)
    assert all(r["move_rms"]["prelude_proj"] == 0.0 for r in train_lines if r["step"] < live["step"])
    assert live["lr"]["prelude_proj"] == pytest.approx(10 * live["lr"]["block"])
    assert live["move_rms"]["prelude_proj"] == pytest.approx(live["lr"]["prelude_proj"], rel=0.05)
    prov = json.loads((finished_run / "provenance.json").read_text())
    assert prov["liveness"] == {"projections_step": live["step"], "gate_step": live["step"] + 1}
