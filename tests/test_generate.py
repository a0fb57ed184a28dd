"""Generation at every loop count (`wb.generate`, `workbench generate`): loop 1 of a fresh retrofit is the
base's own generate, the KV cache is the uncached recomputation, native models match transformers' generate,
sampling is seeded, and bad input is one line before any model work."""

import json
import os

import pytest
import torch

import workbench as wb
from tests.conftest import PROMPTS, perturb
from tests.test_cli_errors import assert_clean_error, invoke
from workbench.checkpoints import parse_model
from workbench.loop.config import Block, RetrofitConfig
from workbench.loop.surgery import retrofit
from workbench.models import load_base
from workbench.runs import load_checkpoint
from workbench.tasks.reader import encode_prompts


def base_continuations(base, tok, prompts, n):
    enc = encode_prompts(tok, prompts)
    out = base.generate(enc.input_ids, attention_mask=enc.attention_mask, max_new_tokens=n, do_sample=False)
    return [row.tolist() for row in out[:, enc.input_ids.shape[1]:]]


def until_eos(tokens, eos):
    """transformers pads a finished row after its end-of-sequence token; `generate` stops the row there."""
    return tokens[:tokens.index(eos) + 1] if eos in tokens else tokens


@pytest.fixture
def varied():
    """tiny-llama moved off its init (so greedy continuations vary) and a fresh retrofit of it on layers 2..3."""
    base, tok = load_base("tiny-llama")
    perturb(base, scale=0.1, seed=1)
    return base, tok, retrofit(base, RetrofitConfig(Block(2, 4)))


@pytest.fixture
def looped_memory(tiny):
    """A perturbed retrofit of tiny-llama with re-entry, loop-time memory and loop codes all moved off init."""
    base, tok = tiny
    looped = retrofit(base, RetrofitConfig(Block(2, 4), reentry="bridge", memory=True, loop_codes=True))
    for part in (looped.reentry, looped.memory, looped.loop_codes):
        perturb(part, scale=0.05)
    return looped, tok


@pytest.mark.parametrize("cache", [True, False])
def test_loop_1_of_a_fresh_retrofit_generates_what_the_base_generates(varied, cache):
    base, tok, looped = varied
    frame = wb.generate(looped, tok, PROMPTS, loops=[1, 3], max_new_tokens=12, cache=cache)
    assert list(frame.columns) == ["prompt_index", "prompt", "loops", "text", "tokens", "n_tokens", "cached",
                                   "stopped"]
    assert frame.cached.tolist() == [cache] * 6
    expected = base_continuations(base, tok, PROMPTS, 12)
    eos = tok.eos_token_id
    assert frame[frame.loops == 1].tokens.tolist() == [until_eos(e, eos) for e in expected]
    assert len({tuple(t) for t in frame.tokens}) > 3           # the prompts (and loop 3) continue differently
    first = frame.iloc[0]
    assert first.text == tok.decode(first.tokens) and first.n_tokens == len(first.tokens) == 12


@pytest.mark.slow
def test_loop_1_of_a_fresh_retrofit_of_the_135m_model_generates_what_the_base_generates():
    base, tok = load_base("smollm2-135m-instruct")
    looped = retrofit(base, RetrofitConfig(Block(10, 16)))
    frame = wb.generate(looped, tok, PROMPTS, loops=[1, 4], max_new_tokens=16)
    expected = base_continuations(base, tok, PROMPTS, 16)
    assert frame[frame.loops == 1].tokens.tolist() == [until_eos(e, tok.eos_token_id) for e in expected]


def stepwise_logits(model, tok, prompts, loops, steps):
    """The largest |Δlogit| between decoding on `new_cache` and recomputing the whole sequence, over greedy steps."""
    enc = encode_prompts(tok, prompts)
    ids, mask = enc.input_ids, enc.attention_mask
    cache = model.new_cache(loops)
    worst = 0.0
    with torch.no_grad():
        cached = model(ids, mask, loops=loops, cache=cache).logits[:, -1]
        for _ in range(steps):
            full = model(ids, mask, loops=loops).logits[:, -1]
            worst = max(worst, float((full - cached).abs().max()))
            nxt = full.argmax(-1, keepdim=True)
            ids, mask = torch.cat([ids, nxt], 1), torch.cat([mask, torch.ones_like(nxt)], 1)
            cached = model(nxt, mask, loops=loops, cache=cache).logits[:, -1]
    return worst


