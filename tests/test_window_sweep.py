"""Block selection's window sweep (`select-block --window-sweep`, `workbench.selection.window_sweep`).

What a user relies on: the candidates (Stage 1's pick always among them, a late control, their own windows),
one short recipe that differs only in the window, a ranking read that equals the training loss's own
per-loop CE, the ranking rule (lower held-out CE first, a stopped run last, margin and seed agreement),
a sweep that resumes without retraining what finished, bad input refused with nothing written, and the old names
(`--stage2 train`, a sweep's stage2.json) still read, each with a one-line note.
"""

from __future__ import annotations

import json
from pathlib import Path

import click
import numpy as np
import pytest
import tomli_w
import torch

from tests.test_cli_errors import assert_clean_error, invoke
from tests.training.conftest import TINY_RECIPE, merge
from workbench.defaults import OLD_SWEEP_TABLE
from workbench.errors import WorkbenchError
from workbench.loop.config import Block, RetrofitConfig
from workbench.selection import window_sweep as ws

SELECTION = {"model": "m", "n_layers": 30, "prelude_end": 2, "coda_start": 28, "window": 6, "recommended": [2, 8],
             "windows": [{"block": [2, 8], "damage": 0.16}, {"block": [22, 28], "damage": 0.21},
                         {"block": [14, 20], "damage": 0.35}, {"block": [8, 14], "damage": 0.50}]}


# ----------------------------------------------------------------------------- candidates
def test_candidates_spread_over_the_span_with_stage1s_pick_a_late_control_and_given_windows():
    got = [(c.name, c.role) for c in ws.candidates(SELECTION, 4, ["12:24", "2:8"])]
    assert got == [("2:8", "span"), ("9:15", "span"), ("15:21", "span"), ("22:28", "span"),
                   ("24:30", "late control"), ("12:24", "given")]   # 2:8 given twice: listed once
    picked = {**SELECTION, "recommended": [10, 16]}
    names = [c.name for c in ws.candidates(picked, 4)]
    assert "10:16" in names and "9:15" not in names   # the nearest spread start gives way to Stage 1's pick
    edge = {**SELECTION, "coda_start": 30}
    assert [c.role for c in ws.candidates(edge, 2)] == ["span", "span"]   # the last window is already the late control


@pytest.mark.parametrize("bad, fragment", [
    (dict(include=["28:40"]), "outside the model"), (dict(include=["12-24"]), "form A:B"),
    (dict(n=0), "--candidates"), (dict(selection={**SELECTION, "prelude_end": 25}), "too narrow"),
    (dict(n=30), "holds only 21 windows")])
def test_candidates_refuse_bad_input(bad, fragment):
    with pytest.raises(WorkbenchError, match=fragment):
        ws.candidates(bad.get("selection", SELECTION), bad.get("n", 4), bad.get("include", ()))


# ----------------------------------------------------------------------------- the short recipe
def test_the_short_recipe_is_the_curriculum_cut_at_the_budget_with_only_the_window_changed():
    from workbench.defaults import resolve

    raw = ws.base_recipe(resolve("recipe", "smollm2_lora_chase"))
    a = ws.sweep_recipe(raw, "smollm2-135m-instruct", ws.Candidate(2, 8, "span"), 200, 0)
    b = ws.sweep_recipe(raw, "smollm2-135m-instruct", ws.Candidate(12, 24, "given"), 200, 1)
    assert [(s.name, s.steps, s.depths) for s in a.stages] == [("primitive", 60, [1]), ("two-step", 140, [1, 2])]
    assert a.eval.depths == [1, 2] and a.eval.every == 200 and a.model.block == "2:8" and b.model.block == "12:24"
    assert b.seed == a.seed + 1
    da, db = a.to_dict(), b.to_dict()
    for d in (da, db):
        d.pop("name"), d.pop("seed"), d["model"].pop("block")
    assert da == db   # nothing else differs between candidates
    assert a.guardrail.enabled and a.preserve.kl_weight == 20.0 and a.lora.r == 16
    with pytest.raises(WorkbenchError, match="--steps 0"):
        ws.sweep_recipe(raw, "m", ws.Candidate(2, 8, "span"), 0, 0)
    with pytest.raises(WorkbenchError, match="only 1100 steps"):
        ws.sweep_recipe(raw, "m", ws.Candidate(2, 8, "span"), 5000, 0)


