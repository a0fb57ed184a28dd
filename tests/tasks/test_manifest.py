"""Frozen manifests and the `workbench rows` command."""

import hashlib
import json
import re

import pytest
import typer
from typer.testing import CliRunner

from workbench.commands.rows import parse_depths
from workbench.commands.rows import rows as rows_command
from workbench.errors import WorkbenchError
from workbench.tasks.chase import chase_rows
from workbench.tasks.manifest import read_manifest, sidecar_path, write_manifest


@pytest.fixture(scope="module")
def rows(tok):
    return chase_rows(8, [1, 2, 7], 4, 20260702, tokenizer=tok)


def test_sidecar_holds_counts_and_both_digests(rows, tmp_path):
    path = tmp_path / "F.jsonl"
    sidecar = write_manifest(rows, path, meta={"seed": 20260702})
    on_disk = json.loads((tmp_path / "F.manifest.json").read_text())
    assert on_disk == sidecar
    assert sidecar["rows"] == 12 and sidecar["depth_counts"] == {"1": 4, "2": 4, "7": 4}
    ids = "\n".join(r["row_id"] for r in rows).encode()
    assert sidecar["row_ids_sha256"] == hashlib.sha256(ids).hexdigest()
    canonical = "".join(json.dumps(r, sort_keys=True, separators=(",", ":")) + "\n" for r in rows)
    assert path.read_text() == canonical
    assert sidecar["rows_sha256"] == hashlib.sha256(canonical.encode()).hexdigest()
    assert sidecar["meta"] == {"seed": 20260702} and sidecar["jsonl"] == "F.jsonl"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["F.jsonl", "F.manifest.json"]  # no temp files left


def test_read_returns_the_rows_and_sidecar(rows, tmp_path):
    sidecar = write_manifest(rows, tmp_path / "F.jsonl")
    manifest = read_manifest(tmp_path / "F.jsonl")
    assert manifest.rows == rows and manifest.sidecar == sidecar
    read_rows, read_sidecar = manifest
    assert manifest.digest == sidecar["rows_sha256"] and read_rows == rows and read_sidecar == sidecar


@pytest.mark.parametrize("tamper", [
    lambda text: text.replace('"answer":"', '"answer":"X', 1),
    lambda text: "\n".join(text.splitlines()[:-1]) + "\n",
    lambda text: "".join(sorted(text.splitlines(keepends=True))),
])
def test_rows_that_do_not_match_the_sidecar_are_an_error_naming_the_file(rows, tmp_path, tamper):
    path = tmp_path / "F.jsonl"
    write_manifest(rows, path)
    path.write_text(tamper(path.read_text()))
    with pytest.raises(WorkbenchError, match="F.jsonl"):
        read_manifest(path)


def test_missing_sidecar_bad_json_and_bad_names_are_errors(rows, tmp_path):
    path = tmp_path / "F.jsonl"
    write_manifest(rows, path)
    sidecar_path(path).unlink()
    with pytest.raises(WorkbenchError, match="F.manifest.json"):
        read_manifest(path)
    write_manifest(rows, path)
    path.write_text("{not json\n")
    with pytest.raises(WorkbenchError, match="line 1"):
        read_manifest(path)
    with pytest.raises(WorkbenchError, match=".jsonl"):
        write_manifest(rows, tmp_path / "F.json")
    with pytest.raises(WorkbenchError, match="repeat row ids"):
        write_manifest(rows + rows[:1], path)


@pytest.mark.parametrize("spec,depths", [
    ("1-14", list(range(1, 15))), ("1,2,5", [1, 2, 5]), ("3", [3]), ("1-3,7", [1, 2, 3, 7]),
])
def test_parse_depths(spec, depths):
    assert parse_depths(spec) == depths


@pytest.mark.parametrize("spec", ["", "a-b", "5-2", "1,1", "1-3,2", "1--3"])
def test_parse_depths_rejects_bad_specs(spec):
    with pytest.raises(WorkbenchError, match="depths"):
        parse_depths(spec)


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command()(rows_command)
    return app


def _run(*args):
    return CliRunner().invoke(_app(), [str(a) for a in args])


def test_rows_command_twice_gives_byte_identical_files(tok, tmp_path):
    outputs = []
    for name in ("a", "b"):
        out = tmp_path / name / "F.jsonl"
        result = _run("--task", "chase", "--alphabet", 16, "--depths", "1-14", "--per-depth", 8,
                      "--seed", 20260702, "--out", out)
        assert result.exit_code == 0, result.output
        assert "112 rows" in result.output
        outputs.append((out.read_bytes(), sidecar_path(out).read_bytes()))
    assert outputs[0] == outputs[1]
    manifest = read_manifest(tmp_path / "a" / "F.jsonl")
    assert manifest.sidecar["depth_counts"] == {str(d): 8 for d in range(1, 15)}
    assert manifest.sidecar["meta"]["tokenizer"] == "smollm2-135m-instruct"


def test_rows_command_verbal_and_recurtrace(tok, tmp_path):
    assert _run("--depths", "1-3", "--per-depth", 2, "--seed", 1, "--out", tmp_path / "r.jsonl",
                "--surface", "relay").exit_code == 0
    assert read_manifest(tmp_path / "r.jsonl").rows[0]["symbol_set"] == "names"
    assert _run("--task", "arith", "--depths", "2,4", "--per-depth", 3, "--seed", 1,
                "--out", tmp_path / "a.jsonl").exit_code == 0
    assert len(read_manifest(tmp_path / "a.jsonl").rows) == 6


@pytest.mark.parametrize("args,match", [
    (["--depths", "1-16", "--alphabet", 16], "depth 16"),
    (["--depths", "x"], "depths 'x'"),
    (["--depths", "1", "--task", "sort"], "task 'sort'"),
    (["--depths", "1", "--surface", "relay", "--symbols", "letters"], "needs name symbols"),
])
def test_rows_command_bad_input_raises_workbench_error(tmp_path, args, match):
    result = _run("--seed", 1, "--out", tmp_path / "F.jsonl", *args)
    assert isinstance(result.exception, WorkbenchError) and re.search(match, str(result.exception))
    assert not (tmp_path / "F.jsonl").exists()

