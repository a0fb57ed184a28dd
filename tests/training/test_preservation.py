"""The guardrail as a hard stop, continued training (init_from), the preservation KL and bf16 training."""

from __future__ import annotations

import json

import pytest
import torch

from workbench.errors import WorkbenchError
from workbench.loop.config import Block, RetrofitConfig
from workbench.run_tensors import read_tensors
from workbench.runs import CHECKPOINTS, load_run, verify_files
from workbench.tasks.guardrail import GUARDRAIL_VERSION, guardrail_rows
from workbench.tasks.rehearsal import (
    FAMILIES,
    NUMBER_FAMILIES,
    check_held_out,
    corpus_lines,
    pattern_text,
    rehearsal_batch,
    rehearsal_texts,
)
from workbench.train.losses import adapter_disabled, kl_to_base
from workbench.train.rundir import checkpoints
from workbench.train.trainer import train


def _metrics(run_dir, kind):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


# ----------------------------------------------------------------------------- held out
def test_rehearsal_never_touches_the_guardrail_template():
    """Every text the rehearsal can produce is free of ' + ', ' - ' and '='; every guardrail row has them."""
    texts = [pattern_text(i, seed, families=f) for i in range(400) for seed in (0, 20260702)
             for f in (FAMILIES, NUMBER_FAMILIES)] + list(corpus_lines())
    texts += rehearsal_texts(step=7, seed=3, n=16)
    for text in texts:
        check_held_out(text)
    prompts = {row["prompt"] for row in guardrail_rows()}
    questions = {row["start"] for row in guardrail_rows()}
    assert not prompts & set(texts) and not any(q in t for q in questions for t in texts)
    for row in guardrail_rows():
        with pytest.raises(WorkbenchError, match="guardrail"):
            check_held_out(row["prompt"])
    assert all(GUARDRAIL_VERSION not in t for t in texts)
    assert len(FAMILIES) >= 6 and len(corpus_lines()) >= 100


def test_rehearsal_batch_reads_just_before_each_pattern_answer():
    from workbench.models import load_tokenizer

    tok = load_tokenizer()
    text = "hot -> cold\nbig -> small\nup -> down"
    batch = rehearsal_batch(tok, [text, corpus_lines()[0]], positions_per_row=3)
    ids, pos = batch["input_ids"], batch["positions"]
    nexts = [tok.decode(ids[0, p + 1]).strip() for p in pos[0]]
    assert nexts == ["cold", "small", "down"]
    assert [tok.decode(ids[0, p]).strip() for p in pos[0]] == ["->"] * 3
    assert (batch["attention_mask"].gather(1, pos) == 1).all()  # never a padding position


# ----------------------------------------------------------------------------- the KL term
def test_kl_to_base_is_zero_at_init_and_positive_once_the_adapter_moves(tiny_lora):
    looped, tok = tiny_lora
    batch = rehearsal_batch(tok, rehearsal_texts(0, 0, 4), positions_per_row=4)
    teacher = lambda: adapter_disabled(looped)  # noqa: E731
    assert float(kl_to_base(looped, batch, teacher).detach()) == pytest.approx(0.0, abs=1e-7)
    with torch.no_grad():
        for name, p in looped.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    kl = kl_to_base(looped, batch, teacher)
    assert float(kl.detach()) > 1e-3
    kl.backward()  # the gradient reaches the adapter
    grads = [p.grad for n, p in looped.named_parameters() if "lora_B" in n and p.requires_grad]
    assert grads and all(g is not None and g.abs().sum() > 0 for g in grads)


@pytest.fixture
def tiny_lora():
    from workbench.loop.surgery import attach_lora, retrofit
    from workbench.models import load_base

    torch.manual_seed(0)
    base, tok = load_base("tiny-llama")
    looped = retrofit(base, RetrofitConfig(Block(1, 3), max_loops=3))
    attach_lora(looped, r=4, alpha=8)
    return looped, tok