# ----------------------------------------------------------------------------- the ranking read
def test_the_ranking_read_is_the_training_losss_own_per_loop_ce(tiny_looped):
    from workbench.tasks import build_rows
    from workbench.train.losses import loop_nll, make_batch

    looped, tok = tiny_looped
    rows = build_rows("chase", [1, 2], 6, 11, alphabet=4, tokenizer=tok)
    got = ws.read_candidate(looped, tok, rows, batch_size=4)
    for depth in (1, 2):
        subset = [r for r in rows if r["depth"] == depth]
        with torch.no_grad():
            want = loop_nll(looped, make_batch(subset, tok)).double()
        for t in range(depth):
            assert got["ce"][str(depth)][str(t + 1)] == pytest.approx(float(want[:, t].mean()), abs=1e-6)
    assert got["rows"] == len(rows) == len(got["row_ce"])
    # the iterate cells: the depth-2 rows only, each row's mean CE over its loops 2..d (here loop 2 alone)
    d2 = [r for r in rows if r["depth"] == 2]
    with torch.no_grad():
        want2 = loop_nll(looped, make_batch(d2, tok)).double()
    assert got["row_ce_iterate"] == pytest.approx(want2[:, 1].tolist(), abs=1e-6)
    from workbench.train.evaluate import evaluate

    matrix, _ = evaluate(looped, tok, rows)   # the trainer's held-out reader: the same accuracy at every cell
    for depth, loops in matrix.items():
        for t, value in loops.items():
            assert got["acc"][depth][t] == pytest.approx(value, abs=1e-6)
            assert np.mean(got["correct"][depth][t]) == pytest.approx(value)


@pytest.fixture(scope="module")
def tiny_looped():
    from workbench.loop.surgery import retrofit
    from workbench.models import load_base

    torch.manual_seed(0)
    base, tok = load_base("tiny-llama")
    return retrofit(base, RetrofitConfig(Block(1, 3), reentry="bridge", max_loops=4)).eval(), tok


# ----------------------------------------------------------------------------- the ranking rule
def _reading(values):
    return {"row_ce": list(values), "ce": {"1": {"1": 0.0}}, "acc": {"1": {"1": 0.0}},
            "correct": {"2": {"2": [1, 0]}}, "rows": len(values)}


def _row(name, seeds_values, status="finished"):
    readings = [_reading(v) for v in seeds_values] if status == "finished" else [None]
    return ws.summarize(name, "span", readings, [{"status": status}] * len(readings))


def test_lower_heldout_ce_ranks_first_whatever_the_listed_order_and_a_stopped_run_ranks_last():
    rng = np.random.default_rng(0)
    base = rng.uniform(0.5, 1.5, 200)
    rows = [_row("0:2", [base + 0.3]), _row("4:6", [base + 0.1]), _row("2:4", [base - 5], status="stopped"),
            _row("6:8", [base])]
    ranked = ws.order(rows)
    assert [r["window"] for r in ranked] == ["6:8", "4:6", "0:2", "2:4"]
    assert [r["rank"] for r in ranked] == [1, 2, 3, 4]
    m = ws.margin(ranked[0], ranked[1])
    assert m["separated"] and m["ce_difference"]["value"] == pytest.approx(0.1)
    # The same mean gap buried in row noise, or a second seed that orders them the other way: not separated.
    noisy = ws.order([_row("a:b".replace("a", "1").replace("b", "3"), [base + rng.normal(0, 2, 200)]), _row("5:7", [base])])
    assert not ws.margin(noisy[0], noisy[1])["separated"]
    flip = ws.order([_row("1:3", [base, base + 0.15]), _row("5:7", [base + 0.1, base + 0.1])])
    m = ws.margin(flip[0], flip[1])
    assert flip[0]["window"] == "1:3" and not m["seed_pairs_agree"] and not m["separated"]


