"""`wb.lens` and `workbench lens`: a per-loop lens on any prompt (issue: your prompts, your question).

The coda lens at the last loop must be the model's own next-token distribution (1e-5) on a retrofit and on
both native families; planted cases fix the raw lens (a retrofit without Coda layers reads raw = coda), the
ranks of targets, entropy and KL; bad input is one line, exit 2, and nothing written.
"""

import json
import math

import numpy as np
import pytest
import torch

from tests.conftest import perturb
from tests.test_cli_errors import invoke  # the in-process CLI runner
from workbench.errors import WorkbenchError
from workbench.lenses import fit_tuned_lens, lens, load_tuned_lens, save_tuned_lens
from workbench.loop.config import Block, RetrofitConfig
from workbench.loop.surgery import retrofit
from workbench.models import load_base, load_looped

PROMPTS = ["The capital of France is", "A -> C\nB -> A\nC -> B\nStart at A. Apply the table 2 times.\nAnswer:",
           "1 + 1 ="]


@pytest.fixture(scope="module")
def looped():
    base, tok = load_base("tiny-llama")
    m = retrofit(base, RetrofitConfig(Block(2, 4), reentry="bridge", max_loops=6))
    perturb(m.reentry, scale=0.5)   # later loops differ from loop 1
    m.eval()
    return m, tok


def _final(frame, i, T):
    last = frame[frame.prompt_index == i].position.max()
    return frame[(frame.prompt_index == i) & (frame.position == last) & (frame.loop == T) & (frame.lens == "coda")]


def test_coda_lens_at_the_last_loop_is_the_model_output_on_a_retrofit(looped):
    model, tok = looped
    frame = lens(model, tok, PROMPTS, loops=4, top_k=8)
    enc = tok(PROMPTS, return_tensors="pt", padding=True, padding_side="left")
    with torch.no_grad():
        p = model(enc.input_ids, enc.attention_mask, loops=4).logits[:, -1].double().softmax(-1)
    for i in range(len(PROMPTS)):
        top = _final(frame, i, 4)
        top = top[top.kind == "top"]
        assert list(top.token_id) == p[i].topk(8).indices.tolist()
        np.testing.assert_allclose(top.prob.values, p[i, top.token_id.tolist()].numpy(), atol=1e-5)
        assert (top.kl_to_last.abs() < 1e-9).all()
    assert set(frame.loop) == {1, 2, 3, 4} and set(frame.lens) == {"coda", "raw"}
    assert frame.attrs["loops"] == 4 and frame.attrs["kind"] == "retrofit"
    # later loops really differ (a lens that read loop T four times would pass the check above)
    first = _final(frame, 1, 4)
    one = frame[(frame.prompt_index == 1) & (frame.position == first.position.iloc[0]) & (frame.loop == 1)
                & (frame.lens == "coda")]
    assert one.kl_to_last.iloc[0] > 1e-6


@pytest.mark.parametrize("name", ["tiny-inkling2-loop", "tiny-hrm-text"])
def test_coda_lens_at_the_last_loop_is_transformers_output_on_native_models(name):
    model, tok = load_looped(name)
    for i, prompt in enumerate(PROMPTS):          # one prompt at a time: transformers' forward counts padding
        frame = lens(model, tok, prompt, top_k=6)
        T = model.native_loops
        assert frame.attrs["loops"] == T and frame.attrs["kind"] == "native"
        enc = tok([prompt], return_tensors="pt")
        with torch.no_grad():
            p = model.base(**enc).logits[0, -1].double().softmax(-1)   # transformers' own forward
        top = _final(frame, 0, T)
        top = top[top.kind == "top"]
        assert list(top.token_id) == p.topk(6).indices.tolist()
        np.testing.assert_allclose(top.prob.values, p[top.token_id.tolist()].numpy(), atol=1e-5)


def test_raw_equals_coda_without_coda_layers_and_differs_with_them():
    base, tok = load_base("tiny-llama")
    m = retrofit(base, RetrofitConfig(Block(2, base.config.num_hidden_layers), max_loops=3))   # the Coda is the final norm only
    perturb(m.reentry, scale=0.5)
    frame = lens(m, tok, PROMPTS[:2], loops=3)
    coda = frame[frame.lens == "coda"].reset_index(drop=True)
    raw = frame[frame.lens == "raw"].reset_index(drop=True)
    assert list(coda.token_id) == list(raw.token_id)
    np.testing.assert_allclose(coda.prob, raw.prob, atol=1e-9)
    base2, _ = load_base("tiny-llama")
    with_coda = lens(retrofit(base2, RetrofitConfig(Block(1, 3), max_loops=3)), tok, PROMPTS[0], loops=3)
    a, b = (with_coda[(with_coda.lens == n) & (with_coda.kind == "top")].prob.values for n in ("coda", "raw"))
    assert np.abs(a - b).max() > 1e-6


