"""The dense controls of the retrofit paper (Sec. 9): the same model and the same adapter budget, without the loop.

Both arms run loop 1 only, which is the base model with the adapter on the block's projections (the retrofit's loop
1 is the base exactly), so they differ from the looped arm in nothing but the recurrence:

- **direct** (the paper's Arm B): the answer in one pass. Training supervises loop 1 on the row's final answer
  x_d; the reader scores the row's symbols at the answer position, as for the looped arm.
- **scratchpad** (the paper's Arm C): the model writes the chain after the prompt, " x_1 x_2 ... x_d" (every symbol
  one token), and the d-th written symbol is its answer. Training is teacher-forced on every written symbol; the
  reader decodes greedily with a KV cache, each step restricted to the row's symbols (a generous reader, like the
  paper's dense reader, which accepted a completed answer whatever followed it).

`read_direct` / `read_scratchpad` return one row per manifest row (row_id, depth, target, predicted, correct, and for
the scratchpad the number of chain symbols written right); `latency_by_depth` times one row at a time per depth.
The scratchpad's frame also holds what it wrote
(`written`) beside the chain.
"""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
import torch

from workbench.devices import device_of
from workbench.errors import WorkbenchError
from workbench.loop.positions import position_ids
from workbench.precision import autocast
from workbench.tasks.reader import candidate_ids, encode_prompts

KINDS = ("direct", "scratchpad")


def _final_targets(batch: dict) -> torch.Tensor:
    """Index of x_d among each row's symbols, from a `make_batch` batch."""
    rows = torch.arange(batch["targets"].shape[0], device=batch["targets"].device)
    return batch["targets"][rows, batch["depths"] - 1]


def direct_loss(looped, batch: dict, denominator: float | None = None) -> torch.Tensor:
    """CE over the row's symbols of the final answer x_d read at loop 1 (a `make_batch` batch)."""
    r = looped.read(batch["input_ids"], attention_mask=batch["attention_mask"], loops=1,
                    candidates=batch["candidates"])
    logp = r.scores[:, 0, -1, :].float().log_softmax(-1)
    nll = -logp.gather(-1, _final_targets(batch).unsqueeze(-1)).squeeze(-1)
    return nll.sum() / (len(nll) if denominator is None else denominator)


def scratchpad_batch(rows: list[dict], tokenizer, device="cpu") -> dict:
    """Teacher-forced scratchpad batch: prompt + x_1 .. x_{d-1} as tokens, read at the d positions that predict
    x_1 .. x_d. Keys: input_ids, attention_mask [B, S] (left padded), positions [B, D], targets [B, D] (index among
    the symbols, -1 past d), candidates [B, N], depths [B]."""
    if not rows:
        raise WorkbenchError("no rows for a scratchpad batch")
    enc = encode_prompts(tokenizer, [r["prompt"] for r in rows])
    cands = torch.stack([candidate_ids(tokenizer, r["symbols"]) for r in rows])
    D = max(r["depth"] for r in rows)
    seqs, reads, targets = [], [], []
    for i, r in enumerate(rows):
        prompt = enc["input_ids"][i][enc["attention_mask"][i].bool()].tolist()
        idx = [r["symbols"].index(x) for x in r["chain"]]
        written = [int(cands[i, j]) for j in idx[:-1]]
        seqs.append(prompt + written)
        reads.append([len(prompt) - 1 + k for k in range(len(idx))])
        targets.append(idx)
    S = max(len(s) for s in seqs)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    ids = torch.full((len(rows), S), pad, dtype=torch.long)
    mask = torch.zeros(len(rows), S, dtype=torch.long)
    pos = torch.zeros(len(rows), D, dtype=torch.long)
    tgt = torch.full((len(rows), D), -1, dtype=torch.long)
    for i, (s, rd, t) in enumerate(zip(seqs, reads, targets)):
        off = S - len(s)
        ids[i, off:] = torch.tensor(s)
        mask[i, off:] = 1
        pos[i, : len(rd)] = torch.tensor(rd) + off
        pos[i, len(rd):] = pos[i, len(rd) - 1]          # padding reads repeat the last one and are masked
        tgt[i, : len(t)] = torch.tensor(t)
    out = dict(input_ids=ids, attention_mask=mask, positions=pos, targets=tgt, candidates=cands,
               depths=torch.tensor([r["depth"] for r in rows]))
    return {k: v.to(device) for k, v in out.items()}