def test_ranked_on_the_iterate_cells_a_window_that_leads_on_the_primitive_alone_loses():
    """A window far ahead on the single lookup (loop 1) but behind on loop 2 leads the default rule and loses the
    iterate rule, whose CE reads only the loop >= 2 cells; an unknown cell set is one line."""
    rng = np.random.default_rng(1)
    loop1, loop2 = rng.uniform(0.2, 0.4, 100), rng.uniform(1.0, 1.4, 100)

    def reading(primitive, iterate):   # 100 depth-1 rows and 100 depth-2 rows (mean of loops 1 and 2)
        r = _reading(list(loop1 + primitive) + list((loop1 + primitive + loop2 + iterate) / 2))
        return {**r, "row_ce_iterate": list(loop2 + iterate)}

    quick = [reading(0.0, 0.6)]        # learns the lookup fast, iterates badly
    iterates = [reading(1.0, 0.0)]     # slow on the lookup, iterates well
    for cells, winner in (("all", "2:8"), ("iterate", "12:24")):
        ranked = ws.order([ws.summarize("2:8", "span", quick, [{"status": "finished"}], cells),
                           ws.summarize("12:24", "given", iterates, [{"status": "finished"}], cells)])
        assert ranked[0]["window"] == winner, cells
        assert ws.margin(ranked[0], ranked[1])["separated"]
    with pytest.raises(WorkbenchError, match="--rank-cells 'loop9' is unknown"):
        ws.summarize("2:8", "span", quick, [{"status": "finished"}], "loop9")
    with pytest.raises(WorkbenchError, match="has no row_ce_iterate"):   # a reading made before the option
        ws.summarize("2:8", "span", [_reading(loop1)], [{"status": "finished"}], "iterate")
    assert "cells" not in ws.plan("s", "m", "r", "h", 1, [], 1)         # old sweeps' plans are unchanged
    assert ws.plan("s", "m", "r", "h", 1, [], 1, "iterate")["cells"] == "iterate"


def test_agreement_compares_untrained_damage_with_the_trained_ranking():
    rows = ws.order([_row("2:8", [[0.9] * 4]), _row("22:28", [[0.5] * 4]), _row("14:20", [[0.7] * 4]),
                     _row("12:24", [[0.1] * 4])])
    agree = ws.agreement(SELECTION, rows)
    assert agree["windows_in_both"] == ["22:28", "14:20", "2:8"]   # 12:24 was not in Stage 1's list
    assert agree["spearman_damage_vs_ce"] == pytest.approx(-0.5)
    assert agree["stage1_recommended_rank"] == 4 and agree["best_in_span"] is True
    # with the sweep's own damage.json every trained window is ranked both ways
    damage = [{"block": [12, 24], "damage": 0.05}, {"block": [22, 28], "damage": 0.2}, {"block": [14, 20], "damage": 0.3},
              {"block": [2, 8], "damage": 0.4}]
    agree = ws.agreement(SELECTION, rows, damage)
    assert agree["windows_in_both"] == ["12:24", "22:28", "14:20", "2:8"] and agree["spearman_damage_vs_ce"] == 1.0


# ----------------------------------------------------------------------------- the command, end to end
@pytest.fixture(scope="module")
def sweep_inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep")
    recipe = merge(TINY_RECIPE, {"stages": [{"name": "primitive", "depths": [1], "steps": 2},
                                            {"name": "two-step", "depths": [1, 2], "steps": 6}]})
    (root / "recipe.toml").write_text(tomli_w.dumps(recipe))
    (root / "corpus.txt").write_text("\n".join(f"Text {i}: the rule maps each letter to the next one." for i in range(8)))
    return root


def _args(inputs: Path, out: Path, *extra):
    return ["select-block", "--model", "tiny-llama", "--corpus", inputs / "corpus.txt", "--window", "2",
            "--window-sweep", "--steps", "3", "--candidates", "2", "--recipe", inputs / "recipe.toml",
            "--out", out, *extra]


@pytest.fixture(scope="module")
def finished_sweep(sweep_inputs, tmp_path_factory):
    from workbench.cli import app

    out = tmp_path_factory.mktemp("done") / "sweep"
    app([str(a) for a in _args(sweep_inputs, out, "--quiet")], standalone_mode=False)
    return out


def _start(window: str) -> int:
    return int(window.split(":")[0])


def _mean(values) -> float:
    return sum(values) / len(values)


def _readings_by_window(out: Path) -> dict[str, list[dict]]:
    """{window: its readings in seed order}, straight from readings/A-B-seedK.json."""
    got: dict[str, list] = {}
    for path in (out / ws.READINGS).glob("*.json"):
        a, b, seed = path.stem.split("-")
        got.setdefault(f"{a}:{b}", []).append((int(seed.removeprefix("seed")), json.loads(path.read_text())))
    return {w: [r for _, r in sorted(v, key=lambda x: x[0])] for w, v in got.items()}


def _heldout_ce(readings: list[dict]) -> float:
    """A window's held-out CE by hand: each row's CE averaged over the seeds, then the mean over the rows."""
    return _mean([_mean(ces) for ces in zip(*(r["row_ce"] for r in readings))])


