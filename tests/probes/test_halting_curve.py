"""The compute-accuracy curve on real probe output: a tiny Stage 1 + halting-stage run, `workbench probe --only halting`,
and the Plotly figure, the report and the paper figure's numbers checked against the tables the probe wrote."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import tomli_w
import torch
from typer.testing import CliRunner

from tests.conftest import perturb
from workbench.cli import app
from workbench.errors import WorkbenchError
from workbench.loop.config import Block, RetrofitConfig
from workbench.loop.surgery import retrofit
from workbench.models import load_base
from workbench.plots import halting_figure
from workbench.plots.export import export_figures, load_spec
from workbench.plots.halting import CHOSEN, METHODS
from workbench.plots.registry import build
from workbench.plots.report import load_results
from workbench.probes.halting import LIKELIHOOD_TOL, choose, load_head
from workbench.runs import PROVENANCE, RECIPE, RETROFIT, TRAINABLE, base_sha256
from workbench.tasks import build_rows
from workbench.tasks.manifest import write_manifest
from workbench.train.rundir import retrofit_record, save_tensors, write_provenance
from workbench.train.trainer import train

BUDGET = 4


@pytest.fixture(scope="module")
def results(tmp_path_factory, tok):
    root = tmp_path_factory.mktemp("halting")
    recipe = {"name": "tiny-halting", "seed": 5, "guardrail": {"enabled": False},
              "model": {"base": "tiny-llama", "block": "2:4", "reentry": "inject", "memory": True, "halting": True,
                        "max_loops": BUDGET},
              "train": {"block": False}, "task": {"alphabet": 4}, "optim": {"lr": 1e-3, "batch_size": 8},
              "sampler": {"max": BUDGET}, "halting": {"oracle_max": BUDGET, "lr": 1e-2, "warmup_steps": 0},
              "eval": {"every": 1000, "per_depth": 2, "depths": [1, 2]}, "checkpoint": {"every": 1000},
              "stages": [{"kind": "sampled", "depths": [1, 2, 3], "steps": 3},
                         {"kind": "halting", "depths": [1, 2, 3], "steps": 6}]}
    (root / "recipe.toml").write_text(tomli_w.dumps(recipe))
    train(root / "recipe.toml", out=root / "run", progress=False)
    write_manifest(build_rows("chase", [1, 2, 3], 12, 31, alphabet=4, tokenizer=tok), root / "rows.jsonl")
    (root / "b.toml").write_text(tomli_w.dumps({"battery": {"manifest": str(root / "rows.jsonl"), "batch_size": 8},
                                                "probes": {"halting": {"loops": BUDGET, "floors": [2]}}}))
    out = root / "results"
    result = CliRunner().invoke(app, ["probe", "--checkpoint", str(root / "run"), "--battery", str(root / "b.toml"),
                                      "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    return out


def test_thresholds_are_chosen_on_rows_that_are_never_reported(results):
    tables = load_results(results)
    rows = tables["halting__rows"]
    split = rows.groupby("row_id")["split"].nunique()
    assert (split == 1).all()                                                 # a row is one or the other
    reported = rows[rows["split"] == "reported"]["row_id"].nunique()
    assert 0 < reported < rows["row_id"].nunique()
    curve = tables["halting"]
    assert (curve["n"] == reported).all()
    assert curve.groupby("method")["chosen"].sum().eq(1).all()                # one pick per method
    fixed = curve[curve["method"] == "fixed_k"]
    assert sorted(fixed["mean_loops"]) == [1.0, 2.0, 3.0, 4.0]
    oracle = curve[curve["method"] == "oracle"].iloc[0]
    assert oracle["accuracy"] >= fixed["accuracy"].max()                      # the upper bound
    diff = tables["halting__difficulty"]
    assert set(diff["group"]) == {"hard", "easy"} and diff.groupby("method")["n"].sum().eq(reported).all()
    # the row-by-row table of the picks is the curve's chosen points, on the reported rows only
    chosen = tables["halting__chosen"]
    picked = curve[curve["chosen"]].set_index("method")
    per = chosen.groupby("method").agg(n=("row_id", "size"), loops=("loops", "mean"), acc=("correct", "mean"))
    assert set(per.index) == set(picked.index) and (per["n"] == reported).all()
    assert np.allclose(per["loops"], picked.loc[per.index, "mean_loops"])
    assert np.allclose(per["acc"], picked.loc[per.index, "accuracy"])
    assert set(chosen["row_id"]) == set(rows[rows["split"] == "reported"]["row_id"])


def test_a_floor_adds_every_threshold_method_again_and_no_row_stops_below_it(results):
    tables = load_results(results)
    curve, chosen = tables["halting"], tables["halting__chosen"]
    floored = sorted(m for m in set(curve["method"]) if "+floor" in m)
    assert floored == ["confidence+floor2", "head+floor2"]
    assert (curve[curve["method"].isin(floored)]["t_min"] == 2).all()
    assert (curve[~curve["method"].isin(floored)]["t_min"] == 1).all()
    assert (chosen[chosen["method"].isin(floored)]["loops"] >= 2).all()
    assert (chosen[chosen["method"] == "head"]["loops"] >= 1).all()
    # the threshold methods were chosen by held-out likelihood, the best fixed depth by accuracy
    assert set(curve[curve["method"] == "fixed_k"]["select"]) == {"accuracy"}
    assert set(curve[curve["method"] != "fixed_k"]["select"]) == {"likelihood"}
    for method, g in curve[curve["method"] != "fixed_k"].groupby("method"):
        pick = g[g["chosen"]].iloc[0]
        near = g[g["cal_loglik"] >= g["cal_loglik"].max() - LIKELIHOOD_TOL]
        assert pick["cal_loops"] == near["cal_loops"].min(), method


def test_likelihood_takes_the_fewest_loops_that_lose_no_likelihood_and_accuracy_the_most_accurate():
    points = pd.DataFrame({"cal_accuracy": [0.50, 0.70, 0.72, 0.72], "cal_loglik": [-2.0, -0.505, -0.50, -0.50],
                           "cal_loops": [1.0, 2.5, 3.0, 4.0]}, index=[10, 11, 12, 13])
    assert choose(points, "likelihood") == 11                   # 0.005 nats below the best: within the tolerance
    assert choose(points, "accuracy") == 12                     # best accuracy, then fewer loops
    points.loc[11, "cal_loglik"] = -0.50 - 2 * LIKELIHOOD_TOL   # now it loses likelihood
    assert choose(points, "likelihood") == 12


def test_real_early_exit_matches_the_one_pass_reading_and_counts_its_work(results):
    adaptive = load_results(results)["halting__adaptive"].set_index("policy")
    head = adaptive.loc["head"]
    assert head["agree"] == 1.0                                               # rows stop where the head says
    assert head["row_loops"] <= head["rows"] * BUDGET
    assert adaptive.loc[f"fixed_{BUDGET}", "row_loops"] == head["rows"] * BUDGET
    curve = load_results(results)["halting"]
    chosen = curve[(curve["method"] == "head") & curve["chosen"]].iloc[0]
    assert head["tau"] == chosen["threshold"]
    assert head["row_loops"] == pytest.approx(chosen["mean_loops"] * head["rows"])
    assert head["accuracy"] == pytest.approx(chosen["accuracy"])


def test_the_figure_draws_exactly_what_the_probe_wrote(results):
    tables = load_results(results)
    curve, difficulty = tables["halting"], tables["halting__difficulty"]
    fig = build("halting", halting_figure, tables)
    lines = {t.name: t for t in fig.data if t.type == "scatter"}
    for method, g in curve.groupby("method"):
        trace = lines[METHODS.get(method, method)]
        g = g.sort_values(["mean_loops", "accuracy"])
        np.testing.assert_array_equal(np.asarray(trace.x, dtype=float), g["mean_loops"].to_numpy())
        np.testing.assert_array_equal(np.asarray(trace.y, dtype=float), g["accuracy"].to_numpy())
    picked = curve[curve["chosen"]]
    assert list(lines[CHOSEN].customdata) == list(picked["method"])
    np.testing.assert_array_equal(np.asarray(lines[CHOSEN].y, dtype=float), picked["accuracy"].to_numpy())
    best = int(picked[picked["method"] == "fixed_k"]["mean_loops"].iloc[0])
    assert fig.layout.annotations[-1].text == f"best fixed depth k = {best}"
    for bar in (t for t in fig.data if t.type == "bar"):
        group = bar.name.split()[0]
        sub = difficulty[difficulty["group"] == group]
        assert list(bar.x) == [METHODS.get(m, m) for m in sub["method"]]
        np.testing.assert_array_equal(np.asarray(bar.y, dtype=float), sub["mean_loops"].to_numpy())
    assert len([t for t in fig.data if t.type == "bar"]) == 2


def test_the_report_and_the_paper_figure_carry_the_curve(results, tmp_path):
    html = (results / "report.html").read_text()
    assert "id='halting'" in html and "halting head" in json.dumps(json.loads(
        (results / "summary.json").read_text())["probes"]["halting"]["headline"])
    spec, dpi = load_spec("figures/paper.toml")
    done = export_figures([results], fmt="html", out=tmp_path, spec=[s for s in spec if s.name == "halting"], dpi=dpi)
    csv = pd.read_csv(next(p for p in done.written if p.suffix == ".csv"))
    curve = load_results(results)["halting"]
    for method, g in curve.groupby("method"):
        shown = csv[csv["trace"] == METHODS.get(method, method)]
        assert sorted(zip(shown["x"].astype(float), shown["y"])) == sorted(zip(g["mean_loops"], g["accuracy"]))


def _head_run(looped, run_dir, pooling: str = "mean"):
    """A finished halting-stage run directory holding an ACT head for `looped` (its files and their provenance)."""
    run_dir.mkdir(exist_ok=True)
    groups = ["reentry", "memory", "halting"]
    state = {n: p.detach().clone().contiguous() for n, p in looped.named_parameters() if n.startswith(
        tuple(f"{g}." for g in groups))}
    state["halting.proj.bias"] = state["halting.proj.bias"] + 1.0          # a head trained with ACT on this model
    save_tensors(run_dir / TRAINABLE, state)
    (run_dir / RECIPE).write_text('[halting]\nobjective = "act"\n')
    record = retrofit_record(looped, "tiny-llama", base_sha256(looped.base), groups)
    record["settings"]["halting_pooling"] = pooling
    (run_dir / RETROFIT).write_text(json.dumps(record))
    write_provenance(run_dir, manifests={}, seeds={})
    return state


def test_a_head_from_another_stage1_model_is_refused_and_a_matching_one_loads(tmp_path):
    looped = retrofit(load_base("tiny-llama")[0], RetrofitConfig(Block(2, 4), reentry="inject", memory=True, halting=True,
                                                            max_loops=3))
    state = _head_run(looped, tmp_path / "act")
    head, objective = load_head(looped, tmp_path / "act")
    assert objective == "act" and torch.equal(head.proj.bias, state["halting.proj.bias"])
    assert not torch.equal(head.proj.bias, looped.halting.proj.bias)       # a copy: the model's own head is kept
    assert head.pooling == "mean"
    _head_run(looped, tmp_path / "last", pooling="last")
    head, _ = load_head(looped, tmp_path / "last")                         # a head that pools the last token
    assert head.pooling == "last" and looped.halting.pooling == "mean"
    perturb(looped.memory, 0.01)
    with pytest.raises(WorkbenchError, match=r"trained on another Stage 1 model \(memory\..* differs\)"):
        load_head(looped, tmp_path / "act")


def test_a_tampered_head_is_refused_by_the_run_directory_checks(tmp_path):
    """A head's tensors are read as `load_run` reads a run's: through provenance.json's hashes."""
    looped = retrofit(load_base("tiny-llama")[0], RetrofitConfig(Block(2, 4), reentry="inject", memory=True, halting=True,
                                                            max_loops=3))
    state = _head_run(looped, tmp_path)
    state["halting.proj.bias"] = state["halting.proj.bias"] * 100.0       # edited after the run finished
    save_tensors(tmp_path / TRAINABLE, state)
    with pytest.raises(WorkbenchError) as err:
        load_head(looped, tmp_path)
    assert str(err.value) == f"{tmp_path / TRAINABLE}: SHA-256 differs from the one recorded in {PROVENANCE}"
    (tmp_path / PROVENANCE).unlink()
    with pytest.raises(WorkbenchError, match=f"is not a finished run directory: {PROVENANCE} is missing"):
        load_head(looped, tmp_path)


@pytest.mark.parametrize("options, says", [({"select": "loss"}, "select = 'loss' is not one of likelihood, accuracy"),
                                           ({"floors": [9]}, "must lie in 1..3"),
                                           ({"t_min": 0}, "must lie in 1..3")])
def test_a_bad_floor_or_selector_is_one_line(options, says, tok):
    from workbench.probes import halting
    looped = retrofit(load_base("tiny-llama")[0], RetrofitConfig(Block(2, 4), reentry="inject", halting=True, max_loops=3))
    rows = build_rows("chase", [1, 2], 4, 3, alphabet=4, tokenizer=tok)
    with pytest.raises(WorkbenchError, match=f"^halting: .*{says}"):
        halting.run(looped, tok, rows, loops=3, **options)