# ----------------------------------------------------------------------------- the guardrail in training
def test_a_run_past_the_guardrail_stops_and_yields_no_keeper(write_recipe, tmp_path):
    """A tiny run at a rate that wrecks loop 1, guardrail every step with no allowed drop: it stops."""
    recipe = write_recipe(optim={"lr": 0.05}, guardrail={"enabled": True, "max_drop": 0.0, "every": 1},
                          checkpoint={"every": 1, "keep": 1})
    out = tmp_path / "run"
    summary = train(recipe, out=out, progress=False)
    assert summary["status"] == "stopped_by_guardrail" and not summary["finished"]
    readings = _metrics(out, "guardrail")
    assert readings[0]["step"] == 0 and readings[0]["passed"] and readings[0]["drop_points"] == 0.0
    assert not readings[-1]["passed"] and readings[-1]["correct"] < readings[0]["base"]
    assert all(r["passed"] for r in readings[:-1])
    stop = readings[-1]["step"]
    prov = json.loads((out / "provenance.json").read_text())
    assert prov["status"] == "stopped_by_guardrail" and prov["stopped_at_step"] == stop
    last = prov["last_passing_checkpoint"]
    kept = checkpoints(out)
    assert all(s < stop for s in kept)
    if readings[-2]["step"] > 0:
        assert last == f"checkpoints/step_{readings[-2]['step']}" and (out / last).is_dir()
    else:
        assert last == "the initial state (step 0)" and kept == []
    assert not (out / "trainable.safetensors").exists()
    with pytest.raises(WorkbenchError, match="stopped by the capability guardrail"):
        verify_files(out)
    with pytest.raises(WorkbenchError, match="stopped by the capability guardrail"):
        load_run(out)


def test_the_cli_exit_status_says_stopped_by_guardrail(write_recipe, tmp_path):
    from typer.testing import CliRunner

    from workbench.cli import app

    recipe = write_recipe(optim={"lr": 0.05}, guardrail={"enabled": True, "max_drop": 0.0, "every": 1})
    result = CliRunner().invoke(app, ["train", recipe, "--out", str(tmp_path / "run")])
    assert result.exit_code == 3, result.output
    assert "stopped by the capability guardrail" in result.output


# ----------------------------------------------------------------------------- init_from
def test_init_from_continues_the_parent_and_records_lineage(finished_run, write_recipe, tmp_path):
    parent_eval = _metrics(finished_run, "eval")[-1]["acc"]
    recipe = write_recipe(init_from=str(finished_run), optim={"lr": 1e-9},
                          stages=[{"name": "more", "depths": [1, 2], "steps": 2}])
    out = tmp_path / "child"
    train(recipe, out=out, progress=False)
    assert _metrics(out, "eval")[0]["acc"] == parent_eval  # step 0 of the child is the parent
    prov = json.loads((out / "provenance.json").read_text())
    parent_prov = json.loads((finished_run / "provenance.json").read_text())
    (p,) = prov["lineage"]["parents"]
    assert p["trainable_sha256"] == parent_prov["files"]["trainable.safetensors"]
    assert p["name"] == "tiny" and p["run"] == str(finished_run)


@pytest.mark.parametrize("change, message", [
    (lambda run: run / "missing", "is not a directory"),
    (lambda run: run / "metrics.jsonl", "is not a directory"),
])
def test_init_from_refuses_bad_parents(finished_run, write_recipe, tmp_path, change, message):
    recipe = write_recipe(init_from=str(change(finished_run)))
    with pytest.raises(WorkbenchError, match=message):
        train(recipe, out=tmp_path / "child", progress=False)


def test_init_from_refuses_a_parent_with_another_split(finished_run, write_recipe, tmp_path):
    recipe = write_recipe(init_from=str(finished_run), model={"block": "1:3"})
    with pytest.raises(WorkbenchError, match="another retrofit .*block"):
        train(recipe, out=tmp_path / "child", progress=False)


def test_init_from_refuses_an_edited_parent(finished_run, write_recipe, tmp_path):
    import shutil

    copy = tmp_path / "parent"
    shutil.copytree(finished_run, copy)
    with open(copy / "trainable.safetensors", "r+b") as f:
        f.seek(-4, 2)
        f.write(b"\x00\x01\x02\x03")
    recipe = write_recipe(init_from=str(copy))
    with pytest.raises(WorkbenchError, match="SHA-256 differs"):
        train(recipe, out=tmp_path / "child", progress=False)


