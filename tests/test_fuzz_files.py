"""Fuzzing the files a user hands in: model files, run directories, recipe numbers and CLI numbers.

`hypothesis` generates each family (not a fixed list): GGUF headers with arbitrary counts and
sizes, model and run files cut at any byte or with bytes flipped, retrofit.json with fields
replaced, recipe numbers that are non-finite or out of range, and loop counts of any size. The
only allowed outcomes are a value or a one-line WorkbenchError; nothing allocates for what a file
merely declares.
"""

import json
import shutil
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.test_cli_errors import assert_clean_error, invoke, refresh_provenance
from tests.test_fuzz import GOOD_ROW  # at the top: importing it inside a @given test nests its @given
from workbench.errors import WorkbenchError
from workbench.loop.config import Block, RetrofitConfig
from workbench.models.gguf_header import read_header

FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
FEW = settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def one_line(err: WorkbenchError) -> None:
    assert str(err) and "\n" not in str(err)


@pytest.fixture(scope="module")
def small_gguf(tmp_path_factory) -> bytes:
    """The bytes of a valid GGUF: an architecture, a string array and two small tensors."""
    from gguf import GGUFWriter

    path = tmp_path_factory.mktemp("gguf") / "m.gguf"
    w = GGUFWriter(str(path), "llama")
    w.add_array("tokenizer.ggml.tokens", ["a", "bb", "ccc"])
    w.add_tensor("token_embd.weight", np.ones((4, 8), dtype=np.float32))
    w.add_tensor("output_norm.weight", np.ones(8, dtype=np.float32))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()  # noqa: E702
    return path.read_bytes()


def test_a_valid_gguf_header_reads(small_gguf, tmp_path):
    path = tmp_path / "m.gguf"
    path.write_bytes(small_gguf)
    assert read_header(path) == {"version": 3, "architecture": "llama", "tensors": 2}


@FUZZ
@given(cut=st.integers(0, 10_000))
def test_a_truncated_gguf_is_refused(small_gguf, tmp_path_factory, cut):
    cut = cut % len(small_gguf)
    path = tmp_path_factory.mktemp("g") / "cut.gguf"
    path.write_bytes(small_gguf[:cut])
    with pytest.raises(WorkbenchError) as exc:
        read_header(path)
    one_line(exc.value)


@FUZZ
@given(version=st.sampled_from([2, 3]) | st.integers(0, 2 ** 32 - 1), n_tensors=st.integers(0, 2 ** 64 - 1),
       n_kv=st.integers(0, 2 ** 64 - 1), rest=st.binary(max_size=120))
def test_a_crafted_gguf_header_is_refused_before_any_allocation(tmp_path_factory, version, n_tensors, n_kv, rest):
    """114 bytes may declare 2^64 tensors or key-values, or strings and arrays of any length."""
    path = tmp_path_factory.mktemp("g") / "crafted.gguf"
    path.write_bytes(struct.pack("<4sIQQ", b"GGUF", version, n_tensors, n_kv) + rest)
    try:
        header = read_header(path)
    except WorkbenchError as err:
        one_line(err)
        return
    assert header["tensors"] * 24 <= len(rest)  # what it read, the file held


@FUZZ
@given(start=st.binary(max_size=64).filter(lambda b: not b.startswith(b"GGUF")))
def test_a_file_named_gguf_that_is_not_one(tmp_path_factory, start):
    path = tmp_path_factory.mktemp("g") / "something.gguf"
    path.write_bytes(start)
    with pytest.raises(WorkbenchError) as exc:
        read_header(path)
    one_line(exc.value)


def test_the_cli_refuses_a_text_file_named_gguf(capsys, monkeypatch, tmp_path):
    path = tmp_path / "something.gguf"
    path.write_text("just some text\n")
    code, _, err = invoke(capsys, monkeypatch, "identity", "--model", path, "--block", "1:2")
    assert_clean_error(code, err, "is not a GGUF file")


# --- a Hugging Face model directory whose weights or config are damaged -------------------------

@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    from workbench.models import load_base

    model, tok = load_base("tiny-llama")
    path = tmp_path_factory.mktemp("hf") / "tiny"
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@FEW
@given(cut=st.floats(0.0, 0.999), flip=st.none() | st.integers(0, 4000))
def test_damaged_safetensors_weights(hf_dir, tmp_path_factory, cut, flip):
    from workbench.models import load_base

    copy = tmp_path_factory.mktemp("hf") / "tiny"
    shutil.copytree(hf_dir, copy)
    weights = copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    if flip is None:
        data = data[:int(len(data) * cut)]
    else:
        data[flip % len(data)] ^= 0xFF
    weights.write_bytes(bytes(data))
    try:
        load_base(copy)
    except WorkbenchError as err:
        one_line(err)


@FEW
@given(garbage=st.none() | st.binary(max_size=40),
       key=st.sampled_from(["model_type", "hidden_size", "num_attention_heads", "vocab_size", "rope_theta"]),
       value=st.integers(-3, 0) | st.text(max_size=5) | st.none())