def scratchpad_loss(looped, batch: dict, denominator: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of the written symbols' CE / denominator (default: symbols written), CE per chain position [D])."""
    r = looped.read(batch["input_ids"], attention_mask=batch["attention_mask"], loops=1,
                    positions=batch["positions"], candidates=batch["candidates"])
    logp = r.scores[:, 0].float().log_softmax(-1)                                 # [B, D, N]
    t = batch["targets"]
    nll = -logp.gather(-1, t.clamp(min=0).unsqueeze(-1)).squeeze(-1) * (t >= 0)
    active = (t >= 0).sum(0).clamp(min=1)
    denom = float((t >= 0).sum()) if denominator is None else denominator
    return nll.sum() / denom, nll.detach().sum(0) / active


def _frame(rows: list[dict], predicted: list[str], extra: dict | None = None) -> pd.DataFrame:
    f = pd.DataFrame({"row_id": [r["row_id"] for r in rows], "depth": [r["depth"] for r in rows],
                      "target": [r["answer"] for r in rows], "predicted": predicted})
    f["correct"] = f["target"] == f["predicted"]
    for k, v in (extra or {}).items():
        f[k] = v
    return f


@torch.no_grad()
def read_direct(looped, tokenizer, rows: list[dict], batch_size: int = 16) -> pd.DataFrame:
    """The direct arm's answer for every row: the argmax symbol at loop 1."""
    preds = []
    for i in range(0, len(rows), batch_size):
        chunk = rows[i:i + batch_size]
        device = device_of(looped)
        enc = {k: v.to(device) for k, v in encode_prompts(tokenizer, [r["prompt"] for r in chunk]).items()}
        cands = torch.stack([candidate_ids(tokenizer, r["symbols"]) for r in chunk]).to(device)
        r = looped.read(enc["input_ids"], attention_mask=enc["attention_mask"], loops=1, candidates=cands)
        best = r.scores[:, 0, -1, :].argmax(-1).tolist()
        preds += [row["symbols"][j] for row, j in zip(chunk, best)]
    return _frame(rows, preds)


@torch.no_grad()
def _decode(looped, tokenizer, chunk: list[dict], steps: int) -> list[list[int]]:
    """Greedy decoding of `steps` symbols for each row (restricted to its symbols), KV-cached; symbol indices."""
    base = looped.base
    device = device_of(looped)
    enc = encode_prompts(tokenizer, [r["prompt"] for r in chunk])
    cands = torch.stack([candidate_ids(tokenizer, r["symbols"]) for r in chunk]).to(device)
    ids, mask = enc["input_ids"].to(device), enc["attention_mask"].to(device)
    written: list[list[int]] = [[] for _ in chunk]
    rows = torch.arange(len(chunk), device=device)
    with autocast(looped.precision, ids.device.type):
        out = base(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask), use_cache=True,
                   logits_to_keep=1)  # only the last position is read
        for step in range(steps):
            logits = out.logits[:, -1, :].float()
            pick = logits.gather(-1, cands).argmax(-1)                          # [B] index among the symbols
            for i, j in enumerate(pick.tolist()):
                written[i].append(j)
            if step == steps - 1:
                break
            nxt = cands[rows, pick].unsqueeze(-1)
            mask = torch.cat([mask, torch.ones_like(nxt)], dim=-1)
            pos = mask.sum(-1, keepdim=True) - 1
            out = base(input_ids=nxt, attention_mask=mask, position_ids=pos, cache=out.cache, use_cache=True)
    return written


