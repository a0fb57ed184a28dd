"""Halting: where a halting head stops, against the oracle depth and the simple exits (RecurTrace App. E).

Needs a model with a halting head (`retrofit(..., halting=True)`); otherwise `NotApplicable`.
One forward per row batch to T reads every loop's symbol scores and continue probability
p_t. A row's answer is scored at the loop where it stops, against x_d. Exit rules, each swept
over `thresholds` with the floor `t_min`:
    head         the first t >= t_min with p_t < threshold (`workbench.loop.halting.halt_depth`);
    act          the first t where the cumulative halting mass sum_s (1 - p_s) >= threshold;
    pondernet    the first t where the halting distribution's CDF, 1 - prod_s p_s, >= threshold;
    confidence   the first t whose top candidate probability >= threshold;
plus `fixed_k` (stop at k for every row, k = 1..T) and `oracle` (stop at the row's depth).
Rows past T stop at T.

Tables:
    halting: method, threshold, t_min, mean_loops, accuracy
    halting__rows: row_id, depth, loop, continue_prob, correct_answer (predicted = x_d at loop t)
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from workbench.headlines import Headline, counted, measured
from workbench.loop.halting import halt_depth
from workbench.probes import NotApplicable
from workbench.probes.common import batches, check_loops, device_of, row_candidates, shared_candidates

THRESHOLDS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


def run(model, tokenizer, rows: list[dict], loops: int | None = None, thresholds=THRESHOLDS, t_min: int = 1,
        batch_size: int = 16, progress: bool = False) -> dict[str, pd.DataFrame]:
    """Returns {"halting": per (method, threshold), "halting__rows": per (row, loop)}.

    Raises:
        NotApplicable: the model has no halting head.
    """
    if getattr(model, "halting", None) is None:
        raise NotApplicable("the model has no halting head (retrofit with halting=True to train one)")
    T = check_loops(model, loops or max(r["depth"] for r in rows))
    probs, scores = _read(model, tokenizer, rows, T, batch_size)     # [R, T], [R, T, C]
    answer = np.array([r["symbols"].index(r["answer"]) for r in rows])
    correct = scores.argmax(-1) == answer[:, None]                       # [R, T]
    depths = np.array([min(r["depth"], T) for r in rows])
    records = [("oracle", np.nan, t_min, float(depths.mean()), _acc(correct, depths))]
    records += [("fixed_k", np.nan, t_min, float(k), _acc(correct, np.full(len(rows), k))) for k in range(1, T + 1)]
    confidence = torch.as_tensor(scores).softmax(-1).max(-1).values.numpy()
    halt_mass = np.cumsum(1 - probs, axis=1)
    cdf = 1 - np.cumprod(probs, axis=1)
    for th in thresholds:
        chosen = {
            "head": halt_depth(torch.as_tensor(probs), th, t_min).numpy(),
            "act": _first(halt_mass >= th, t_min),
            "pondernet": _first(cdf >= th, t_min),
            "confidence": _first(confidence >= th, t_min),
        }
        records += [(m, float(th), t_min, float(c.mean()), _acc(correct, c)) for m, c in chosen.items()]
    table = pd.DataFrame.from_records(records, columns=["method", "threshold", "t_min", "mean_loops", "accuracy"])
    per_row = pd.DataFrame.from_records(
        [(r["row_id"], r["depth"], t + 1, float(probs[i, t]), bool(correct[i, t])) for i, r in enumerate(rows)
         for t in range(T)], columns=["row_id", "depth", "loop", "continue_prob", "correct_answer"])
    return {"halting": table, "halting__rows": per_row}


@torch.no_grad()
def _read(model, tokenizer, rows, T, batch_size) -> tuple[np.ndarray, np.ndarray]:
    device = device_of(model)
    probs = np.zeros((len(rows), T))
    scores = None
    for idx, enc in batches(tokenizer, rows, batch_size, device):
        cands = shared_candidates(row_candidates(tokenizer, [rows[i] for i in idx]).to(device))
        r = model.read(enc["input_ids"], attention_mask=enc["attention_mask"], loops=T, candidates=cands)
        if scores is None:
            scores = np.zeros((len(rows), T, r.scores.shape[-1]))
        scores[idx] = r.scores[:, :, -1].double().cpu().numpy()
        probs[idx] = r.halt_probs.double().cpu().numpy()
    return probs, scores


def _first(stop: np.ndarray, t_min: int) -> np.ndarray:
    """First loop (1-based) >= t_min where `stop` [R, T] holds, else T."""
    stop = stop.copy()
    stop[:, : max(0, t_min - 1)] = False
    stop[:, -1] = True
    return stop.argmax(1) + 1


def _acc(correct: np.ndarray, chosen: np.ndarray) -> float:
    return float(correct[np.arange(len(chosen)), np.asarray(chosen) - 1].mean())


def summarize(tables: dict[str, pd.DataFrame]) -> dict:
    """Headline numbers: oracle accuracy and the head's accuracy / mean loops at threshold 0.5."""
    f = tables["halting"]
    pick = lambda m, th=None: f[(f["method"] == m) & ((f["threshold"] == th) if th is not None else True)]  # noqa: E731
    out = {"oracle": pick("oracle")[["mean_loops", "accuracy"]].iloc[0].round(4).to_dict()}
    for m in ("head", "act", "pondernet", "confidence"):
        g = pick(m, 0.5)
        if len(g):
            out[m + "@0.5"] = g[["mean_loops", "accuracy"]].iloc[0].round(4).to_dict()
    return {**out, "headline": headline(tables).to_dict()}


def headline(tables: dict[str, pd.DataFrame]) -> Headline:
    """The oracle's and the head's (threshold 0.5) accuracy (Wilson over rows) and mean loops."""
    f = tables["halting"]
    n = int(tables["halting__rows"]["row_id"].nunique()) if "halting__rows" in tables else 0
    numbers, words = [], []
    for method, th, words_of in (("oracle", None, "stopping at each row's depth (the oracle)"),
                                 ("head", 0.5, "the halting head at 0.5")):
        g = f[(f["method"] == method) & ((f["threshold"] == th) if th is not None else True)]
        if g.empty:
            continue
        r = g.iloc[0]
        expect = "close to the oracle" if method == "head" else ""
        acc = (counted(f"{method}_accuracy", f"accuracy, {words_of}", round(float(r["accuracy"]) * n), n, expect=expect)
               if n else measured(f"{method}_accuracy", f"accuracy, {words_of}", float(r["accuracy"]), "proportion",
                                  expect))
        loops = measured(f"{method}_loops", f"mean loops, {words_of}", round(float(r["mean_loops"]), 2), expect=expect)
        numbers += [acc, loops]
        words.append(f"{words_of} reads {acc.text()} after {loops.value} loops on average")
    sentence = ("; ".join(words) + (f" (n = {n} rows)." if n else ".")) if words else "No halting result."
    return Headline("halting", numbers, sentence[0].upper() + sentence[1:])