def test_a_damaged_config(hf_dir, tmp_path_factory, garbage, key, value):
    """The saved config with bytes replaced, or one field edited (never to a size that would allocate a large model)."""
    from workbench.models import load_base

    copy = tmp_path_factory.mktemp("hf") / "tiny"
    shutil.copytree(hf_dir, copy)
    config = json.loads((copy / "config.json").read_text())
    config[key] = value
    (copy / "config.json").write_bytes(garbage if garbage is not None else json.dumps(config).encode())
    try:
        load_base(copy)
    except WorkbenchError as err:
        one_line(err)


# --- run directories with an edited retrofit.json -------------------------------------------------

FIELDS = ["base", "base.spec", "base.sha256", "base.dtype", "base.attn_implementation", "settings",
          "settings.block", "settings.reentry", "settings.max_loops", "trained_groups"]
VALUES = (st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70) | st.text(max_size=6)
          | st.lists(st.integers(), max_size=3))


@FEW
@given(field=st.sampled_from(FIELDS), value=VALUES, delete=st.booleans())
def test_an_edited_retrofit_record(tiny_run, tmp_path_factory, field, value, delete):
    from workbench.runs import load_run

    run = tmp_path_factory.mktemp("r") / "run"
    shutil.copytree(tiny_run, run)
    record = json.loads((run / "retrofit.json").read_text())
    *parents, last = field.split(".")
    node = record
    for p in parents:
        node = node[p]
    if delete:
        node.pop(last, None)
    else:
        node[last] = value
    (run / "retrofit.json").write_text(json.dumps(record))
    refresh_provenance(run, "retrofit.json")  # as someone editing a run by hand would
    try:
        load_run(run)
    except WorkbenchError as err:
        one_line(err)


@FEW
@given(name=st.sampled_from(["retrofit.json", "provenance.json"]), cut=st.floats(0.0, 0.99))
def test_a_truncated_run_file(tiny_run, tmp_path_factory, name, cut):
    from workbench.runs import load_run

    run = tmp_path_factory.mktemp("r") / "run"
    shutil.copytree(tiny_run, run)
    data = (run / name).read_bytes()
    (run / name).write_bytes(data[:int(len(data) * cut)])
    if name == "retrofit.json":
        refresh_provenance(run, name)
    with pytest.raises(WorkbenchError) as exc:
        load_run(run)
    one_line(exc.value)


def test_a_run_directory_that_is_a_file(capsys, monkeypatch, tmp_path):
    run = tmp_path / "run"
    run.write_text("not a directory")
    code, _, err = invoke(capsys, monkeypatch, "probe", "--checkpoint", run, "--only", "depth_matrix",
                          "--out", tmp_path / "out")
    assert_clean_error(code, err, str(run))
    assert not (tmp_path / "out").exists()


# --- recipe numbers and CLI numbers ------------------------------------------------------------

NUMERIC_KEYS = ["optim.lr", "optim.prelude_lr_mult", "optim.eps", "optim.weight_decay", "optim.grad_clip",
                "optim.momentum", "preserve.kl_weight", "guardrail.max_drop", "lora.alpha", "lora.dropout",
                "halting.lr", "sampler.mean", "sampler.sigma", "optim.betas"]


@FUZZ
@given(key=st.sampled_from(NUMERIC_KEYS), text=st.sampled_from(["nan", "inf", "-inf", "+inf"]))
def test_non_finite_recipe_numbers_are_refused(key, text):
    from workbench.defaults import resolve
    from workbench.train.recipe import Recipe

    value = f"[0.9, {text}]" if key == "optim.betas" else text
    with pytest.raises(WorkbenchError) as exc:
        Recipe.from_toml(resolve("recipe", "smollm2_lora_chase"), [f"{key}={value}"])
    one_line(exc.value)
    # float keys say "finite"; an int key (lora.alpha) refuses nan and inf as not an int
    assert key in str(exc.value) and ("finite" in str(exc.value) or "of type int" in str(exc.value))


@FUZZ
@given(key=st.sampled_from(["model.max_loops", "optim.batch_size", "lora.r", "stages.0.steps", "task.alphabet"]),
       value=st.integers(-2 ** 63, 0) | st.integers(10 ** 9, 2 ** 63) | st.floats(allow_nan=True) | st.text(max_size=4))
def test_nonsense_recipe_sizes_are_refused(key, value):
    from workbench.defaults import resolve
    from workbench.train.recipe import Recipe

    with pytest.raises(WorkbenchError) as exc:
        Recipe.from_toml(resolve("recipe", "smollm2_lora_chase"), {key: value})
    one_line(exc.value)


