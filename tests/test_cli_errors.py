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


# --- run directories and manifests handed to `workbench probe` -------------------------------

def copy_run(run, tmp_path):
    import shutil

    dest = tmp_path / "run"
    shutil.copytree(run, dest)
    return dest


def refresh_provenance(run, name):
    """Re-records one file's hash in provenance.json, as someone editing a run by hand would."""
    from workbench.io import sha256_file

    prov = json.loads((run / "provenance.json").read_text())
    prov["files"][name] = sha256_file(run / name)
    (run / "provenance.json").write_text(json.dumps(prov))


def probe_args(checkpoint, manifest, out, *extra):
    return ("probe", "--checkpoint", checkpoint, "--rows", manifest, "--only", "depth_matrix", "--out", out, *extra)


def test_probe_on_a_run_with_a_missing_file(capsys, monkeypatch, tmp_path, tiny_run, tiny_manifest):
    run = copy_run(tiny_run, tmp_path)
    (run / "trainable.safetensors").unlink()
    out = tmp_path / "out"
    code, _, err = invoke(capsys, monkeypatch, *probe_args(run, tiny_manifest, out))
    assert_clean_error(code, err, "trainable.safetensors", "missing")
    assert not out.exists()


def test_probe_on_a_tensor_file_that_differs_from_provenance(capsys, monkeypatch, tmp_path, tiny_run, tiny_manifest):
    from safetensors.torch import load_file, save_file

    run = copy_run(tiny_run, tmp_path)
    tensors = load_file(str(run / "trainable.safetensors"))
    name = sorted(tensors)[0]
    tensors[name] = tensors[name] + 1e-3
    save_file(tensors, str(run / "trainable.safetensors"))
    out = tmp_path / "out"
    code, _, err = invoke(capsys, monkeypatch, *probe_args(run, tiny_manifest, out))
    assert_clean_error(code, err, "trainable.safetensors: SHA-256 differs from the one recorded in provenance")
    assert not out.exists()


def test_probe_on_a_run_built_on_another_base(capsys, monkeypatch, tmp_path, tiny_run, tiny_manifest):
    run = copy_run(tiny_run, tmp_path)
    record = json.loads((run / "retrofit.json").read_text())
    record["base"]["spec"] = "tiny-qwen2"  # the recorded weights hash stays tiny-llama's
    (run / "retrofit.json").write_text(json.dumps(record))
    refresh_provenance(run, "retrofit.json")
    out = tmp_path / "out"
    code, _, err = invoke(capsys, monkeypatch, *probe_args(run, tiny_manifest, out))
    assert_clean_error(code, err, "base model 'tiny-qwen2' has weights SHA-256", "a different base")
    assert not out.exists()


def test_probe_on_rows_that_do_not_match_their_digest(capsys, monkeypatch, tmp_path, tiny_run, tiny_manifest):
    import shutil

    rows = tmp_path / "rows.jsonl"
    shutil.copy(tiny_manifest, rows)
    shutil.copy(tiny_manifest.with_suffix(".manifest.json"), tmp_path / "rows.manifest.json")
    lines = rows.read_text().splitlines()
    first = json.loads(lines[0])
    first["answer"] = first["answer"] + "x"
    rows.write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    out = tmp_path / "out"
    code, _, err = invoke(capsys, monkeypatch, *probe_args(tiny_run, rows, out))
    assert_clean_error(code, err, "rows.jsonl", "does not match its sidecar", "rows_sha256")
    assert not out.exists()


def test_probe_with_an_unknown_probe_name(capsys, monkeypatch, tmp_path, tiny_run, tiny_manifest):
    out = tmp_path / "out"
    code, _, err = invoke(capsys, monkeypatch, "probe", "--checkpoint", tiny_run, "--rows", tiny_manifest,
                          "--only", "depth_matrix,logitlens", "--out", out)
    assert_clean_error(code, err, "logitlens", "known probes: identity, depth_matrix")
    assert not out.exists()