@pytest.mark.slow   # five tiny trainings and their reads, end to end through the CLI
def test_a_sweep_trains_every_candidate_and_the_top_two_twice(finished_sweep):
    out = finished_sweep
    record = json.loads((out / ws.TABLE).read_text())
    plan = json.loads((out / ws.SWEEP).read_text())
    names = [c["window"] for c in plan["candidates"]]
    runs = sorted(p.name for p in (out / ws.RUNS).iterdir())
    assert len(runs) == len(names) + 2
    for run in runs:
        prov = json.loads((out / ws.RUNS / run / "provenance.json").read_text())
        assert prov["status"] == "finished"
        assert (out / ws.READINGS / f"{run}.json").is_file()
    table = record["table"]
    assert [r["rank"] for r in table] == list(range(1, len(names) + 1))
    assert sorted(r["window"] for r in table) == sorted(names)
    assert [r["seeds"] for r in table[:2]] == [2, 2] and all(r["seeds"] == 1 for r in table[2:])
    assert record["recommended"] == table[0]["window"]
    readings = _readings_by_window(out)   # the ranking rule applied here, by hand, to readings/
    assert sorted(readings) == sorted(names)
    by_hand = {w: _heldout_ce(rs) for w, rs in readings.items()}
    assert [r["window"] for r in table] == sorted(by_hand, key=lambda w: (by_hand[w], _start(w)))   # none stopped
    for row in table:
        assert row["heldout_ce"]["value"] == pytest.approx(by_hand[row["window"]], rel=1e-12)
    seed1 = {w: _mean(rs[0]["row_ce"]) for w, rs in readings.items()}
    top_two = sorted(seed1, key=lambda w: (seed1[w], _start(w)))[:2]   # the second seeds went to the first seeds' best
    assert sorted(w for w, rs in readings.items() if len(rs) == 2) == sorted(top_two)
    assert (out / "window_sweep.html").stat().st_size > 10_000 and (out / "block_selection.json").is_file()
    assert record["rank_rows"]["depths"] == [1, 2]
    damage = json.loads((out / ws.DAMAGE).read_text())["windows"]   # Stage 1's measure over exactly the trained windows
    assert sorted(f"{d['block'][0]}:{d['block'][1]}" for d in damage) == sorted(names)
    assert sorted(record["agreement"]["windows_in_both"]) == sorted(names)
    assert record["train_wall_s"] > 0


@pytest.mark.slow   # five tiny trainings and their reads, end to end through the CLI
def test_the_table_regenerates_from_the_readings(finished_sweep, tmp_path):
    """The table's numbers are what readings/ give, computed here by hand; a planted change to one reading moves
    the rebuilt table (rebuild reads the readings, it does not carry the table over)."""
    import shutil

    out = finished_sweep
    record = json.loads((out / ws.TABLE).read_text())
    rebuilt = ws.rebuild(out)
    assert json.dumps(rebuilt["table"], sort_keys=True) == json.dumps(record["table"], sort_keys=True)
    assert rebuilt["recommended"] == record["recommended"] and rebuilt["margin"] == record["margin"]
    readings = _readings_by_window(out)
    assert sorted(readings) == sorted(r["window"] for r in record["table"])
    for row in record["table"]:
        rs = readings[row["window"]]
        assert row["heldout_ce"]["value"] == pytest.approx(_heldout_ce(rs), rel=1e-12)
        assert row["heldout_ce"]["rows"] == len(rs[0]["row_ce"]) and row["seeds"] == len(rs)
        assert row["seed_ce"] == pytest.approx([_mean(r["row_ce"]) for r in rs], rel=1e-12)
        hits = [x for r in rs for x in r["correct"]["2"]["2"]]
        assert row["acc_d2_loop2"]["value"] == sum(hits) / len(hits) and row["acc_d2_loop2"]["n"] == len(hits)
    best = min(readings, key=lambda w: (_heldout_ce(readings[w]), _start(w)))
    assert record["recommended"] == best
    planted = tmp_path / "planted"
    shutil.copytree(out, planted, ignore=shutil.ignore_patterns("*.safetensors"))
    for path in (planted / ws.READINGS).glob(f"{best.replace(':', '-')}-seed*.json"):
        reading = json.loads(path.read_text())
        reading["row_ce"] = [x + 10.0 for x in reading["row_ce"]]   # the recommendation's every row 10 nats worse
        path.write_text(json.dumps(reading))
    moved = ws.rebuild(planted)
    row = next(r for r in moved["table"] if r["window"] == best)
    assert row["rank"] == len(moved["table"]) and row["heldout_ce"]["value"] == pytest.approx(
        _heldout_ce(readings[best]) + 10.0, rel=1e-12)
    assert moved["recommended"] == record["table"][1]["window"] != best
    assert moved["margin"]["ce_difference"] != record["margin"]["ce_difference"]


