"""Model files checked before they cost anything (issue 29, item 4): a weights file without the model's tensors,
a config that does not match its weights, a pickle renamed to .safetensors and non-finite trained tensors
in a run are one-line errors with exit 2, found from the safetensors headers before any allocation."""

import json
import pickle
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.test_cli_errors import assert_clean_error, copy_run, invoke, probe_args
from workbench.errors import WorkbenchError
from workbench.models import bases, load_base
from workbench.models.weights_check import read_safetensors_index


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    model, tok = load_base("tiny-llama")
    path = tmp_path_factory.mktemp("hf") / "tiny"
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _damaged(hf_dir, tmp_path, how):
    path = tmp_path / "m"
    shutil.copytree(hf_dir, path)
    weights = path / "model.safetensors"
    if how == "no model tensors":
        save_file({"foo": torch.zeros(2)}, str(weights))
    elif how == "config for a bigger model":
        config = json.loads((path / "config.json").read_text())
        config.update(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=32, head_dim=128)
        (path / "config.json").write_text(json.dumps(config))
    elif how == "84 bytes":
        weights.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      " + b"x" * 68)
    elif how == "pickle renamed":
        weights.write_bytes(pickle.dumps({"model.embed_tokens.weight": [0.0] * 8}))
    elif how == "a wider layer":
        tensors = load_file(str(weights))
        name = "model.layers.0.mlp.up_proj.weight"
        tensors[name] = torch.zeros(tensors[name].shape[0] + 1, tensors[name].shape[1])
        save_file(tensors, str(weights))
    elif how == "integer tensor":
        tensors = load_file(str(weights))
        name = "model.norm.weight"
        tensors[name] = tensors[name].to(torch.int32)
        save_file(tensors, str(weights))
    return path


@pytest.mark.parametrize("how", ["no model tensors", "config for a bigger model", "84 bytes", "pickle renamed",
                                 "a wider layer", "integer tensor"])
def test_bad_model_directory_is_one_line_before_allocation(capsys, monkeypatch, tmp_path, hf_dir, how):
    path = _damaged(hf_dir, tmp_path, how)
    built = []  # models built off the meta device: the 3 GB config must be refused from its headers first
    for name in ("from_pretrained", "from_config"):
        real = getattr(bases.AutoModelForCausalLM, name)

        def counted(*args, _real=real, **kwargs):
            if torch.get_default_device().type != "meta":  # the header check builds its shapes on meta
                built.append(args)
            return _real(*args, **kwargs)
        monkeypatch.setattr(bases.AutoModelForCausalLM, name, counted)
    code, _, err = invoke(capsys, monkeypatch, "identity", "--model", path, "--block", "1:2")
    assert_clean_error(code, err, str(path))
    assert built == []


def test_a_good_model_directory_still_loads(hf_dir):
    model, _ = load_base(hf_dir)
    assert sum(p.numel() for p in model.parameters()) > 0


def test_header_reader_refuses_a_tensor_outside_the_file(tmp_path):
    path = tmp_path / "t.safetensors"
    save_file({"a": torch.zeros(4, 4)}, str(path))
    data = path.read_bytes()
    path.write_bytes(data[:-8])  # the tensor's bytes cut short
    with pytest.raises(WorkbenchError, match="out-of-file"):
        read_safetensors_index(path)


def _refresh(run, name):
    from workbench.io import sha256_file

    prov = json.loads((run / "provenance.json").read_text())
    prov["files"][name] = sha256_file(run / name)
    (run / "provenance.json").write_text(json.dumps(prov))


@pytest.mark.parametrize("bad", ["nan", "inf", "pickle"])
def test_a_run_with_non_finite_or_unreadable_tensors_is_refused(capsys, monkeypatch, tmp_path, tiny_run,
                                                                 tiny_manifest, bad):
    run = copy_run(tiny_run, tmp_path)
    weights = run / "trainable.safetensors"
    if bad == "pickle":
        weights.write_bytes(pickle.dumps({"x": 1}))
    else:
        tensors = load_file(str(weights))
        tensors = {k: torch.full_like(v, float(bad)) for k, v in tensors.items()}
        save_file(tensors, str(weights))
    _refresh(run, "trainable.safetensors")  # digests recomputed: the check is on the values, not the hash
    out = tmp_path / "out"
    code, _, err = invoke(capsys, monkeypatch, *probe_args(run, tiny_manifest, out))
    assert_clean_error(code, err, "trainable.safetensors", "NaN or inf" if bad != "pickle" else "safetensors")
    assert not out.exists()
