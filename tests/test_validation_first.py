"""Validation before writing (issue 29, item 5): every input is checked before the first file is written or the
first forward runs; each case here is one line on stderr, exit 2 (1 only for the machine's failure, such as a
full disk), and the directory holding the inputs and outputs is unchanged (checksums)."""

import json
import shutil
from pathlib import Path

import pytest

from tests.test_cli_errors import assert_clean_error, invoke, probe_args
from tests.test_guard import checksums

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "training" / "smollm2_lora_chase.toml"
HALTING = ROOT / "training" / "recurtrace_stage2_halting.toml"


@pytest.mark.parametrize("recipe,sets,fragment", [
    (RECIPE, ["eval.every=0"], "eval.every"),
    (HALTING, ["halting.probe_depths=[100]"], "halting.probe_depths"),
    (RECIPE, ["name.x=1"], "not a table"),
    (RECIPE, ["stages.0.steps.x=1"], "not a table"),
    (RECIPE, ['stages.0.depths=["a", "b"]'], "list of numbers"),
    (RECIPE, ['eval.depths=["1"]'], "list of numbers"),
    (RECIPE, ['optim.betas=["x", 0.9]'], "list of numbers"),
])
def test_bad_recipe_values_are_one_line_before_any_file(capsys, monkeypatch, tmp_path, recipe, sets, fragment):
    out = tmp_path / "run"
    args = ["train", recipe, "--out", out]
    for s in sets:
        args += ["--set", s]
    code, _, err = invoke(capsys, monkeypatch, *args)
    assert_clean_error(code, err, fragment)
    assert not out.exists()


@pytest.mark.parametrize("what", ["recipe", "battery"])
def test_non_utf8_files_are_one_line(capsys, monkeypatch, tmp_path, tiny_run, tiny_manifest, what):
    bad = tmp_path / "bad.toml"
    bad.write_bytes(b'name = "\xff\xfe"\n')
    before = checksums(tmp_path)
    args = (["train", bad, "--out", tmp_path / "run"] if what == "recipe" else
            ["probe", "--checkpoint", tiny_run, "--battery", bad, "--out", tmp_path / "out"])
    code, _, err = invoke(capsys, monkeypatch, *args)
    assert_clean_error(code, err, "UTF-8")
    assert checksums(tmp_path) == before


def test_probe_seed_is_checked_before_any_probe(capsys, monkeypatch, tmp_path, tiny_run, tiny_manifest):
    code, _, err = invoke(capsys, monkeypatch, *probe_args(tiny_run, tiny_manifest, tmp_path / "out"), "--seed", "-1")
    assert_clean_error(code, err, "--seed")
    assert list(tmp_path.iterdir()) == []


def test_symlink_loops_as_checkpoint_or_out(capsys, monkeypatch, tmp_path, tiny_run, tiny_manifest):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    before = checksums(tmp_path)
    code, _, err = invoke(capsys, monkeypatch, *probe_args(tmp_path / "a", tiny_manifest, tmp_path / "out"))
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    code, _, err = invoke(capsys, monkeypatch, *probe_args(tiny_run, tiny_manifest, tmp_path / "a"))
    assert_clean_error(code, err, "symbolic link")
    assert checksums(tmp_path) == before


@pytest.mark.parametrize("state", [[], {"optimizer": "main"}, {"step": "two", "optimizer": "main"}])
def test_a_damaged_checkpoint_state_is_one_line(capsys, monkeypatch, tmp_path, state):
    import tomli_w

    from tests.training.conftest import TINY_RECIPE, merge
    from workbench.train.trainer import train

    recipe = tmp_path / "r.toml"
    recipe.write_text(tomli_w.dumps(merge(TINY_RECIPE, {})))
    run = tmp_path / ("a-deep-folder-" * 8) / "run"  # the message names the file however long the run's path is
    train(str(recipe), out=run, stop_after=2, progress=False)
    ckpts = sorted((run / "checkpoints").iterdir())
    assert ckpts
    for c in ckpts:
        (c / "state.json").write_text(json.dumps(state))
    metrics = (run / "metrics.jsonl").read_bytes()
    code, _, err = invoke(capsys, monkeypatch, "train", recipe, "--out", run, "--resume")
    assert_clean_error(code, err, "state.json")
    assert (run / "metrics.jsonl").read_bytes() == metrics