def test_targets_ranks_entropy_and_positions(looped):
    model, tok = looped
    frame = lens(model, tok, PROMPTS[0], loops=3, top_k=3, positions="0,-1")
    top1 = frame[(frame.kind == "top") & (frame.k == 0) & (frame.lens == "coda") & (frame.loop == 2)].iloc[-1]
    again = lens(model, tok, PROMPTS[0], loops=3, top_k=3, positions=[-1], targets=[top1.token, " Paris"])
    tgt = again[(again.kind == "target") & (again.lens == "coda") & (again.loop == 2)]
    assert tgt[tgt.k == 0]["rank"].iloc[0] == 0 and tgt[tgt.k == 0].prob.iloc[0] == pytest.approx(top1.prob)
    paris = tgt[tgt.k == 1].iloc[0]
    assert paris.token == " Paris" and paris["rank"] > 0
    # the rank is the number of more probable tokens: recount from the full distribution
    enc = tok([PROMPTS[0]], return_tensors="pt")
    with torch.no_grad():
        r = model.read(enc.input_ids, enc.attention_mask, loops=3)
    p = r.scores[0, 1, 0].double().softmax(-1)
    pid = tok.encode(" Paris", add_special_tokens=False)[0]
    assert paris["rank"] == int((p > p[pid]).sum())
    assert paris.entropy == pytest.approx(float(-(p * p.log()).sum()), rel=1e-9)
    assert sorted(frame.position.unique()) == [0, len(enc.input_ids[0]) - 1]
    assert len(lens(model, tok, PROMPTS[0], loops=2, positions="all").position.unique()) == enc.input_ids.shape[1]


def test_batched_prompts_read_as_one_at_a_time(looped):
    model, tok = looped
    together = lens(model, tok, PROMPTS, loops=3, top_k=4, batch_size=8)
    for i, prompt in enumerate(PROMPTS):
        alone = lens(model, tok, prompt, loops=3, top_k=4)
        part = together[together.prompt_index == i].reset_index(drop=True)
        assert list(part.token_id) == list(alone.token_id)
        np.testing.assert_allclose(part.prob, alone.prob, atol=1e-5)


def test_a_tuned_lens_fits_saves_and_reads(looped, tmp_path):
    from workbench.tasks import build_rows

    model, tok = looped
    rows = build_rows("chase", [1, 2, 3], 6, 0, alphabet=8, tokenizer=tok)
    maps = fit_tuned_lens(model, tok, rows, loops=3)
    assert sorted(maps) == [1, 2, 3]
    path = save_tuned_lens(maps, tmp_path / "tuned.safetensors")
    back = load_tuned_lens(path)
    assert all(np.array_equal(back[t][1], maps[t][1]) for t in maps)
    frame = lens(model, tok, rows[0]["prompt"], loops=3, tuned=path)
    assert set(frame.lens) == {"coda", "raw", "tuned"} and frame.attrs["lenses"] == ["coda", "raw", "tuned"]
    # the tuned lens reads unembed((h_t - x mean) W + y mean): recomputed by hand from the model's own states
    enc = tok([rows[0]["prompt"]], return_tensors="pt")
    with torch.no_grad():
        h = model.read(enc.input_ids, enc.attention_mask, loops=3, return_states=True).states[0, :, 0].double()
    W_U = model.base.lm_head.weight.detach().double()
    for t in (1, 3):
        mx, W, my = (torch.as_tensor(x) for x in maps[t])
        p = (((h[t - 1] - mx) @ W + my) @ W_U.T).softmax(-1)
        got = frame[(frame.loop == t) & (frame.lens == "tuned") & (frame.kind == "top")]
        assert list(got.token_id) == p.topk(5).indices.tolist()
        np.testing.assert_allclose(got.prob.values, p[got.token_id.tolist()].numpy(), atol=1e-6)
    (tmp_path / "bad.safetensors").write_bytes(b"not a tensor file")
    with pytest.raises(WorkbenchError, match="not a safetensors file"):
        lens(model, tok, "x", loops=2, tuned=tmp_path / "bad.safetensors")


