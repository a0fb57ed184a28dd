"""Fuzzing: malformed manifests, recipes and CLI arguments end in a result or a clean error.

`hypothesis` drives each reader with malformed input; the only allowed outcomes are a
value or a WorkbenchError (a one-line message), never another exception.
"""

import json
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workbench import cli
from workbench.errors import WorkbenchError
from workbench.tasks.manifest import read_manifest, sidecar_path, write_manifest
from workbench.train.recipe import Recipe

ROOT = Path(__file__).resolve().parents[1]
FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                           max_leaves=8)
GOOD_ROW = {"row_id": "r0", "task": "chase", "depth": 1, "prompt": "A -> B\nAnswer:", "start": "A",
            "chain": ["B"], "answer": "B", "symbols": ["A", "B"]}


def _one_line(err: WorkbenchError) -> None:
    assert str(err) and "\n" not in str(err)


@FUZZ
@given(lines=st.lists(st.binary(max_size=40) | json_values.map(lambda v: json.dumps(v).encode()), max_size=4),
       sidecar=st.binary(max_size=60) | json_values.map(lambda v: json.dumps(v).encode()))
def test_manifest_reader_on_garbage(tmp_path_factory, lines, sidecar):
    path = tmp_path_factory.mktemp("m") / "rows.jsonl"
    path.write_bytes(b"\n".join(lines))
    sidecar_path(path).write_bytes(sidecar)
    try:
        read_manifest(path)
    except WorkbenchError as err:
        _one_line(err)


@FUZZ
@given(field=st.sampled_from(sorted(GOOD_ROW)), value=json_values)
def test_manifest_reader_on_tampered_rows(tmp_path_factory, field, value):
    path = tmp_path_factory.mktemp("m") / "rows.jsonl"
    write_manifest([GOOD_ROW], path)
    row = dict(GOOD_ROW, **{field: value})
    path.write_text(json.dumps(row, sort_keys=True) + "\n")
    if row == GOOD_ROW:
        return
    with pytest.raises(WorkbenchError) as exc:
        read_manifest(path)
    _one_line(exc.value)


@FUZZ
@given(text=st.text(max_size=200))
def test_recipe_parser_on_garbage_text(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("r") / "recipe.toml"
    path.write_text(text)
    try:
        Recipe.from_toml(path)
    except WorkbenchError as err:
        _one_line(err)


@FUZZ
@given(overrides=st.lists(st.text(max_size=30) | st.builds(lambda k, v: f"{k}={v}", st.sampled_from(
    ["optim.lr", "model.block", "stages.0.steps", "task.alphabet", "nope.key", "seed", "lora.r"]),
    st.text(max_size=10)), max_size=3))
def test_recipe_overrides_on_garbage(overrides):
    path = ROOT / "training" / "smollm2_lora_chase.toml"
    try:
        Recipe.from_toml(path, overrides)
    except WorkbenchError as err:
        _one_line(err)


# Every block below is invalid and no model spec is loadable, so no case starts real work.
TOKENS = ["identity", "rows", "train", "--model", "--block", "--loops", "--task", "--depths", "--alphabet",
          "--per-depth", "--seed", "--out", "--set", "3:1", "x", "-1", "0", "1-3", "chase", "", "--help-me",
          "nonexistent.toml", "/no/model", "o.jsonl"]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(argv=st.lists(st.sampled_from(TOKENS), max_size=6))
def test_cli_argument_handling(monkeypatch, capsys, tmp_path_factory, argv):
    out_dir = tmp_path_factory.mktemp("cli")
    monkeypatch.chdir(out_dir)
    monkeypatch.setattr(sys, "argv", ["workbench", *argv])
    try:
        cli.run()
        code = 0
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    assert code in (0, 1, 2, None), (argv, code, err)
    assert "Traceback" not in err, (argv, err)