def test_the_halting_stage_adds_a_halting_head_to_a_parent_trained_without_one(finished_run, write_recipe, tmp_path):
    """The halting stage (RecurTrace's Stage 2) on a keeper: the parent's tensors load strictly, only the new head moves."""
    recipe = write_recipe(init_from=str(finished_run), model={"halting": True, "halting_pooling": "last"},
                          halting={"oracle_max": 3},
                          stages=[{"name": "halt", "kind": "halting", "depths": [1, 2], "steps": 2}])
    out = tmp_path / "halt"
    train(recipe, out=out, progress=False)
    parent, _ = read_tensors(finished_run / "trainable.safetensors")
    child, _ = read_tensors(out / "trainable.safetensors")   # the delta file resolved through its parent
    assert set(child) - set(parent) == {"halting.proj.weight", "halting.proj.bias"}
    assert all(torch.equal(child[k], parent[k]) for k in parent)
    (p,) = json.loads((out / "provenance.json").read_text())["lineage"]["parents"]
    assert p["halting_head_added"] is True
    # a main-stage run may not change the retrofit: the head must come with the halting stage alone
    recipe = write_recipe("main.toml", init_from=str(finished_run), model={"halting": True},
                          stages=[{"name": "more", "depths": [1, 2], "steps": 1}])
    with pytest.raises(WorkbenchError, match="another retrofit .*halting"):
        train(recipe, out=tmp_path / "main", progress=False)


def test_a_child_adds_loop_codes_to_a_parent_without_them(finished_run, write_recipe, tmp_path):
    """The park-with-codes recipe's mechanism: the parent loads strictly, the codes start at 0 and move."""
    parent_eval = _metrics(finished_run, "eval")[-1]["acc"]
    recipe = write_recipe(init_from=str(finished_run), model={"loop_codes": True},
                          stages=[{"name": "more", "depths": [1, 2], "steps": 2}])
    out = tmp_path / "codes"
    train(recipe, out=out, progress=False)
    assert _metrics(out, "eval")[0]["acc"] == parent_eval       # zero codes: step 0 of the child is the parent
    parent, _ = read_tensors(finished_run / "trainable.safetensors")
    child, _ = read_tensors(out / "trainable.safetensors")
    assert set(child) - set(parent) == {"loop_codes.codes"}
    steps = _metrics(out, "train")
    assert all(s["move_rms"]["loop_codes"] > 0 for s in steps if s["loops"] >= 2)   # its own group, and it moves
    assert steps[0]["lr"]["loop_codes"] == pytest.approx(steps[0]["lr"]["reentry"] * 10)
    (p,) = json.loads((out / "provenance.json").read_text())["lineage"]["parents"]
    assert p["loop_codes_added"] is True
    settings = json.loads((out / "retrofit.json").read_text())["settings"]
    assert settings["loop_codes"] is True
    assert "loop_codes" not in json.loads((finished_run / "retrofit.json").read_text())["settings"]
    looped, _, _ = load_run(out)                                   # and the child reloads strictly
    assert torch.equal(looped.loop_codes.codes.detach().float(), child["loop_codes.codes"].float())


# ----------------------------------------------------------------------------- bf16
def test_bf16_training_keeps_trainables_fp32_and_records_the_precision(write_recipe, tmp_path):
    from workbench.precision import detect_hardware

    recipe = write_recipe(train={"block": False, "precision": "bf16"}, lora={"enabled": True, "r": 4},
                          preserve={"kl_weight": 1.0, "rows": 2, "positions": 2})
    out = tmp_path / "run"
    train(recipe, out=out, progress=False)
    prov = json.loads((out / "provenance.json").read_text())
    used = "bf16" if detect_hardware().bf16_supported else "fp32"
    assert prov["precision"]["requested"] == "bf16" and prov["precision"]["used"] == used
    assert prov["base_unchanged"] is True
    looped, _, _ = load_run(out)  # trained tensors were saved in fp32 and load strictly
    assert all(p.dtype == torch.float32 for p in looped.parameters())
    steps = _metrics(out, "train")
    assert all(s["kl_base"] >= 0 for s in steps) and any(s["kl_base"] > 0 for s in steps)
    assert checkpoints(out) and (out / CHECKPOINTS).is_dir()
