"""`[train] compile = true` compiles every decoder layer in place: the run trains, saves the same tensor names and
follows the eager run's losses to float tolerance."""

from __future__ import annotations

import json

import pytest
from safetensors.torch import load_file

from workbench.errors import WorkbenchError
from workbench.train import compiling
from workbench.train.trainer import train


@pytest.mark.slow
def test_a_compiled_run_matches_the_eager_run(write_recipe, tmp_path):
    losses = {}
    for flag in (False, True):
        path = write_recipe(f"r{flag}.toml", train={"compile": flag},
                            stages=[{"depths": [1, 2], "steps": 3}])
        train(path, out=tmp_path / str(flag), progress=False)
        lines = [json.loads(x) for x in (tmp_path / str(flag) / "metrics.jsonl").read_text().splitlines()]
        losses[flag] = [r["loss"] for r in lines if r["kind"] == "train"]
    assert losses[True] == pytest.approx(losses[False], rel=1e-4, abs=1e-5)
    eager, compiled = (load_file(tmp_path / str(f) / "trainable.safetensors") for f in (False, True))
    assert eager.keys() == compiled.keys()


@pytest.mark.slow
def test_the_whole_run_benchmark_times_both_processes_and_reads_their_runs(write_recipe, tmp_path, monkeypatch):
    """benchmarks/compile_whole_run.py end to end on a tiny recipe: two whole `workbench train` processes, each
    compiled run in its own empty cache, the record on disk, and the rule read from the two run directories."""
    import importlib
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "benchmarks"))
    cw = importlib.import_module("compile_whole_run")
    # depth 1 only: the compiled run still recompiles (a new sequence length, dynamic=False) and evaluates; loop 2
    # compiled against eager is test_a_compiled_run_matches_the_eager_run's, and its graphs cost 15 CPU-s here
    recipe = write_recipe("cw.toml", stages=[{"depths": [1], "steps": 3}], eval={"depths": [1]})
    rec = cw.main(["--recipe", recipe, "--rounds", "1", "--work", str(tmp_path / "runs"), "--out", str(tmp_path)])
    assert json.loads((tmp_path / "compile_whole_run.json").read_text())["results"] == json.loads(json.dumps(rec["results"]))
    r = rec["results"]["rounds"][0]
    assert r["order"] == ["eager", "compiled"]
    assert r["eager"]["steps"] == r["compiled"]["steps"] == 3
    assert r["eager"]["recompilations"] == 0 and r["compiled"]["recompilations"] >= 1
    assert r["compiled"]["losses"] == pytest.approx(r["eager"]["losses"], rel=1e-4, abs=1e-5)
    assert any((tmp_path / "runs" / "r1-compiled-inductor-cache").rglob("*"))   # compiled into its own cache
    v = rec["results"]["verdict"]
    assert v["checks"]["loss_curve"] and v["checks"]["held_out"]
    assert v["speedup"]["values"] == [round(r["eager"]["wall_s"] / r["compiled"]["wall_s"], 6)]


def test_reaching_the_recompile_limit_stops_the_run_instead_of_running_eager(monkeypatch):
    """torch's own behaviour at its recompile limit is to run the rest eager with a log line; a compiled run
    raises one line instead, and torch's settings are its own again afterwards."""
    import torch
    import torch._dynamo

    monkeypatch.setattr(compiling, "COMPILE_RECOMPILE_LIMIT", 2)
    torch._dynamo.reset()
    double = torch.compile(lambda x: x * 2, backend="eager", dynamic=False)
    before = torch._dynamo.config.recompile_limit
    with pytest.raises(WorkbenchError, match="recompiled the decoder layers' forward 2 times") as e:
        with compiling.compile_limits(True):
            for n in (1, 2):                      # the first compile and one recompilation: inside the limit
                assert double(torch.ones(n)).sum() == 2 * n
            double(torch.ones(3))
    assert "\n" not in str(e.value)
    assert torch._dynamo.config.recompile_limit == before and not torch._dynamo.config.fail_on_recompile_limit_hit
    with compiling.compile_limits(False):           # eager runs: nothing changed
        assert torch._dynamo.config.recompile_limit == before
    torch._dynamo.reset()
