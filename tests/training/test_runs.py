"""Run directories: the layout of docs/architecture.md and strict loading (hashes, base, tensors)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from workbench.errors import WorkbenchError
from workbench.io import sha256_file
from workbench.loop.surgery import parameter_groups
from workbench.models import load_base, weights_sha256
from workbench.runs import load_run


def copy_run(finished_run, tmp_path):
    target = tmp_path / "run"
    shutil.copytree(finished_run, target)
    return target


def rewrite_trainable(run, edit):
    """Applies edit(dict of tensors) to trainable.safetensors and re-records its hash (so only
    the strict tensor check can object)."""
    path = run / "trainable.safetensors"
    tensors = load_file(str(path))
    edit(tensors)
    save_file(tensors, str(path))
    prov = json.loads((run / "provenance.json").read_text())
    prov["files"]["trainable.safetensors"] = sha256_file(path)
    (run / "provenance.json").write_text(json.dumps(prov))


def test_layout_and_provenance(finished_run):
    names = {p.name for p in finished_run.iterdir()}
    assert names == {"trainable.safetensors", "retrofit.json", "recipe.toml", "provenance.json", "metrics.jsonl",
                     "checkpoints"}
    assert sorted(p.name for p in (finished_run / "checkpoints").iterdir()) == ["step_4", "step_6"]  # keep = 2
    assert {p.name for p in (finished_run / "checkpoints" / "step_6").iterdir()} == {
        "trainable.safetensors", "optimizer.safetensors", "optimizer.json", "scheduler.json", "rng.safetensors",
        "state.json"}
    prov = json.loads((finished_run / "provenance.json").read_text())
    for name in ("trainable.safetensors", "retrofit.json", "recipe.toml", "metrics.jsonl"):
        assert prov["files"][name] == sha256_file(finished_run / name)
    assert prov["manifests"]["heldout"]["rows"] == 8 and len(prov["manifests"]["heldout"]["rows_sha256"]) == 64
    assert prov["seeds"] == {"recipe": 3, "eval": 1} and prov["packages"]["torch"] == torch.__version__
    assert prov["torch_threads"] == torch.get_num_threads()  # a bit-for-bit rerun needs the same thread count
    record = json.loads((finished_run / "retrofit.json").read_text())
    assert record["base"]["sha256"] == weights_sha256(load_base("tiny-llama")[0])
    assert record["split"] == {"prelude": [0, 2], "block": [2, 4], "coda": [4, 6]}
    assert record["settings"]["reentry"] == "bridge" and record["trained_groups"] == ["block", "reentry"]
    # only trained tensors: the block and the bridge, never the rest of the base
    saved = load_file(str(finished_run / "trainable.safetensors"))
    assert all(k.startswith(("base.model.layers.2.", "base.model.layers.3.", "reentry.")) for k in saved)


def test_load_run_rebuilds_the_trained_model(finished_run):
    looped, tok, info = load_run(finished_run)
    saved = load_file(str(finished_run / "trainable.safetensors"))
    named = dict(looped.named_parameters())
    assert saved and all(torch.equal(named[k], v) for k, v in saved.items())
    assert float(named["reentry.prelude_proj.weight"].abs().sum()) > 0  # trained, not the fresh init
    assert info["recipe"]["name"] == "tiny" and info["retrofit"]["settings"] == looped.retrofit_config.to_dict()
    ids = tok(["Function table:\nA -> B\nAnswer:"], return_tensors="pt")["input_ids"]
    assert looped.read(ids, loops=2).scores.shape[:2] == (1, 2)


def test_a_file_that_differs_from_provenance_is_named(finished_run, tmp_path):
    run = copy_run(finished_run, tmp_path)
    with open(run / "recipe.toml", "a") as f:
        f.write("\n")
    with pytest.raises(WorkbenchError, match=r"recipe\.toml: SHA-256 differs from the one recorded in provenance"):
        load_run(run)


def test_a_missing_listed_file_or_provenance_is_an_error(finished_run, tmp_path):
    run = copy_run(finished_run, tmp_path)
    (run / "metrics.jsonl").unlink()
    with pytest.raises(WorkbenchError, match=r"metrics\.jsonl: file listed in provenance\.json is missing"):
        load_run(run)
    (run / "provenance.json").unlink()
    with pytest.raises(WorkbenchError, match="provenance.json is missing"):
        load_run(run)


def test_missing_tensor_is_named(finished_run, tmp_path):
    run = copy_run(finished_run, tmp_path)
    rewrite_trainable(run, lambda t: t.pop("reentry.state_proj.bias"))
    with pytest.raises(WorkbenchError, match=r"trainable\.safetensors: missing tensor 'reentry\.state_proj\.bias'"):
        load_run(run)


def test_unexpected_tensor_is_named(finished_run, tmp_path):
    run = copy_run(finished_run, tmp_path)
    rewrite_trainable(run, lambda t: t.__setitem__("base.model.norm.weight", torch.ones(64)))
    with pytest.raises(WorkbenchError, match=r"trainable\.safetensors: unexpected tensor 'base\.model\.norm\.weight'"):
        load_run(run)


def test_misshapen_tensor_is_named(finished_run, tmp_path):
    run = copy_run(finished_run, tmp_path)
    rewrite_trainable(run, lambda t: t.__setitem__("reentry.gate", torch.ones(2)))
    with pytest.raises(WorkbenchError, match=r"tensor 'reentry\.gate' is \(2,\)"):
        load_run(run)


def test_wrong_base_model_is_refused(finished_run):
    with pytest.raises(WorkbenchError, match=r"base model 'tiny-qwen2' has weights SHA-256 .*a different base"):
        load_run(finished_run, base="tiny-qwen2")


def test_trained_tensors_are_exactly_the_trained_groups(finished_run):
    looped, _, info = load_run(finished_run)
    groups = parameter_groups(looped)
    expected = {n for g in info["retrofit"]["trained_groups"] for n, _ in groups[g]}
    assert expected == set(load_file(str(finished_run / "trainable.safetensors")))


def test_export_ships_a_loadable_run_without_checkpoints(finished_run, tmp_path):
    from workbench.runs import export_run

    keeper = export_run(finished_run, tmp_path / "keeper")
    assert {p.name for p in keeper.iterdir()} == {"trainable.safetensors", "retrofit.json", "recipe.toml",
                                                  "provenance.json", "metrics.jsonl"}
    looped, _, _ = load_run(keeper)
    assert torch.equal(dict(looped.named_parameters())["reentry.gate"],
                       load_file(str(finished_run / "trainable.safetensors"))["reentry.gate"])
    with pytest.raises(WorkbenchError, match="already exists"):
        export_run(finished_run, keeper)
