"""Logit lens per loop: what each loop's state says about every chain symbol, through three lenses.

At the read position of every loop t, from one forward per row batch:
    coda   the reader's own path: the Coda and final norm on h_t, then the unembedding
           (`loop.{t}.hook_readout`), what the model was trained to emit;
    raw    the final norm and unembedding applied directly to h_t, skipping the Coda;
    tuned  a per-loop affine map (tuned-lens style) applied to h_t, then the unembedding. The map
           of loop t is a ridge least-squares fit from h_t to the Coda readout vector of the row's
           final loop (loop = depth), on rows disjoint from the evaluated ones (`fit_fraction` of
           each depth, split by `seed`), using the fit rows with depth >= t. Matching the readout
           vector makes the lens agree with the final loop's Coda readout over the whole vocabulary.
Evaluation rows only are reported, for every lens alike.

Rows from a user's file (`workbench.tasks.user`) may give no chain and no depth: a row without a
chain is read for its answer alone (chain_index d, or 0 when the depth is not given either); a row
whose depth is not given counts as final at the last loop T (the tuned lens's target, as
lens_agreement's), and the headline reads the answer's rank at T for those rows.

Tables:
    logit_lens: row_id, depth, loop, lens, chain_index (k of x_k, 1..d; a row without a chain: its answer
        at k = d, or k = 0 when the depth is not given), symbol, rank (0 = top among the task's candidates),
        prob (softmax over the task's candidates)
    logit_lens__top: row_id, loop, lens, k (0..top_k-1), token (decoded), prob (softmax over the vocabulary)
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from workbench.analysis.headlines.logit_lens import headline, last_loop_answers
from workbench.devices import device_of
from workbench.errors import WorkbenchError
from workbench.loop.hooks import hook_name, stack_loops
from workbench.probes.common import (
    ONE_TOKEN,
    batches,
    check_loops,
    default_loops,
    require_symbols,
    row_candidates,
    shared_candidates,
    split_rows,
)
from workbench.probes.options import Count, probe_options
from workbench.probes.spec import ProbeSpec


def run(model, tokenizer, rows: list[dict], loops: int | None = None, fit_fraction: float = 0.5,
        ridge: float = 0.1, top_k: int = 5, batch_size: int = 8, seed: int = 0,
        progress: bool = False) -> dict[str, pd.DataFrame]:
    """Returns {"logit_lens": per (row, loop, lens, chain symbol), "logit_lens__top": per (row, loop, lens, k)}.

    Args:
        loops: T (default the rows' max depth; `common.default_loops` when a row gives none).
        fit_fraction: share of each depth's rows used to fit the tuned lens (never evaluated).
        ridge: ridge strength, relative to the mean squared norm of the centred fit states.
        top_k: top tokens over the whole vocabulary per (row, loop, lens).
    """
    require_symbols(rows)
    T = check_loops(model, loops or default_loops(model, rows))
    fit_rows, eval_rows = split_rows(rows, fit_fraction, seed)
    states, readouts = collect(model, tokenizer, rows, T, batch_size, progress)
    where = {r["row_id"]: i for i, r in enumerate(rows)}
    fit_idx, eval_idx = [where[r["row_id"]] for r in fit_rows], [where[r["row_id"]] for r in eval_rows]
    depths = np.array([r["depth"] for r in rows])
    depths = np.where(depths >= 1, depths, T)  # a depth not given (0): final at the last loop
    final = np.minimum(depths, T) - 1  # each row's final loop, the tuned lens's target
    maps = fit_tuned(states[fit_idx], readouts[fit_idx, final[fit_idx]], depths[fit_idx], ridge)
    vectors = lens_vectors(model, states[eval_idx], readouts[eval_idx], maps)   # {lens: [E, T, D]}
    return {"logit_lens": symbol_table(model, tokenizer, eval_rows, vectors),
            "logit_lens__top": top_table(model, tokenizer, eval_rows, vectors, top_k)}


@torch.no_grad()
def collect(model, tokenizer, rows, T, batch_size, progress) -> tuple[np.ndarray, np.ndarray]:
    """Returns (h_t, Coda readout) at each row's read position, float64 [R, T, D] each."""
    device = device_of(model)
    states = readouts = None
    for idx, enc in tqdm(list(batches(tokenizer, rows, batch_size, device)), disable=not progress, desc="logit_lens"):
        grabbed: dict[str, torch.Tensor] = {}

        def grab(x, hook):  # [B, n_positions, D]
            grabbed[hook.name] = x[:, -1].double().cpu()

        with model.hooks(fwd_hooks=[(hook_name("readout", t), grab) for t in range(1, T + 1)]):
            r = model.read(enc["input_ids"], attention_mask=enc["attention_mask"], loops=T, return_states=True,
                           candidates=shared_candidates(row_candidates(tokenizer, [rows[i] for i in idx]).to(device)))
        if states is None:
            D = r.states.shape[-1]
            states, readouts = np.zeros((len(rows), T, D)), np.zeros((len(rows), T, D))
        states[idx] = r.states[:, :, -1].double().cpu().numpy()
        readouts[idx] = stack_loops(grabbed, "readout", T).transpose(0, 1).numpy()  # [B, T, D]
    return states, readouts


def fit_tuned(states: np.ndarray, targets: np.ndarray, depths: np.ndarray, ridge: float) -> dict[int, tuple]:
    """Returns {loop t: (x mean, W [D, D], y mean)}: ridge fit of targets [F, D] from states[:, t-1] [F, D].

    Solved in the dual (F << D): W = Xc^T (Xc Xc^T + lam I)^-1 Yc, lam = ridge * mean ||x_c||^2.
    Loops with fewer than two fit rows of depth >= t get no map.
    """
    maps = {}
    for t in range(1, states.shape[1] + 1):
        use = depths >= t
        if use.sum() < 2:
            continue
        X, Y = states[use, t - 1], targets[use]
        mx, my = X.mean(0), Y.mean(0)
        Xc, Yc = X - mx, Y - my
        gram = Xc @ Xc.T
        lam = ridge * max(np.trace(gram) / len(X), 1e-12)
        maps[t] = (mx, Xc.T @ np.linalg.solve(gram + lam * np.eye(len(X)), Yc), my)
    return maps


@torch.no_grad()
def lens_vectors(model, states: np.ndarray, readouts: np.ndarray, maps: dict) -> dict[str, np.ndarray]:
    """Returns {lens: vectors [E, T, D]} that the unembedding turns into each lens's logits."""
    norm = model.final_norm  # HRM: the norm that ends its H stack
    p = model.base.lm_head.weight
    raw = norm(torch.as_tensor(states, dtype=p.dtype, device=p.device)).double().cpu().numpy()
    tuned = np.full_like(states, np.nan)
    for t, (mx, W, my) in maps.items():
        tuned[:, t - 1] = (states[:, t - 1] - mx) @ W + my
    return {"coda": readouts, "raw": raw, "tuned": tuned}


def _logits(model, vectors: np.ndarray, ids: torch.Tensor | None = None) -> torch.Tensor:
    head = model.base.lm_head
    W = head.weight if ids is None else head.weight[ids]
    x = torch.as_tensor(vectors, dtype=W.dtype, device=W.device)
    out = x @ W.T
    if head.bias is not None:
        out = out + (head.bias if ids is None else head.bias[ids])
    return model.logit_transform(out).double().cpu()  # a native model's own (Inkling's softcap)


def targets(row: dict) -> list[tuple[int, str]]:
    """(k, x_k) of every chain symbol; a row without a chain: its answer at k = d, or k = 0 (depth not given)."""
    if row.get("chain") is not None:
        return list(enumerate(row["chain"], 1))
    return [(max(row["depth"], 0), row["answer"])]


@torch.no_grad()
def symbol_table(model, tokenizer, rows, vectors) -> pd.DataFrame:
    """Rank and candidate probability of every chain symbol x_1..x_d at every loop and lens."""
    cands = row_candidates(tokenizer, rows)
    records = []
    for lens, V in vectors.items():
        for e, row in enumerate(rows):
            logits = _logits(model, V[e], cands[e].to(model.base.lm_head.weight.device))  # [T, C]
            probs = logits.softmax(-1)
            for t in range(V.shape[1]):
                if torch.isnan(logits[t]).any():
                    continue
                for k, x in targets(row):
                    j = row["symbols"].index(x)
                    rank = int((logits[t] > logits[t, j]).sum())
                    records.append((row["row_id"], row["depth"], t + 1, lens, k, x, rank, float(probs[t, j])))
    return pd.DataFrame.from_records(records, columns=["row_id", "depth", "loop", "lens", "chain_index", "symbol",
                                                       "rank", "prob"])


@torch.no_grad()
def top_table(model, tokenizer, rows, vectors, top_k: int) -> pd.DataFrame:
    """Top-k tokens over the whole vocabulary per (row, loop, lens), one row's logits at a time."""
    if top_k < 1:
        raise WorkbenchError(f"top_k must be >= 1, got {top_k}")
    records = []
    for lens, V in vectors.items():
        for e, row in enumerate(rows):
            logits = _logits(model, V[e])                                         # [T, vocab]
            for t in range(V.shape[1]):
                if torch.isnan(logits[t]).any():
                    continue
                p, ids = logits[t].softmax(-1).topk(top_k)
                records += [(row["row_id"], t + 1, lens, k, tokenizer.decode([int(i)]), float(q))
                            for k, (q, i) in enumerate(zip(p, ids))]
    return pd.DataFrame.from_records(records, columns=["row_id", "loop", "lens", "k", "token", "prob"])


def summarize(tables: dict[str, pd.DataFrame]) -> dict:
    """Headline numbers per lens: top-1 rate and mean probability of x_t at loop t (t <= d)."""
    f = tables["logit_lens"]
    diag = f[f["chain_index"] == f["loop"]]
    out = {}
    for lens, g in diag.groupby("lens"):
        by_loop = g.groupby("loop").agg(top1=("rank", lambda r: float((r == 0).mean())), prob=("prob", "mean"))
        out[lens] = {"top1": round(float((g["rank"] == 0).mean()), 4), "mean_prob": round(float(g["prob"].mean()), 4),
                     "top1_by_loop": {str(int(t)): round(float(v), 4) for t, v in by_loop["top1"].items()}}
    answers = last_loop_answers(f)
    extra = {"answer_top1_last_loop": {lens: round(float((g["rank"] == 0).mean()), 4)
                                       for lens, g in answers.groupby("lens")}} if len(answers) else {}
    return {"lenses": out, **extra, "rows": int(f["row_id"].nunique()), "headline": headline(tables).to_dict()}


@probe_options
class Options:
    """The logit lens's options (`run`'s keywords), checked before any probe of a battery runs."""

    loops: int | None = None
    fit_fraction: float = 0.5
    ridge: float = 0.1
    top_k: Count = 5
    batch_size: Count = 8
    seed: int = 0
    progress: bool = False


SPEC = ProbeSpec(
    name="logit_lens", parts=("top",), run=run, summarize=summarize,
    needs=("prompt", "answer", "symbols", ONE_TOKEN),
    options=Options,
)
