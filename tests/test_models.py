"""Base-model loading: tiny configs, HF directories, GGUF files, the embedded default, errors."""

from pathlib import Path

import pytest
import torch

from workbench.errors import WorkbenchError
from workbench.models import bases
from workbench.models.bases import embedded_gguf_path, load_base, weights_sha256


@pytest.mark.parametrize("spec,family", [("tiny-llama", "llama"), ("tiny-qwen2", "qwen2"), ("tiny-qwen3", "qwen3")])
def test_tiny_configs_are_seeded_and_small(spec, family):
    a, tok = load_base(spec)
    b, _ = load_base(spec)
    assert a.config.model_type == family and a.config.hidden_size == 64
    assert weights_sha256(a) == weights_sha256(b)  # seeded: the same weights every time
    assert tok.padding_side == "left" and tok.pad_token_id is not None
    assert len(tok(" Ben").input_ids) == 1  # a real tokenizer, not a stub


def test_hf_directory_round_trip(tmp_path, tiny):
    model, tok = tiny
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    again, tok2 = load_base(tmp_path)
    ids = tok("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        assert torch.equal(model(ids).logits, again(ids).logits)
    assert again.workbench_spec == str(tmp_path)


def test_errors_name_the_spec_and_what_is_accepted(tmp_path):
    with pytest.raises(WorkbenchError, match=r"'no-such-model' does not exist.*tiny-llama"):
        load_base("no-such-model")
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(WorkbenchError, match="neither a .gguf file nor a directory with config.json"):
        load_base(tmp_path / "notes.txt")


def test_unsupported_gguf_architecture(tmp_path):
    import numpy as np
    from gguf import GGUFWriter

    path = tmp_path / "tiny-bert.gguf"
    writer = GGUFWriter(str(path), "bert")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(WorkbenchError, match="architecture 'bert'.*supported: llama, mistral, qwen2, qwen3"):
        load_base(path)


def test_embedded_default_found_through_metadata():
    path = embedded_gguf_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 50_000_000


@pytest.mark.slow
def test_embedded_default_loads_from_cache_fast(monkeypatch):
    load_base("smollm2-135m-instruct")  # dequantizes once if the cache is cold
    # fast is from the safetensors cache: counted as no second dequantization, not timed (a loaded machine is slow)
    monkeypatch.setattr(bases, "_load_gguf", lambda *args: pytest.fail("the GGUF was dequantized again"))
    model, tok = load_base("smollm2-135m-instruct")
    assert model.config.num_hidden_layers == 30 and model.config.hidden_size == 576
    # The 4-bit checkpoint, dequantized, still knows its facts at the next token.
    for prompt, expected in [("The capital of France is", " Paris"), ("One, two, three, four,", " five")]:
        ids = tok(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            assert tok.decode(model(ids).logits[0, -1].argmax()) == expected


@pytest.mark.slow
def test_a_gguf_file_loads_as_transformers_loads_it():
    """`load_base` on a .gguf parses the file once (`bases._gguf_read_once`), where transformers' own load parses it
    three times: the tensors and the tokenizer are transformers' own, and so is the embedded default's cache."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = embedded_gguf_path()
    model, tok = load_base(path)
    plain = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    plain_tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    theirs, ours = plain.state_dict(), model.state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in theirs)
    text = "Hello world: the capital of France is"
    assert tok.get_vocab() == plain_tok.get_vocab() and tok(text).input_ids == plain_tok(text).input_ids
    cached, _ = load_base("smollm2-135m-instruct")
    assert all(torch.equal(t, theirs[k]) for k, t in cached.state_dict().items())


@pytest.mark.slow
def test_a_cold_and_a_warm_load_leave_the_seeded_rng_where_it_was(tmp_path, monkeypatch):
    # A seeded run draws LoRA's A matrices after loading its base: the first load on a machine (dequantizing
    # the GGUF into an empty cache) must not move the RNG, or the run would depend on the cache's state
    # (the chase memory keeper's first recording did: its step-2 loss differed from every rerun by 0.4%).
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))
    draws = []
    for _ in ("cold", "warm"):
        torch.manual_seed(20260702)
        load_base("smollm2-135m-instruct")
        draws.append(torch.rand(4))
    torch.manual_seed(20260702)
    assert torch.equal(draws[0], torch.rand(4)) and torch.equal(draws[1], draws[0])
    assert (tmp_path / "cache" / "smollm2-135m-instruct" / "model.safetensors").is_file()


def test_a_cold_cache_filled_by_two_processes_keeps_the_first_copy(tmp_path, monkeypatch, tiny):
    """Two processes on a cold cache (two pytest-xdist workers, two commands) both dequantize and save: the one that
    renames its copy second keeps the first's, whole, and leaves no temporary copy."""
    model, tok = tiny
    target = tmp_path / "cache" / "smollm2-135m-instruct"
    rename = bases.os.replace

    def the_other_process_renames_first(src, dst):
        if Path(dst) == target:
            target.mkdir()
            (target / "config.json").write_text("theirs")
        return rename(src, dst)

    monkeypatch.setattr(bases.os, "replace", the_other_process_renames_first)
    bases._save_atomically(model, tok, target)
    assert [p.name for p in target.parent.iterdir()] == [target.name]
    assert [p.name for p in target.iterdir()] == ["config.json"] and (target / "config.json").read_text() == "theirs"


def test_a_loaded_base_keeps_transformers_torch_layers(tmp_path, tiny):
    """transformers 5.x turns `use_kernels` on in from_pretrained when `kernels` (one of its own dependencies) is
    installed, and kernelizes again at each .train(): on the first GPU run (docs/gpu.md), the trainer's .train()
    fetched layer code from the Hugging Face hub and, with no network, stopped the run. A base loaded by the workbench
    keeps transformers' PyTorch layers, also after .train() and .eval()."""
    model, tok = tiny
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    again, _ = load_base(tmp_path)
    for mode in (True, False):
        again.train(mode)
        assert not again.use_kernels and again.kernels_mode is None
