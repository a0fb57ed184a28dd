"""Nothing a user owns is destroyed: --overwrite replaces only what the workbench wrote, never what is read.

Each case runs the CLI in process (`workbench.cli.run`) on a tiny run and manifest; see
tests/test_cli_errors.py for the helpers and fixtures.
"""

import json
import shutil

import pytest

from tests.test_cli_errors import assert_clean_error, copy_run, invoke, probe_args
from workbench.guard import OUTPUT_MARKER


def tree(path):
    """{relative path: bytes} of every file under `path`."""
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def test_overwrite_refuses_a_directory_the_workbench_did_not_write(
        capsys, monkeypatch, tmp_path, tiny_run, tiny_manifest):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    code, _, err = invoke(capsys, monkeypatch, *probe_args(tiny_run, tiny_manifest, out))
    assert_clean_error(code, err, "not empty", "--overwrite")
    code, _, err = invoke(capsys, monkeypatch, *probe_args(tiny_run, tiny_manifest, out, "--overwrite"))
    assert_clean_error(code, err, "--overwrite replaces only a directory the workbench wrote", OUTPUT_MARKER)
    assert tree(out) == {"keep.txt": b"mine"}


def test_overwrite_replaces_results_the_workbench_wrote(capsys, monkeypatch, tmp_path, tiny_run, tiny_manifest):
    out = tmp_path / "out"
    code, _, err = invoke(capsys, monkeypatch, *probe_args(tiny_run, tiny_manifest, out))
    assert code == 0, err
    assert sorted(p.name for p in out.iterdir()) == [OUTPUT_MARKER, "depth_matrix.parquet",
                                                     "depth_matrix__frontier.parquet", "report.html", "summary.json"]
    assert f"Results in <code>{out}</code>" in (out / "report.html").read_text()  # rendered in staging, names `out`
    first = json.loads((out / "summary.json").read_text())["wall_s"]
    code, _, err = invoke(capsys, monkeypatch, *probe_args(tiny_run, tiny_manifest, out, "--overwrite"))
    assert code == 0, err
    assert json.loads((out / "summary.json").read_text())["wall_s"] is not None and (out / "report.html").is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["out"], first  # no staging or .old directory left beside it


@pytest.mark.parametrize("where", ["the run", "its parent"])
def test_overwrite_never_replaces_the_checkpoint_being_read(capsys, monkeypatch, tmp_path, tiny_run, tiny_manifest,
                                                            where):
    run = copy_run(tiny_run, tmp_path)
    (run / OUTPUT_MARKER).write_text("{}")  # even a directory that claims to be workbench output
    before = tree(tmp_path)
    out = run if where == "the run" else tmp_path
    code, _, err = invoke(capsys, monkeypatch, *probe_args(run, tiny_manifest, out, "--overwrite"))
    assert_clean_error(code, err, f"output directory '{out}' holds '{run}', which this command reads")
    assert tree(tmp_path) == before


def test_overwrite_never_replaces_the_manifest_being_read(capsys, monkeypatch, tmp_path, tiny_run, tiny_manifest):
    rows = tmp_path / "rows" / "rows.jsonl"
    rows.parent.mkdir()
    shutil.copy(tiny_manifest, rows)
    shutil.copy(tiny_manifest.with_suffix(".manifest.json"), rows.with_suffix(".manifest.json"))
    (rows.parent / OUTPUT_MARKER).write_text("{}")
    before = tree(tmp_path)
    code, _, err = invoke(capsys, monkeypatch, *probe_args(tiny_run, rows, rows.parent, "--overwrite"))
    assert_clean_error(code, err, "which this command reads")
    assert tree(tmp_path) == before


ROWS = ("rows", "--task", "chase", "--alphabet", "4", "--depths", "1-2", "--per-depth", "2", "--model", "tiny-llama")


def test_rows_refuses_an_existing_manifest_unless_overwrite(capsys, monkeypatch, tmp_path):
    out = tmp_path / "r.jsonl"
    code, _, err = invoke(capsys, monkeypatch, *ROWS, "--seed", "1", "--out", out)
    assert code == 0, err
    frozen = tree(tmp_path)
    code, _, err = invoke(capsys, monkeypatch, *ROWS, "--seed", "2", "--out", out)
    assert_clean_error(code, err, f"'{out}' already exists", "--overwrite")
    assert tree(tmp_path) == frozen
    out.unlink()  # a sidecar alone is a frozen manifest's half: refused as well
    code, _, err = invoke(capsys, monkeypatch, *ROWS, "--seed", "2", "--out", out)
    assert_clean_error(code, err, "r.manifest.json' already exists")
    code, _, err = invoke(capsys, monkeypatch, *ROWS, "--seed", "2", "--out", out, "--overwrite")
    assert code == 0, err
    assert json.loads((tmp_path / "r.manifest.json").read_text())["meta"]["seed"] == 2


def test_figures_takes_only_complete_results(capsys, monkeypatch, tmp_path, tiny_run, tiny_manifest):
    """A staging directory a killed probe left, or a directory without summary.json, is not a result."""
    monkeypatch.chdir(tmp_path)
    code, _, err = invoke(capsys, monkeypatch, *probe_args(tiny_run, tiny_manifest, tmp_path / "results" / "good"))
    assert code == 0, err
    for name in (".good.tmp123", "partial"):
        shutil.copytree(tmp_path / "results" / "good", tmp_path / "results" / name)
    (tmp_path / "results" / "partial" / "summary.json").unlink()
    code, out, err = invoke(capsys, monkeypatch, "figures", "--format", "html", "--out", tmp_path / "figs")
    assert code == 0, err
    assert sorted(p.name for p in (tmp_path / "figs").iterdir()) == ["good"]
