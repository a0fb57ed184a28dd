"""RecurTrace training pieces: the App. D loop-count sampler, oracle labels, the halting stage's head."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from workbench.loop.config import Block, RetrofitConfig
from workbench.loop.halting import oracle_labels
from workbench.loop.surgery import retrofit
from workbench.tasks.chase import chase_row
from workbench.train.losses import (
    halting_loss,
    halting_objective,
    halting_probs,
    make_batch,
    sample_loop_counts,
)
from workbench.train.oracle_sweep import sweep
from workbench.train.recipe import HaltingTable
from workbench.train.trainer import train

# RecurTrace App. D: ~10/19/20/17/12/8/5/8 % at 1..8 loops, mean near 3.9, median 4.
APP_D = [0.10, 0.19, 0.20, 0.17, 0.12, 0.08, 0.05, 0.08]


def test_lognormal_poisson_sampler_matches_app_d():
    r = sample_loop_counts(200_000, mean=4.0, sigma=0.5, max_loops=8, seed=7)
    assert r.min() == 1 and r.max() == 8
    assert r.mean() == pytest.approx(3.9, abs=0.05) and np.median(r) == 4
    shares = np.bincount(r, minlength=9)[1:] / len(r)
    assert np.abs(shares - APP_D).max() < 0.015
    assert shares[5:].sum() == pytest.approx(0.21, abs=0.02)  # "about a fifth ... six loops or more"
    assert np.array_equal(sample_loop_counts(50, seed=3), sample_loop_counts(50, seed=3))  # lock step across ranks
    wide = sample_loop_counts(50_000, mean=6.0, sigma=0.5, max_loops=16, seed=1)
    assert wide.mean() == pytest.approx(6.0, abs=0.1)


def test_oracle_labels_mark_continue_only_where_a_deeper_loop_gains_more_than_the_margin():
    losses = torch.tensor([[3.0, 2.0, 2.0, 1.0], [1.0, 1.0, 1.0, 1.0], [1.0, 0.995, 0.5, 0.6]])
    labels = oracle_labels(losses, margin=0.01)
    assert labels.tolist() == [[1, 1, 1, 0], [0, 0, 0, 0], [1, 1, 0, 0]]
    # a depth cost charges each extra loop: 1.0 -> 0.5 two loops later no longer pays at cost 0.3
    assert oracle_labels(losses[2:], margin=0.01, depth_cost=0.3).tolist() == [[0, 1, 0, 0]]


@pytest.mark.parametrize("objective", ["oracle", "act", "pondernet"])
def test_halting_objectives_train_only_the_head(tiny, objective):
    model, tok = tiny
    looped = retrofit(model, RetrofitConfig(Block(2, 4), reentry="inject", memory=True, halting=True))
    for p in looped.parameters():
        p.requires_grad_(False)
    for p in looped.halting.parameters():
        p.requires_grad_(True)
    rows = [chase_row(4, d, i, 0, tokenizer=tok, split="train") for i, d in enumerate([1, 2, 3, 2])]
    cfg = HaltingTable(objective=objective, oracle_max=4, margin=0.01, depth_cost=0.0, probe_depths=[1, 2, 4, 6],
               act_cost=0.01, ponder_lambda=0.2, ponder_kl=0.01)
    loss, info = halting_loss(looped, make_batch(rows, tok), cfg)
    loss.backward()
    assert torch.isfinite(loss) and float(loss.detach()) > 0
    assert float(looped.halting.proj.weight.grad.abs().sum()) > 0
    assert all(p.grad is None for n, p in looped.named_parameters() if not n.startswith("halting."))


@pytest.mark.parametrize("objective", ["oracle", "act", "pondernet"])
def test_the_offline_sweep_gives_the_loss_and_gradient_of_a_forward(tiny, objective):
    """The halting stage on the oracle sweep (App. E's precomputed oracle) is the online objective, not an approximation."""
    model, tok = tiny
    looped = retrofit(model, RetrofitConfig(Block(2, 4), reentry="inject", memory=True, halting=True)).eval()
    for p in looped.parameters():
        p.requires_grad_(False)
    with torch.no_grad():
        looped.halting.proj.weight.normal_(0, 0.05)
    looped.halting.proj.weight.requires_grad_(True)
    rows = [chase_row(4, d, i, 0, tokenizer=tok, split="train") for i, d in enumerate([1, 2, 3, 2, 3])]
    cfg = HaltingTable(objective=objective, oracle_max=4, margin=0.01, depth_cost=0.0, probe_depths=[1, 2, 4, 6],
               act_cost=0.01, ponder_lambda=0.2, ponder_kl=0.01)
    online, _ = halting_loss(looped, make_batch(rows, tok), cfg)
    online.backward()
    g_online = looped.halting.proj.weight.grad.clone()
    looped.halting.proj.weight.grad = None
    losses, z = sweep(looped, [make_batch(rows[:2], tok), make_batch(rows[2:], tok)], 4)
    assert losses.shape == (5, 4) and z.shape == (5, 4, looped.config.hidden_size)
    cached, _ = halting_objective(losses, halting_probs(looped, z), cfg)
    cached.backward()
    assert float(cached.detach()) == pytest.approx(float(online.detach()), rel=1e-5)
    assert torch.allclose(looped.halting.proj.weight.grad, g_online, rtol=1e-4, atol=1e-7)


def test_recurtrace_stages_sampled_then_halting(write_recipe, tmp_path):
    recipe = write_recipe(model={"block": "2:4", "reentry": "inject", "memory": True, "halting": True},
                          train={"block": False}, sampler={"max": 4}, halting={"oracle_max": 4},
                          stages=[{"kind": "sampled", "depths": [1, 2, 3], "steps": 2},
                                  {"kind": "halting", "depths": [1, 2, 3], "steps": 2}])
    train(recipe, out=tmp_path / "rt", progress=False)
    stage1 = load_file(str(tmp_path / "rt" / "checkpoints" / "step_2" / "trainable.safetensors"))
    final = load_file(str(tmp_path / "rt" / "trainable.safetensors"))
    assert set(final) == set(stage1) and any(k.startswith("memory.") for k in final)
    for k in final:  # the halting stage moves the halting head and nothing else
        assert torch.equal(final[k], stage1[k]) != k.startswith("halting."), k


def test_the_halting_stage_on_the_oracle_sweep_moves_the_head_alone_and_logs_the_oracle(write_recipe, tmp_path):
    import json

    recipe = write_recipe(model={"block": "2:4", "reentry": "inject", "memory": True, "halting": True},
                          train={"block": False}, sampler={"max": 4}, halting={"oracle_max": 4, "sweep": 12},
                          stages=[{"kind": "sampled", "depths": [1, 2, 3], "steps": 2},
                                  {"kind": "halting", "depths": [1, 2, 3], "steps": 2}])
    train(recipe, out=tmp_path / "rt", progress=False)
    stage1 = load_file(str(tmp_path / "rt" / "checkpoints" / "step_2" / "trainable.safetensors"))
    final = load_file(str(tmp_path / "rt" / "trainable.safetensors"))
    for k in final:
        assert torch.equal(final[k], stage1[k]) != k.startswith("halting."), k
    metrics = [json.loads(line) for line in (tmp_path / "rt" / "metrics.jsonl").read_text().splitlines()]
    (sweep,) = [m for m in metrics if m["kind"] == "halting_sweep"]
    assert sweep["rows"] == 12 and sweep["step"] == 2 and len(sweep["continue_rate"]) == 4
    assert set(sweep["mean_target_by_depth"]) <= {"1", "2", "3"} and 1 <= sweep["mean_target"] <= 4


def test_heads_on_one_frozen_model_read_one_cached_sweep(write_recipe, tmp_path, monkeypatch):
    """A second halting-stage run on the same frozen model and rows reads the first's sweep from the cache and trains the
    same head as a run that computes it (cache off); a different pooling is another sweep."""
    import json

    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))

    def run(name, pooling="mean", cache="1"):
        monkeypatch.setenv("WORKBENCH_SWEEP_CACHE", cache)
        recipe = write_recipe(model={"block": "2:4", "reentry": "inject", "halting": True, "halting_pooling": pooling},
                              train={"block": False}, sampler={"max": 4}, halting={"oracle_max": 4, "sweep": 12},
                              stages=[{"kind": "sampled", "depths": [1, 2, 3], "steps": 2},
                                      {"kind": "halting", "depths": [1, 2, 3], "steps": 3}])
        train(recipe, out=tmp_path / name, progress=False)
        metrics = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        (sweep,) = [m for m in metrics if m["kind"] == "halting_sweep"]
        return sweep, load_file(str(tmp_path / name / "trainable.safetensors"))

    first, a = run("first")
    second, b = run("second")
    off, c = run("off", cache="0")
    last, _ = run("last", pooling="last")
    assert (first["cache"], second["cache"], off["cache"], last["cache"]) == ("written", "read", "off", "written")
    assert first["sweep_key"] == second["sweep_key"] != last["sweep_key"] and off["sweep_key"] is None
    assert len(list((tmp_path / "cache" / "halting-sweeps").glob("*.safetensors"))) == 2
    for k in a:   # the cached sweep trains exactly the head that the computed one trains
        assert torch.equal(a[k], b[k]) and torch.equal(a[k], c[k]), k
    for key in ("continue_rate", "mean_target", "mean_target_by_depth"):
        assert first[key] == second[key] == off[key], key
    assert any(not torch.equal(a[k], torch.zeros_like(a[k])) for k in a if k.startswith("halting."))