def test_the_cache_gives_the_uncached_tokens_and_logits_on_a_retrofit_with_memory(looped_memory):
    looped, tok = looped_memory
    cached = wb.generate(looped, tok, PROMPTS, loops=[1, 2, 4], max_new_tokens=10, stop_at_eos=False)
    plain = wb.generate(looped, tok, PROMPTS, loops=[1, 2, 4], max_new_tokens=10, stop_at_eos=False, cache=False)
    assert cached.tokens.tolist() == plain.tokens.tolist()
    assert cached.cached.all() and not plain.cached.any()
    assert len({tuple(t) for t in cached[cached.prompt_index == 0].tokens}) > 1   # the loops differ
    for loops in (1, 2, 4):
        assert stepwise_logits(looped, tok, PROMPTS, loops, steps=6) < 1e-4


def test_a_cache_holds_one_loop_count(looped_memory):
    looped, tok = looped_memory
    enc = encode_prompts(tok, PROMPTS[:1])
    with pytest.raises(wb.WorkbenchError, match="holds 2 loops"):
        looped(enc.input_ids, enc.attention_mask, loops=3, cache=looped.new_cache(2))


@pytest.mark.parametrize("spec", ["tiny-inkling2-loop", "tiny-hrm-text"])
def test_native_models_generate_as_transformers_at_their_count_and_cache_exactly_past_it(spec):
    model, tok, _ = load_checkpoint(parse_model(spec))
    native, top = model.native_loops, model.max_loops
    frame = wb.generate(model, tok, PROMPTS, loops=[1, native, top], max_new_tokens=6)
    enc = encode_prompts(tok, PROMPTS)
    with torch.no_grad():
        own = model.generate(enc.input_ids, enc.attention_mask, max_new_tokens=6, do_sample=False)
    expected = [until_eos(row.tolist(), tok.eos_token_id) for row in own[:, enc.input_ids.shape[1]:]]
    assert frame[frame.loops == native].tokens.tolist() == expected          # transformers' own path
    plain = wb.generate(model, tok, PROMPTS[:2], loops=[1, top], max_new_tokens=6, cache=False)
    assert frame[(frame.prompt_index < 2) & (frame.loops != native)].tokens.tolist() == plain.tokens.tolist()
    assert frame.cached.all()
    assert stepwise_logits(model, tok, PROMPTS[:2], top, steps=3) < 1e-4     # past the native count
    assert frame.attrs["native_loops"] == native


def test_sampling_is_seeded_and_leaves_the_global_generator_alone(varied):
    _, tok, looped = varied
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    runs = [wb.generate(looped, tok, PROMPTS[:2], loops=[1, 2], max_new_tokens=10, sample=True, seed=s,
                        temperature=1.5) for s in (7, 7, 8)]
    assert torch.equal(torch.random.get_rng_state(), before)
    assert runs[0].tokens.tolist() == runs[1].tokens.tolist()
    assert runs[0].tokens.tolist() != runs[2].tokens.tolist()
    greedy = wb.generate(looped, tok, PROMPTS[:2], loops=[1, 2], max_new_tokens=10)
    assert greedy.tokens.tolist() != runs[0].tokens.tolist()
    top1 = wb.generate(looped, tok, PROMPTS[:2], loops=[1, 2], max_new_tokens=10, sample=True, top_k=1, seed=9)
    assert top1.tokens.tolist() == greedy.tokens.tolist()                      # top-1 sampling is greedy
    alone = wb.generate(looped, tok, PROMPTS[:2], loops=[2], max_new_tokens=10, sample=True, seed=7, temperature=1.5)
    assert alone.tokens.tolist() == runs[0][runs[0].loops == 2].tokens.tolist()   # one stream per loop count


