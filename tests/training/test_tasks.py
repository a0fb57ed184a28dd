"""Every RecurTrace task through the chase's recipes, reader and probes; the halting stage trains the halting head alone."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import tomli_w
from typer.testing import CliRunner

from workbench.cli import app
from workbench.errors import WorkbenchError
from workbench.tasks import build_rows
from workbench.tasks.manifest import write_manifest
from workbench.train.trainer import train

RECURTRACE = dict(model={"block": "2:4", "reentry": "inject", "memory": True, "halting": True, "max_loops": 4},
                  train={"block": False}, sampler={"max": 3}, halting={"oracle_max": 3})


@pytest.fixture(scope="module")
def tok():
    from workbench.models import load_tokenizer

    return load_tokenizer("smollm2-135m-instruct")


def _losses(run, stage: str) -> list[float]:
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [x["loss"] for x in lines if x["kind"] == "train" and x["stage"] == stage]


@pytest.mark.slow  # an end-to-end run: trains, then `workbench probe`
@pytest.mark.parametrize("task", ["phop", "state", "arith"])
def test_each_recurtrace_task_trains_and_workbench_probe_reads_it(write_recipe, tmp_path, tok, task):
    recipe = write_recipe(**RECURTRACE, task={"name": task, **({"alphabet": 6} if task == "phop" else {})},
                          eval={"depths": [2, 3], "per_depth": 2},
                          stages=[{"name": "stage-1", "kind": "sampled", "depths": [2, 3], "steps": 2},
                                  {"name": "stage-2", "kind": "halting", "depths": [2, 3], "steps": 2}])
    summary = train(recipe, out=tmp_path / "run", progress=False)
    assert summary["finished"] and set(summary["after"]) == {"2", "3"}
    # symbol tasks are graded x_t at t <= d; answer tasks the whole answer at every loop 1..sampler.max
    assert set(summary["after"]["3"]) == ({"1", "2", "3"})
    assert len(_losses(tmp_path / "run", "stage-1")) == 2 and len(_losses(tmp_path / "run", "stage-2")) == 2
    prov = json.loads((tmp_path / "run" / "provenance.json").read_text())
    assert prov["stage2_frozen"] is True and prov["manifests"]["train"]["generator"].endswith(f"('{task}')")
    manifest = tmp_path / "rows.jsonl"
    options = {"tokenizer": tok, "alphabet": 6} if task == "phop" else {}
    write_manifest(build_rows(task, [2, 3], 3, 99, **options), manifest)
    battery = tmp_path / "b.toml"
    battery.write_text(tomli_w.dumps({"battery": {"manifest": str(manifest), "batch_size": 4},
                                      "probes": {"loop_accuracy": {"loops": 3}, "halting": {"loops": 3},
                                                 "depth_matrix": {}}}))
    result = CliRunner().invoke(app, ["probe", "--checkpoint", str(tmp_path / "run"), "--battery", str(battery),
                                      "--out", str(tmp_path / "results"), "--json"])
    assert result.exit_code == 0, result.output
    saved = json.loads((tmp_path / "results" / "summary.json").read_text())
    loop_acc = pd.read_parquet(tmp_path / "results" / "loop_accuracy.parquet")
    assert len(loop_acc) == 6 * 3 and set(loop_acc["loop"]) == {1, 2, 3}
    assert saved["probes"]["loop_accuracy"]["rows"] == 6
    assert set(pd.read_parquet(tmp_path / "results" / "halting.parquet")["method"]) >= {"fixed_k", "oracle", "head"}
    if task == "phop":   # p-hop answers are single-token codes: the depth matrix reads them like the chase
        assert saved["probes"]["depth_matrix"]["final_total"] == 6
    else:                # six register values, an integer: no per-loop intermediate labels to grade
        assert saved["probes"]["depth_matrix"]["status"] == "not_applicable"
        assert "needs one-token answers" in saved["probes"]["depth_matrix"]["reason"]


def test_state_query_trains_with_the_chase_keepers_chain_stage_and_reads_like_the_chase(write_recipe, tmp_path):
    # one register asked: a one-token answer with a bare-digit candidate set (answer_prefix ""), so the chain
    # stage supervises every loop and the depth matrix grades x_t at t <= d, as for the chase
    recipe = write_recipe(model={"memory": True}, task={"name": "state_query"}, eval={"depths": [1, 2], "per_depth": 2},
                          stages=[{"name": "two-step", "kind": "chain", "depths": [1, 2], "steps": 2}])
    summary = train(recipe, out=tmp_path / "run", progress=False)
    assert summary["finished"] and summary["after"]["2"].keys() == {"1", "2"}
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train_lines = [x for x in lines if x["kind"] == "train"]
    assert len(train_lines) == 2 and all(len(x["loop_ce"]) == x["loops"] for x in train_lines)
    # four candidates, the digits' bare tokens (with the default " " prefix " 0" is two tokens and the batch is
    # refused): an untrained first-step loss near log 4
    assert 0.5 < train_lines[0]["loop_ce"][0] < 3.0
    manifest = tmp_path / "rows.jsonl"
    write_manifest(build_rows("state_query", [1, 2, 3], 2, 99), manifest)
    battery = tmp_path / "b.toml"
    battery.write_text(tomli_w.dumps({"battery": {"manifest": str(manifest), "batch_size": 4},
                                      "probes": {"loop_accuracy": {"loops": 3}, "depth_matrix": {}}}))
    result = CliRunner().invoke(app, ["probe", "--checkpoint", str(tmp_path / "run"), "--battery", str(battery),
                                      "--out", str(tmp_path / "results"), "--json"])
    assert result.exit_code == 0, result.output
    saved = json.loads((tmp_path / "results" / "summary.json").read_text())
    assert saved["probes"]["depth_matrix"]["final_total"] == 6 and saved["probes"]["loop_accuracy"]["rows"] == 6


@pytest.mark.parametrize("tables,match", [
    ({"task": {"name": "state"}, "stages": [{"kind": "chain", "depths": [2]}]},
     "stage 0 is a chain stage.*task 'state' answers in several tokens: use kind 'sampled'"),
    ({"task": {"name": "arith", "surface": "relay"}}, "task.name = 'arith' takes no task.surface"),
    ({"task": {"name": "phop", "alphabet": 40}}, "'task.alphabet' = 40 is out of range for phop; accepted: 2..32"),
    ({"task": {"name": "sort"}}, "'task.name' = 'sort' is not accepted; accepted: chase, phop, state, state_query, arith"),
])
def test_task_recipe_errors_are_one_line(write_recipe, tables, match):
    from workbench.train.recipe import Recipe

    with pytest.raises(WorkbenchError, match=match) as err:
        Recipe.from_toml(write_recipe(**tables))
    assert "\n" not in str(err.value)


@pytest.mark.slow  # an end-to-end run: Stage 1 then the halting stage
@pytest.mark.timeout(900)
@pytest.mark.parametrize("objective", ["oracle", "act", "pondernet"])
def test_the_halting_stage_trains_the_head_on_a_frozen_stage1_model(write_recipe, tmp_path, objective):
    recipe = write_recipe(**{**RECURTRACE, "halting": {"oracle_max": 4, "objective": objective, "lr": 3e-2,
                                                       "warmup_steps": 0, "probe_depths": [1, 2, 3, 4]},
                             "sampler": {"max": 4}}, task={"name": "arith"}, optim={"lr": 1e-3, "batch_size": 8},
                          eval={"depths": [2], "per_depth": 2}, checkpoint={"every": 1000},
                          stages=[{"name": "stage-1", "kind": "sampled", "depths": [2, 3], "steps": 3},
                                  {"name": "stage-2", "kind": "halting", "depths": [2, 3], "steps": 40}])
    train(recipe, out=tmp_path / "run", progress=False)
    run = tmp_path / "run"
    losses = _losses(run, "stage-2")
    first, last = sum(losses[:8]) / 8, sum(losses[-8:]) / 8
    assert last < first * 0.9, (objective, first, last)
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    moved = [r["move_rms"] for r in records if r["kind"] == "train" and r["stage"] == "stage-2"]
    assert all(set(m) == {"halting"} and m["halting"] > 0 for m in moved)   # realized movement: the head alone
    assert json.loads((run / "provenance.json").read_text())["stage2_frozen"] is True


def test_the_halting_stage_refuses_a_model_whose_stage1_tensors_still_take_gradient(write_recipe, tmp_path, monkeypatch):
    import workbench.train.stages.halting as halting

    def leaky(looped, groups, cfg):
        looped.reentry.alpha.requires_grad_(True)        # a bug that would let the halting stage move the injection
        return make(looped, groups, cfg)

    make = halting.make_optimizer
    monkeypatch.setattr(halting, "make_optimizer", leaky)
    recipe = write_recipe(**RECURTRACE, task={"name": "state"}, eval={"depths": [2], "per_depth": 1},
                          stages=[{"kind": "sampled", "depths": [2], "steps": 1},
                                  {"kind": "halting", "depths": [2], "steps": 1}])
    with pytest.raises(WorkbenchError, match="train the halting head alone; reentry.alpha takes gradient"):
        train(recipe, out=tmp_path / "run", progress=False)