@pytest.mark.parametrize("bad, match", [
    (dict(prompts=[""]), "prompt 1 is empty"),
    (dict(prompts=[]), "no prompt given"),
    (dict(loops=0), "outside 1..6"),
    (dict(loops=7), "outside 1..6"),
    (dict(positions="99"), "position 99 is out of range"),
    (dict(positions="-99"), "position -99 is out of range"),
    (dict(positions="a,b"), "malformed"),
    (dict(targets=[" Paris France"]), "is 2 tokens"),
    (dict(targets=[""]), "is empty"),
    (dict(top_k=0), "top_k"),
])
def test_bad_arguments_are_one_line_errors(looped, bad, match):
    model, tok = looped
    kw = dict(prompts=["The capital of France is"], loops=2)
    kw.update(bad)
    with pytest.raises(WorkbenchError, match=match):
        lens(model, tok, kw.pop("prompts"), **kw)


# ----------------------------------------------------------------------------- the command
def test_the_command_prints_a_table_writes_json_and_an_escaped_page(capsys, monkeypatch, tmp_path):
    page = tmp_path / "lens.html"
    hostile = "</script><script>alert(1)</script> <b>bold</b>"
    code, out, err = invoke(capsys, monkeypatch, "lens", "tiny-llama", "--block", "2:4", "-p", "The capital of France is",
                            "-p", hostile, "--loops", "3", "--target", " Paris", "--html", page)
    assert code == 0, err
    assert "rank ' Paris'" in out and "KL→T" in out and f"wrote {page}" in out
    text = page.read_text()
    assert "name='generator' content='workbench lens'" in text
    assert "<b>bold</b>" not in text and "&lt;b&gt;bold&lt;/b&gt;" in text
    assert text.count("<script>alert(1)</script>") == 0
    # replaced only when asked
    code, _, err = invoke(capsys, monkeypatch, "lens", "tiny-llama", "--block", "2:4", "-p", "x", "--html", page)
    assert code == 2 and "--overwrite" in err
    code, _, err = invoke(capsys, monkeypatch, "lens", "tiny-llama", "--block", "2:4", "-p", "x", "--html", page,
                          "--overwrite")
    assert code == 0, err
    code, out, err = invoke(capsys, monkeypatch, "lens", "tiny-hrm-text", "-p", "Hello", "--json", "--top-k", "2")
    assert code == 0, err
    record = json.loads(out)
    assert record["model"]["kind"] == "native" and record["lenses"] == ["coda", "raw"]
    assert {r["loop"] for r in record["rows"]} == set(range(1, record["model"]["loops"] + 1))
    assert all(math.isfinite(r["prob"]) for r in record["rows"])


@pytest.mark.parametrize("args, fragment", [
    (["tiny-llama", "--block", "2:4", "-p", ""], "prompt 1 is empty"),
    (["tiny-llama", "--block", "2:4"], "no prompt given"),
    (["tiny-llama", "--block", "2:4", "-p", "x", "--target", " Paris France"], "is 2 tokens"),
    (["tiny-llama", "--block", "2:4", "-p", "x y", "--positions", "5"], "out of range"),
    (["tiny-llama", "--block", "2:4", "-p", "x", "--loops", "99"], "outside 1..16"),
    (["tiny-hrm-text", "-p", "x", "--loops", "99"], "outside 1..4"),
    (["tiny-llama", "-p", "x"], "give --block A:B"),
    (["tiny-hrm-text", "-p", "x", "--block", "1:2"], "--block is for a base model"),
    (["tiny-llama", "--block", "2-4", "-p", "x"], "is not A:B"),
    (["tiny-llama", "--block", "2:4", "-p", "x", "--tuned", "/nonexistent.safetensors"], "does not exist"),
    (["tiny-llama", "--block", "2:4", "-p", "x", "--top-k", "0"], "--top-k 0"),
    (["tiny-llama", "--block", "2:4", "-p", "x", "--html", "{out}/page.txt"], "must end in .html"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(capsys, monkeypatch, tmp_path, args, fragment):
    out_dir = tmp_path / "out"
    args = [a.replace("{out}", str(out_dir)) for a in args]
    if "--html" not in args:
        args += ["--html", str(out_dir / "lens.html")]
    code, _, err = invoke(capsys, monkeypatch, "lens", *args)
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0], err
    assert not out_dir.exists() or not any(out_dir.iterdir())


def test_prompts_file(capsys, monkeypatch, tmp_path):
    f = tmp_path / "prompts.txt"
    f.write_text("The capital of France is\n\nA -> B\\nStart at A.\n")
    code, out, err = invoke(capsys, monkeypatch, "lens", "tiny-llama", "--block", "2:4", "--prompts", f, "--loops", "2",
                            "--json")
    assert code == 0, err
    assert json.loads(out)["prompts"] == ["The capital of France is", "A -> B\nStart at A."]