def test_debug_raises_instead_of_one_line(monkeypatch):
    """--debug lets the error leave `cli.run`, which both `workbench` and `python -m workbench` call bare: a
    process prints its traceback (a fresh process to show it cost 10 s and checked Python's own behaviour)."""
    from workbench.errors import WorkbenchError

    monkeypatch.setattr(sys, "argv", ["workbench", "--debug", "identity", "--model", "tiny-llama", "--block", "4:2"])
    with pytest.raises(WorkbenchError, match="block 4:2 is invalid"):
        cli.run()


# --- every option that takes a name: a mistyped one is refused with the names that exist ----------------

SMALL_RESULTS = str(ROOT / "training" / "halting" / "keeper-oracle" / "exit_rules")
UNTRAINED = "untrained:tiny-llama:2:4"
MISTYPED = {  # option -> (the command line with a mistyped name, a name the error must list)
    "probe --checkpoint": (["probe", "--checkpoint", "smollm2-chas"], "smollm2-chase"),
    "probe --checkpoint untrained:": (["probe", "--checkpoint", "untrained:smollm2-chas"], "smollm2-chase"),
    "probe --battery": (["probe", "--checkpoint", UNTRAINED, "--battery", "defualt"], "default"),
    "probe names in a battery": (["probe", "--checkpoint", UNTRAINED, "--battery", "{battery}"], "depth_matrix"),
    "probe --only": (["probe", "--checkpoint", UNTRAINED, "--only", "depth_matrx"], "depth_matrix"),
    "probe --rows": (["probe", "--checkpoint", UNTRAINED, "--rows", "chase_n8_d1-8"], "chase_n8_d1-7"),
    "probe --precision": (["probe", "--checkpoint", UNTRAINED, "--precision", "fp23"], "fp32"),
    "probe --device": (["probe", "--checkpoint", UNTRAINED, "--device", "cdua"], "cpu"),
    "train RECIPE": (["train", "smollm2_lora_chse"], "smollm2_lora_chase"),
    "train stage kind": (["train", "smollm2_lora_chase", "--set", "stages.0.kind=chian"], "chain"),
    "launch --preset": (["launch", "smollm2_lora_chase", "--preset", "dpp"], "ddp"),
    "figures --spec": (["figures", "--spec", "papr", "--results", SMALL_RESULTS], "paper"),
    "figure names in a spec": (["figures", "--spec", "{spec}", "--results", SMALL_RESULTS], "depth_matrix"),
    "figures --format": (["figures", "--format", "pnd", "--results", SMALL_RESULTS], "png"),
    "rows --task": (["rows", "--task", "chse", "--depths", "1-3", "--seed", "1"], "chase"),
    "rows --surface": (["rows", "--surface", "relya", "--depths", "1-3", "--seed", "1"], "relay"),
    "identity --model": (["identity", "--model", "tiny-lama", "--block", "1:2"], "tiny-llama"),
    "identity --attn": (["identity", "--model", "tiny-llama", "--block", "1:2", "--attn", "eagr"], "eager"),
}


@pytest.mark.parametrize("option", MISTYPED)
def test_a_mistyped_name_lists_the_names_that_exist(capsys, monkeypatch, tmp_path, option):
    battery, spec = tmp_path / "battery.toml", tmp_path / "spec.toml"
    battery.write_text('[battery]\nmanifest = "chase_n8_d1-7"\n[probes.depth_matrx]\n')
    spec.write_text('[[figure]]\nname = "depth_matrx"\nsize = "single"\n')
    args, listed = MISTYPED[option]
    args = [a.format(battery=battery, spec=spec) for a in args]
    out_option = ["--out", tmp_path / ("r.jsonl" if args[0] == "rows" else "out")] if args[0] != "identity" else []
    code, _, err = invoke(capsys, monkeypatch, *args, *out_option)
    assert_clean_error(code, err, listed)
    assert ", " in err or " or " in err, err   # a list, not the one name
    assert not (tmp_path / "out").exists() and not (tmp_path / "r.jsonl").exists()
