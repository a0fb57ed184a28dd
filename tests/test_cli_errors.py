"""Bad input stops with exit status 2, one line on stderr, and nothing written (issue: reliability).

The CLI runs in-process through `workbench.cli.run` (the console entry point) so each case
costs milliseconds to a second; `tests/test_cli.py` covers real subprocesses.
"""

import json
import sys
from pathlib import Path

import pytest

from workbench import cli

ROOT = Path(__file__).resolve().parents[1]
KEEPER = ROOT / "training" / "keepers" / "smollm2-chase"


def invoke(capsys, monkeypatch, *args):
    monkeypatch.setattr(sys, "argv", ["workbench", *map(str, args)])
    with pytest.raises(SystemExit) as exc:
        cli.run()
        raise SystemExit(0)
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def assert_clean_error(code, err, *fragments):
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_missing_model_path(capsys, monkeypatch, tmp_path):
    code, _, err = invoke(capsys, monkeypatch, "identity", "--model", tmp_path / "nope", "--block", "1:2")
    assert_clean_error(code, err, "does not exist", "tiny-llama")


def test_unsupported_gguf(capsys, monkeypatch, tmp_path):
    import numpy as np
    from gguf import GGUFWriter

    path = tmp_path / "m.gguf"
    w = GGUFWriter(str(path), "gpt2")
    w.add_tensor("token_embd.weight", np.zeros((2, 2), dtype=np.float32))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()  # noqa: E702
    code, _, err = invoke(capsys, monkeypatch, "identity", "--model", path, "--block", "1:2")
    assert_clean_error(code, err, "architecture 'gpt2'", "llama, mistral, qwen2, qwen3")


@pytest.mark.parametrize("block", ["3:3", "5:2", "0:99", "ten:12"])
def test_bad_block(capsys, monkeypatch, block):
    code, _, err = invoke(capsys, monkeypatch, "identity", "--model", "tiny-llama", "--block", block)
    assert_clean_error(code, err, "block")


@pytest.mark.parametrize("loops", ["0", "65"])
def test_bad_loops(capsys, monkeypatch, loops):
    code, _, err = invoke(capsys, monkeypatch, "identity", "--model", "tiny-llama", "--block", "1:3", "--loops", loops)
    assert_clean_error(code, err, f"loops={loops}")


def test_recipe_with_unknown_key_suggests(capsys, monkeypatch, tmp_path):
    recipe = (ROOT / "training" / "smollm2_lora_chase.toml").read_text().replace("[optim]\n", "[optim]\nlearning_rate = 1e-4\n")
    path = tmp_path / "r.toml"
    path.write_text(recipe)
    out = tmp_path / "run"
    code, _, err = invoke(capsys, monkeypatch, "train", path, "--out", out)
    assert_clean_error(code, err, "learning_rate")
    assert not out.exists()


def test_rows_depth_out_of_range(capsys, monkeypatch, tmp_path):
    out = tmp_path / "r.jsonl"
    code, _, err = invoke(capsys, monkeypatch, "rows", "--task", "chase", "--alphabet", "8", "--depths", "1-8",
                          "--per-depth", "2", "--seed", "1", "--out", out)
    assert_clean_error(code, err, "depth 8", "1..7")
    assert list(tmp_path.iterdir()) == []


def test_rows_symbol_not_a_single_token(capsys, monkeypatch, tmp_path):
    out = tmp_path / "r.jsonl"
    code, _, err = invoke(capsys, monkeypatch, "rows", "--task", "chase", "--alphabet", "2", "--depths", "1",
                          "--per-depth", "2", "--seed", "1", "--symbols", "Ben,Bartholomew", "--out", out)
    assert_clean_error(code, err, "Bartholomew")
    assert list(tmp_path.iterdir()) == []


def test_select_block_refuses_nonempty_out(capsys, monkeypatch, tmp_path):
    (tmp_path / "keep.txt").write_text("mine")
    code, _, err = invoke(capsys, monkeypatch, "select-block", "--model", "tiny-llama", "--out", tmp_path)
    assert_clean_error(code, err, "not empty", "--overwrite")
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]
