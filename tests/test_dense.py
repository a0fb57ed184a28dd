"""The dense controls (workbench.train.dense): batches, losses and readers on a tiny model, and the KV-cached scratchpad
decoder against the teacher-forced full forward."""

from __future__ import annotations

import time

import torch

from tests.conftest import perturb
from workbench.loop.config import Block, RetrofitConfig
from workbench.loop.surgery import attach_lora, retrofit
from workbench.tasks.chase import chase_rows
from workbench.tasks.reader import candidate_ids
from workbench.train.dense import (
    _decode,
    direct_loss,
    interleaved_latency,
    latency_by_depth,
    latency_call,
    read_direct,
    read_scratchpad,
    scratchpad_batch,
    scratchpad_loss,
)
from workbench.train.losses import make_batch


def _model(tiny):
    base, tok = tiny
    looped = attach_lora(retrofit(base, RetrofitConfig(Block(1, 4))), r=4, alpha=8)
    perturb(looped, scale=0.02, seed=1)   # LoRA B off zero, so the adapter changes loop 1
    return looped.eval(), tok


def _rows(tok, depths=(1, 2, 3), per_depth=3):
    return chase_rows(8, list(depths), per_depth, 7, tokenizer=tok, split="test")


def test_scratchpad_batch_writes_the_chain_and_reads_before_each_symbol(tiny):
    looped, tok = _model(tiny)
    rows = _rows(tok)
    b = scratchpad_batch(rows, tok)
    for i, r in enumerate(rows):
        cands = candidate_ids(tok, r["symbols"])
        d = r["depth"]
        assert b["targets"][i, :d].tolist() == [r["symbols"].index(x) for x in r["chain"]]
        assert (b["targets"][i, d:] == -1).all()
        # the token after read position k is the written symbol x_{k+1} (k < d-1); the last read is the last token
        for k in range(d - 1):
            assert int(b["input_ids"][i, b["positions"][i, k] + 1]) == int(cands[r["symbols"].index(r["chain"][k])])
        assert int(b["positions"][i, d - 1]) == b["input_ids"].shape[1] - 1


def test_kv_cached_decoding_equals_the_teacher_forced_forward(tiny):
    """Decode greedily with the cache, then teacher-force what was written: every read must pick the same symbol
    (left padding, rows of different lengths and depths in one batch)."""
    looped, tok = _model(tiny)
    rows = _rows(tok, depths=(1, 3, 4), per_depth=2)
    written = _decode(looped, tok, rows, 4)
    forced = [dict(r, chain=[r["symbols"][j] for j in w[: r["depth"]]]) for r, w in zip(rows, written)]
    b = scratchpad_batch(forced, tok)
    with torch.no_grad():
        s = looped.read(b["input_ids"], attention_mask=b["attention_mask"], loops=1, positions=b["positions"],
                        candidates=b["candidates"]).scores[:, 0]
    for i, r in enumerate(forced):
        assert s[i, : r["depth"]].argmax(-1).tolist() == written[i][: r["depth"]]


def test_losses_train_only_the_adapter_and_readers_score_the_final_answer(tiny):
    looped, tok = _model(tiny)
    rows = _rows(tok)
    looped.train()
    loss = direct_loss(looped, make_batch(rows, tok))
    loss.backward()
    grads = {n: p.grad for n, p in looped.named_parameters() if p.grad is not None}   # the bridge: none at loop 1
    assert grads and all(n.count("lora_") for n in grads) and any(g.abs().sum() > 0 for g in grads.values())
    sp, per_pos = scratchpad_loss(looped, scratchpad_batch(rows, tok))
    assert sp.item() > 0 and per_pos.shape == (3,)
    looped.eval()
    f = read_direct(looped, tok, rows)
    with torch.no_grad():
        b = make_batch(rows, tok)
        best = looped.read(b["input_ids"], attention_mask=b["attention_mask"], loops=1,
                           candidates=b["candidates"]).scores[:, 0, -1].argmax(-1)
    assert f["predicted"].tolist() == [r["symbols"][j] for r, j in zip(rows, best.tolist())]
    assert (f["correct"] == (f["predicted"] == f["target"])).all() and f["target"].tolist() == [r["answer"] for r in rows]
    g = read_scratchpad(looped, tok, rows)
    assert g["chain_right"].between(0, g["depth"]).all() and len(g) == len(rows)
    lat = latency_by_depth(lambda rs: read_direct(looped, tok, rs), rows, per_depth=2, repeats=1)
    assert lat["depth"].tolist() == [1, 2, 3] and (lat["calls"] == 2).all() and (lat["median_s"] > 0).all()


def test_latency_calls_answer_as_the_readers_do_and_interleaving_times_each_arm(tiny):
    looped, tok = _model(tiny)
    rows = _rows(tok, depths=(2, 3), per_depth=2)
    with torch.no_grad():
        for r in rows:  # the looped call is the forced-depth read: loop d of the per-loop read
            s = latency_call(looped, tok, "looped")([r])
            enc = tok([r["prompt"]], return_tensors="pt")
            ref = looped.read(enc["input_ids"], enc["attention_mask"], loops=r["depth"],
                              candidates=candidate_ids(tok, r["symbols"])[None])
            assert torch.equal(s, ref.scores[:, -1])
        assert latency_call(looped, tok, "direct")(rows[:1])["predicted"].tolist() == \
            read_direct(looped, tok, rows[:1])["predicted"].tolist()
    seen = []

    def slow(name, seconds):
        def call(rs):
            seen.append((name, rs[0]["row_id"]))
            time.sleep(seconds)
        return call

    frame = interleaved_latency({"a": slow("a", 0.002), "b": slow("b", 0.006)}, rows, per_depth=2, repeats=2)
    assert frame["calls"].tolist() == [4, 4, 4, 4] and frame["depth"].tolist() == [2, 2, 3, 3]
    assert frame.set_index("arm").loc["a", "ratio_to_first"].tolist() == [1.0, 1.0]
    assert (frame.set_index("arm").loc["b", "ratio_to_first"] > 1.5).all()
    # every row answered by both arms back to back, the order reversed on the second pass
    timed = seen[2:6]  # after the two warm-up calls of depth 2
    assert [n for n, _ in timed] == ["a", "b", "a", "b"] and timed[0][1] == timed[1][1]
    assert [n for n, _ in seen[6:8]] == ["b", "a"]