def test_a_row_stops_at_the_end_of_sequence_token(varied):
    base, tok, looped = varied
    first = wb.generate(looped, tok, PROMPTS, loops=[1], max_new_tokens=6, stop_at_eos=False)
    stop = first.tokens.iloc[0][2]
    base.generation_config.eos_token_id = stop
    frame = wb.generate(looped, tok, PROMPTS, loops=[1], max_new_tokens=6)
    row = frame.iloc[0]
    assert row.stopped == "eos" and row.tokens == first.tokens.iloc[0][:3] and row.n_tokens == 3
    assert row.text == tok.decode(row.tokens[:2])                              # the stop token is not in the text
    for i in (1, 2):                                                           # the others run on, unchanged
        mine = frame.tokens.iloc[i]
        assert mine == until_eos(first.tokens.iloc[i], stop)
        assert frame.stopped.iloc[i] == ("eos" if stop in mine else "length")


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(prompts=[]), "no prompt"),
    (dict(prompts=["ok", "  "]), "prompt 2 is empty"),
    (dict(loops=[0]), "outside 1..16"),
    (dict(loops=[17]), "outside 1..16"),
    (dict(loops=[2, 2]), "given twice"),
    (dict(loops=[]), "no loop count"),
    (dict(max_new_tokens=0), "max_new_tokens=0"),
    (dict(temperature=0.0), "temperature"),
    (dict(top_k=0), "top_k"),
    (dict(max_new_tokens=5000), "positions"),
])
def test_bad_arguments_are_one_line_errors_before_any_model_work(tiny, monkeypatch, kwargs, fragment):
    base, tok = tiny
    looped = retrofit(base, RetrofitConfig(Block(2, 4)))
    monkeypatch.setattr(looped, "forward", lambda *a, **k: pytest.fail("the model ran"))
    args = dict(prompts=["A prompt"], loops=[1, 2], max_new_tokens=4) | kwargs
    with pytest.raises(wb.WorkbenchError, match=fragment):
        wb.generate(looped, tok, args.pop("prompts"), **args)


def test_the_command_prints_every_loop_count_side_by_side(capsys, monkeypatch):
    code, out, err = invoke(capsys, monkeypatch, "generate", "tiny-llama", "--block", "2:4", "--prompt",
                            "The capital of France is", "--prompt", "One\ntwo:", "--loops", "1,2,4",
                            "--max-new-tokens", "6")
    assert code == 0, err
    assert "prompt 2: One⏎two:" in out and "greedy, on a KV cache" in out
    assert max(len(line) for line in out.splitlines()) <= 100
    assert "\n     4 " in out


def test_the_command_json_is_one_object(capsys, monkeypatch):
    code, out, err = invoke(capsys, monkeypatch, "generate", "tiny-hrm-text", "--prompt", "Hello", "--loops", "1-4",
                            "--max-new-tokens", "3", "--sample", "--seed", "5", "--no-cache", "--json")
    assert code == 0, err
    record = json.loads(out)
    assert record["settings"]["loops"] == [1, 2, 3, 4] and record["settings"]["cached"] is False
    assert record["model"]["native_loops"] == 2 and record["wrote"] == []
    assert [r["loops"] for r in record["rows"]] == [1, 2, 3, 4]
    assert all(len(r["tokens"]) == r["n_tokens"] <= 3 for r in record["rows"])


@pytest.mark.parametrize("args, fragment", [
    (["--prompt", ""], "prompt 1 is empty"),
    ([], "no prompt"),
    (["--prompt", "hi", "--loops", "1,x"], "--loops '1,x'"),
    (["--prompt", "hi", "--loops", "4-2"], "--loops '4-2'"),
    (["--prompt", "hi", "--loops", "1,17"], "outside 1..16"),
    (["--prompt", "hi", "--max-new-tokens", "0"], "max_new_tokens=0"),
    (["--prompt", "hi", "--max-new-tokens", "-3"], "max_new_tokens=-3"),
    (["--prompt", "hi", "--sample", "--temperature", "0"], "temperature"),
])
def test_bad_command_input_is_one_line_exit_2_and_writes_nothing(capsys, monkeypatch, tmp_path, args, fragment):
    monkeypatch.chdir(tmp_path)
    code, out, err = invoke(capsys, monkeypatch, "generate", "tiny-llama", "--block", "2:4", *args)
    assert_clean_error(code, err, fragment)
    assert out in ("", "loading tiny-llama\n") and os.listdir(tmp_path) == []   # loops are checked once it loads


def test_loops_past_a_native_models_range_are_refused(capsys, monkeypatch):
    code, _, err = invoke(capsys, monkeypatch, "generate", "tiny-hrm-text", "--prompt", "hi", "--loops", "5")
    assert_clean_error(code, err, "outside 1..4")