@pytest.mark.slow   # five tiny trainings and their reads, end to end through the CLI
def test_resume_keeps_finished_candidates_and_refuses_another_plan(finished_sweep, sweep_inputs, capsys, monkeypatch):
    out = finished_sweep
    before = {p: p.stat().st_mtime_ns for p in (out / ws.RUNS).rglob("trainable.safetensors")}
    code, _, err = invoke(capsys, monkeypatch, *_args(sweep_inputs, out, "--quiet"))
    assert_clean_error(code, err, "holds a window sweep", "--resume")
    code, _, err = invoke(capsys, monkeypatch, *_args(sweep_inputs, out, "--quiet", "--resume"))
    assert code == 0, err
    assert {p: p.stat().st_mtime_ns for p in (out / ws.RUNS).rglob("trainable.safetensors")} == before
    args = [a if a != "3" else "4" for a in _args(sweep_inputs, out, "--resume")]
    code, _, err = invoke(capsys, monkeypatch, *args)
    assert_clean_error(code, err, "steps")
    code, _, err = invoke(capsys, monkeypatch, *_args(sweep_inputs, out, "--resume", "--rank-cells", "iterate"))
    assert_clean_error(code, err, "cells = 'all'", "'iterate'")   # a sweep ranked one way is not resumed another


@pytest.mark.slow   # five tiny trainings and their reads, end to end through the CLI
def test_an_interrupted_sweep_resumes_where_it_stopped(sweep_inputs, tmp_path, monkeypatch, capsys):
    out = tmp_path / "sweep"
    real, calls = ws._train_one, []

    def stop_at_second(*a, **k):
        calls.append(a[1])
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(ws, "_train_one", stop_at_second)
    from workbench.cli import app

    code = None
    try:
        code = app([str(a) for a in _args(sweep_inputs, out, "--quiet")], standalone_mode=False)
    except (KeyboardInterrupt, click.exceptions.Abort):
        code = "interrupted"
    assert code in (130, "interrupted") and len(calls) == 2, code   # Ctrl-C: exit 130
    assert not (out / ws.TABLE).exists()
    first = calls[0] / "trainable.safetensors"
    stamp = first.stat().st_mtime_ns
    monkeypatch.setattr(ws, "_train_one", real)
    code, _, err = invoke(capsys, monkeypatch, *_args(sweep_inputs, out, "--quiet", "--resume"))
    assert code == 0, err
    assert first.stat().st_mtime_ns == stamp and (out / ws.TABLE).is_file()


@pytest.mark.parametrize("extra, fragment", [
    (["--include", "1:99"], "outside the model"), (["--steps", "0"], "--steps 0"),
    (["--window", "9"], "does not fit the span"), (["--seeds", "0"], "--seeds 0"),
    (["--stage2", "trian"], "--stage2 'trian'"), (["--steps", "900"], "only 8 steps"),
    (["--rank-cells", "loop2"], "--rank-cells 'loop2' is unknown")])
def test_bad_input_is_one_line_exit_2_and_nothing_written(sweep_inputs, tmp_path, capsys, monkeypatch, extra, fragment):
    out = tmp_path / "sweep"
    args = _args(sweep_inputs, out)
    for flag, value in zip(extra[::2], extra[1::2]):
        if flag in args:
            args[args.index(flag) + 1] = value
        else:
            args += [flag, value]
    code, _, err = invoke(capsys, monkeypatch, *args)
    assert_clean_error(code, err, fragment)
    assert not out.exists()


@pytest.mark.parametrize("flag", [["--steps", "50"], ["--candidates", "3"], ["--seeds", "1"], ["--include", "1:3"],
                                  ["--recipe", "smollm2_lora_chase"], ["--resume"], ["--rank-cells", "iterate"]])
def test_sweep_options_without_window_sweep_are_refused(tmp_path, capsys, monkeypatch, flag):
    out = tmp_path / "sel"
    code, _, err = invoke(capsys, monkeypatch, "select-block", "--model", "tiny-llama", *flag, "--out", out)
    assert_clean_error(code, err, f"{flag[0]} belongs to --window-sweep")
    assert not out.exists()