def read_scratchpad(looped, tokenizer, rows: list[dict], batch_size: int = 16) -> pd.DataFrame:
    """The scratchpad arm's answer for every row: its d-th written symbol; `chain_right` counts how many of the
    d written symbols match x_1 .. x_d."""
    preds, right, texts = [], [], []
    for i in range(0, len(rows), batch_size):
        chunk = rows[i:i + batch_size]
        written = _decode(looped, tokenizer, chunk, max(r["depth"] for r in chunk))
        for r, w in zip(chunk, written):
            sym = [r["symbols"][j] for j in w[: r["depth"]]]
            preds.append(sym[-1])
            right.append(sum(a == b for a, b in zip(sym, r["chain"])))
            texts.append(sym)
    return _frame(rows, preds, {"chain_right": right, "written": texts, "chain": [list(r["chain"]) for r in rows]})


def latency_by_depth(call, rows: list[dict], per_depth: int = 4, repeats: int = 3) -> pd.DataFrame:
    """Median wall seconds of `call([row])` (one row, batch size 1, as the paper's interactive latency) per depth:
    depth, median_s, p10_s, p90_s, calls. The first call of each depth is a warm-up and not counted."""
    by_depth: dict[int, list[dict]] = {}
    for r in rows:
        by_depth.setdefault(r["depth"], []).append(r)
    out = []
    for d in sorted(by_depth):
        sample = by_depth[d][:per_depth]
        call(sample[:1])
        times = []
        for _ in range(repeats):
            for r in sample:
                t0 = time.perf_counter()
                call([r])
                times.append(time.perf_counter() - t0)
        out.append({"depth": d, "median_s": float(np.median(times)), "p10_s": float(np.percentile(times, 10)),
                    "p90_s": float(np.percentile(times, 90)), "calls": len(times)})
    return pd.DataFrame(out)


def latency_call(looped, tokenizer, kind: str):
    """The call an arm answers one row with, as deployed (batch 1): the looped arm's forced-depth read (d loops,
    the Coda once: `LoopedLM.read_final`), the direct arm's one pass, the scratchpad's cached decoding of d symbols."""
    if kind == "looped":
        def call(rs):
            enc = encode_prompts(tokenizer, [r["prompt"] for r in rs])
            cands = torch.stack([candidate_ids(tokenizer, r["symbols"]) for r in rs])
            return looped.read_final(enc["input_ids"], enc["attention_mask"], loops=rs[0]["depth"], candidates=cands)
        return call
    if kind not in KINDS:
        raise WorkbenchError(f"unknown arm kind '{kind}'; accepted: looped, {', '.join(KINDS)}")
    reader = read_direct if kind == "direct" else read_scratchpad
    return lambda rs: reader(looped, tokenizer, rs, 1)


def interleaved_latency(calls: dict, rows: list[dict], per_depth: int = 8, repeats: int = 5) -> pd.DataFrame:
    """Batch-1 latency of several arms measured side by side: for each depth, row and pass every arm answers the
    same row in turn (the order reversed on odd passes), so a drift in machine speed hits all arms alike.

    Returns one row per (arm, depth): arm, depth, median_s, p10_s, p90_s, calls, and ratio_to_first, the median
    over (row, pass) of this arm's time over the first arm's time on the same row in the same pass."""
    by_depth: dict[int, list[dict]] = {}
    for r in rows:
        by_depth.setdefault(r["depth"], []).append(r)
    names = list(calls)
    out = []
    with torch.no_grad():
        for d in sorted(by_depth):
            sample = by_depth[d][:per_depth]
            for name in names:
                calls[name](sample[:1])                                 # warm-up, not counted
            times: dict[str, list[float]] = {n: [] for n in names}
            for rep in range(repeats):
                for r in sample:
                    for name in (names if rep % 2 == 0 else names[::-1]):
                        t0 = time.perf_counter()
                        calls[name]([r])
                        times[name].append(time.perf_counter() - t0)
            first = np.array(times[names[0]])
            for name in names:
                t = np.array(times[name])
                out.append({"arm": name, "depth": d, "median_s": float(np.median(t)),
                            "p10_s": float(np.percentile(t, 10)), "p90_s": float(np.percentile(t, 90)),
                            "calls": len(t), "ratio_to_first": float(np.median(t / first))})
    return pd.DataFrame(out)