@pytest.mark.parametrize("damage", ["summary list", "text parquet", "summary not utf8"])
def test_damaged_results_directories_are_one_line(capsys, monkeypatch, tmp_path, damage):
    res = tmp_path / "res"
    shutil.copytree(ROOT / "training" / "keepers" / "smollm2-chase-anneal" / "battery", res,
                    ignore=shutil.ignore_patterns("*.parquet"))
    if damage == "summary list":
        (res / "summary.json").write_text("[]")
    elif damage == "summary not utf8":
        (res / "summary.json").write_bytes(b"\xff\xfe{}")
    else:
        (res / "depth_matrix.parquet").write_text("not a table")
    before = checksums(tmp_path)
    commands = [["report", res], ["compare", res, res, "--out", tmp_path / "cmp"]]
    if damage == "text parquet":  # figures read the tables only
        commands.append(["figures", "--results", res, "--format", "html", "--out", tmp_path / "figs"])
    for args in commands:
        code, _, err = invoke(capsys, monkeypatch, *args)
        assert code == 2 and len(err.strip().splitlines()) == 1 and err.startswith("error: "), (args, err)
        assert checksums(tmp_path) == before, args


def test_documented_exit_2_cases(capsys, monkeypatch, tmp_path):
    (tmp_path / "file").write_text("mine")
    code, _, err = invoke(capsys, monkeypatch, "train", RECIPE, "--out", tmp_path / "file")
    assert_clean_error(code, err, "not a directory")
    res = ROOT / "training" / "keepers" / "smollm2-chase-anneal" / "battery"
    (tmp_path / "d").mkdir()
    code, _, err = invoke(capsys, monkeypatch, "report", res, "--out", tmp_path / "d")
    assert_clean_error(code, err, "is a directory")
    code, _, err = invoke(capsys, monkeypatch, "claims", "--claims", tmp_path / "missing.toml")
    assert_clean_error(code, err, "does not exist")
    assert (tmp_path / "file").read_text() == "mine"


def test_a_full_disk_during_a_checkpoint_write_is_one_line_exit_1(capsys, monkeypatch, tmp_path):
    import tomli_w
    from safetensors import SafetensorError

    from tests.training.conftest import TINY_RECIPE, merge

    recipe = tmp_path / "r.toml"
    recipe.write_text(tomli_w.dumps(merge(TINY_RECIPE, {})))

    def full(*a, **k):
        raise SafetensorError("Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "
                              "\"No space left on device\" })")

    monkeypatch.setattr("workbench.run_tensors.save_file", full)
    code, _, err = invoke(capsys, monkeypatch, "train", recipe, "--out", tmp_path / "run")
    assert code == 1, err
    assert err.count("error:") == 1 and "No space left on device" in err.strip().splitlines()[-1], err  # after the bar
    assert not list((tmp_path / "run" / "checkpoints").glob("*")) if (tmp_path / "run").exists() else True


def test_manifest_rows_without_a_prompt_are_refused_before_the_model(capsys, monkeypatch, tmp_path, tiny_run):
    from workbench.tasks.manifest import sidecar_path, summarize

    rows = tmp_path / "rows.jsonl"
    row = {"row_id": "r0", "task": "chase", "depth": 1, "start": "A", "chain": ["B"], "answer": "B",
           "symbols": ["A", "B"]}
    rows.write_text(json.dumps(row, sort_keys=True) + "\n")
    sidecar_path(rows).write_text(json.dumps(summarize([row], rows.name, None)))  # digests that match
    before = checksums(tmp_path)
    code, _, err = invoke(capsys, monkeypatch, *probe_args(tiny_run, rows, tmp_path / "out"))
    assert_clean_error(code, err, "prompt")
    assert checksums(tmp_path) == before