@pytest.mark.parametrize("old, asks, fragment", [
    ("train", "--window-sweep", "--steps 900: the recipe has only 8 steps"),   # refused by the sweep's own check
    ("damage", "no --window-sweep", "--steps belongs to --window-sweep")])
def test_the_old_flag_is_read_as_the_window_sweep_with_a_note(sweep_inputs, tmp_path, capsys, monkeypatch, caplog,
                                                              old, asks, fragment):
    """`--stage2 train` (the flag's name before the window sweep had its own) asks for the sweep, `--stage2 damage`
    for none; each is noted in one line."""
    out = tmp_path / "sweep"
    args = _args(sweep_inputs, out, "--stage2", old)
    args.remove("--window-sweep")
    args[args.index("--steps") + 1] = "900"
    code, _, err = invoke(capsys, monkeypatch, *args)
    assert_clean_error(code, err, fragment)
    assert f"--stage2 {old} read as {asks} (its old name)" in caplog.messages and not out.exists()


COMMITTED = Path(__file__).resolve().parents[1] / "training" / "selection" / "smollm2-135m-instruct-stage2"


ITERATE = COMMITTED.with_name("smollm2-135m-instruct-stage2-iterate")   # ranked on the loop >= 2 cells, 400 steps
SWEEPS = {"stage2": COMMITTED, "stage2-iterate": ITERATE}   # the page's marker name: the committed sweep


@pytest.mark.parametrize("marker", sorted(SWEEPS))
def test_the_committed_sweep_regenerates_from_its_readings(marker):
    """The committed window sweeps' tables, rankings, margins and agreement are what their readings and runs give
    now."""
    sweep = SWEEPS[marker]
    record = json.loads((sweep / ws.TABLE).read_text())
    rebuilt = ws.rebuild(sweep)
    assert {k: v for k, v in record.items() if k != "seconds"} == json.loads(json.dumps(rebuilt))
    assert len(record["table"]) == len(record["candidates"]) >= 4
    for row in record["table"]:   # every finished run carries its guardrail reading beside its numbers
        assert all(run["status"] != "finished" or run["guardrail"]["final"] is not None for run in row["runs"])


@pytest.mark.parametrize("marker", sorted(SWEEPS))
def test_the_results_page_shows_the_committed_sweeps_table(marker):
    """docs/results/block-selection.md carries `table_lines` of each committed sweep's table between its markers."""
    page = (Path(__file__).resolve().parents[1] / "docs" / "results" / "block-selection.md").read_text()
    block = page.split(f"<!-- {marker}:start -->\n```\n", 1)[1].split(f"```\n<!-- {marker}:end -->", 1)[0]
    record = json.loads((SWEEPS[marker] / ws.TABLE).read_text())
    assert block == "\n".join(ws.table_lines(record)) + "\n"


def test_the_report_on_a_selection_directory_draws_the_curve_the_knees_and_the_sweeps_table(tmp_path):
    from workbench.plots.report import write_report

    path = write_report(COMMITTED, tmp_path / "report.html")
    page = path.read_text()
    assert "fig-block_selection" in page and "Prelude knee 2" in page and "Coda knee 28" in page
    assert "fig-window_sweep" in page and "window_sweep-table" in page
    assert "Recommended: 2:8 (separated from the runner-up" in page
    for window in ("2:8", "9:15", "12:24", "15:21", "22:28", "24:30"):
        assert f">{window}<" in page   # a row of the table per candidate


def test_a_sweep_made_before_the_name_is_read_under_its_old_table_name(tmp_path, caplog):
    """A sweep directory holding stage2.json (every sweep made before the window sweep had its name) is drawn from
    it, noted once in one line; where window_sweep.json is there too, that is the table read."""
    from workbench.plots.report import write_report

    old = tmp_path / "old"
    old.mkdir()
    (old / OLD_SWEEP_TABLE).write_bytes((COMMITTED / ws.TABLE).read_bytes())
    (old / "block_selection.json").write_bytes((COMMITTED / "block_selection.json").read_bytes())
    page = write_report(old, tmp_path / "old.html").read_text()
    assert "fig-window_sweep" in page and "budget: 200 steps" in page
    assert caplog.messages == [f"{old / OLD_SWEEP_TABLE}: read as {ws.TABLE} (its old name)"]
    record = json.loads((old / OLD_SWEEP_TABLE).read_text())
    (old / ws.TABLE).write_text(json.dumps({**record, "budget": "the new table"}))
    assert "budget: the new table." in write_report(old, tmp_path / "new.html").read_text()