@pytest.mark.slow   # 40 generated loop counts (12.2 s quiet); tests/test_cli_errors.py keeps 0 and 65 fast
@FUZZ
@given(loops=st.integers(-2 ** 70, 0) | st.integers(65, 2 ** 70) | st.sampled_from(["1.5", "two", "", "1e3", "nan"]))
def test_cli_loop_counts_outside_the_limit(capsys, monkeypatch, loops):
    code, _, err = invoke(capsys, monkeypatch, "identity", "--model", "tiny-llama", "--block", "1:3",
                          "--loops", str(loops))
    assert_clean_error(code, err, "loops")


@FEW
@given(max_loops=st.integers(65, 2 ** 70) | st.integers(-2 ** 70, 0))
def test_max_loops_is_refused_before_any_hook_is_allocated(max_loops):
    from workbench.loop.config import MAX_LOOPS
    from workbench.loop.surgery import retrofit
    from workbench.models import load_base

    model, _ = load_base("tiny-llama")
    with pytest.raises(WorkbenchError) as exc:
        retrofit(model, RetrofitConfig(Block(1, 3), max_loops=max_loops))
    assert f"1..{MAX_LOOPS}" in str(exc.value)


def test_a_prompt_longer_than_the_model_is_refused(tiny_run):
    import torch

    from workbench.runs import load_run

    looped, _, _ = load_run(tiny_run)
    n = looped.config.max_position_embeddings + 1
    with pytest.raises(WorkbenchError, match=f"a prompt of {n} tokens is longer than the model's"):
        looped.read(torch.zeros(1, n, dtype=torch.long), loops=1)


# --- Python API misuse ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def looped():
    from workbench.loop.surgery import retrofit
    from workbench.models import load_base

    model, tok = load_base("tiny-llama")
    return retrofit(model, RetrofitConfig(Block(2, 4), max_loops=3)).eval(), tok


@FUZZ
@given(name=st.text(max_size=30) | st.builds("loop.{}.hook_state".format, st.integers(-3, 10)))
def test_a_hook_name_that_does_not_exist_is_an_error(looped, name):
    import torch

    model, _ = looped
    ids = torch.tensor([[1, 2, 3]])
    if name in model.hook_dict:  # loop.1.hook_state .. loop.3.hook_state: real names are the contract's
        return
    for call in (lambda: model.run_with_cache(ids, loops=1, names_filter=[name]),
                 lambda: model.run_with_hooks(ids, loops=1, fwd_hooks=[(name, lambda x, hook: x)])):
        with pytest.raises(WorkbenchError, match="does not exist on this retrofit"):
            call()


@FUZZ
@given(position=st.integers(-10, 10), candidate=st.integers(-10, 60_000), batch=st.integers(0, 2))
def test_read_refuses_positions_candidates_and_batches_out_of_range(looped, position, candidate, batch):
    import torch

    model, tok = looped
    ids = torch.ones(batch, 4, dtype=torch.long)
    ok = batch >= 1 and 0 <= position < 4 and 0 <= candidate < len(tok)
    try:
        r = model.read(ids, loops=2, positions=torch.tensor([position]), candidates=torch.tensor([candidate]))
    except WorkbenchError as err:
        assert not ok, err
        one_line(err)
        return
    assert ok and r.scores.shape == (batch, 2, 1, 1)


# --- manifests: line endings, duplicates, emptiness, unicode ---------------------------------------

EDITS = {
    "crlf": lambda text: text.replace("\n", "\r\n"),
    "duplicate": lambda text: text + (text.splitlines(keepends=True) or [""])[0],
    "empty": lambda text: "",
    "bom": lambda text: "\ufeff" + text,
    "unicode": lambda text: text.replace("Answer", "Ответ\u2028"),
    "no final newline": lambda text: text.rstrip("\n"),
}


@FUZZ
@given(edits=st.lists(st.sampled_from(sorted(EDITS)), min_size=1, max_size=3), resign=st.booleans())
def test_edited_manifests(tmp_path_factory, edits, resign):
    """Each edit, with the sidecar left alone or rewritten to match: rows or one line, never a traceback."""
    from workbench.tasks.manifest import read_manifest, sidecar_path, summarize, write_manifest

    path = tmp_path_factory.mktemp("m") / "rows.jsonl"
    write_manifest([GOOD_ROW, dict(GOOD_ROW, row_id="r1")], path)
    text = path.read_text(encoding="utf-8")
    for e in edits:
        text = EDITS[e](text)
    path.write_bytes(text.encode("utf-8"))
    if resign:  # a sidecar rewritten over the edited rows, as a careless user might
        try:
            rows = [json.loads(line) for line in text.replace("\ufeff", "").split("\n") if line.strip()]
            sidecar_path(path).write_text(json.dumps(summarize(rows, path.name)))
        except (WorkbenchError, TypeError, KeyError, ValueError):  # rows a careless user could not re-sign either
            pass
    try:
        manifest = read_manifest(path)
    except WorkbenchError as err:
        one_line(err)
        return
    ids = [r["row_id"] for r in manifest.rows]
    assert ids and len(ids) == len(set(ids))  # an accepted manifest has rows, each id once
