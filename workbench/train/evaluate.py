"""Held-out evaluation of a retrofit: active-label accuracy per depth and loop."""

from __future__ import annotations

import pandas as pd

from workbench.tasks.reader import read_answers, read_rows, reads_symbol
from workbench.train.dense import read_direct, read_scratchpad


def evaluate(looped, tokenizer, rows: list[dict], batch_size: int = 16,
             answer_loops: int | None = None, past: int | None = None) -> tuple[dict, pd.DataFrame]:
    """Returns ({depth: {loop: accuracy}}, the reader's tidy frame).

    Symbol rows: active-label accuracy, x_t at loop t <= d, each depth read to its own loop count
    (to `past` loops when that is larger: the frame then holds the loops past d, see `park_matrix`).
    Multi-token answer rows (state, arith): the exact final answer at every loop 1..`answer_loops`.
    """
    was_training = looped.training
    looped.eval()
    if not all(reads_symbol(r) for r in rows):
        frame = read_answers(looped, tokenizer, rows, loops=answer_loops or looped.max_loops,
                             batch_size=batch_size).frame()
        active = frame
    else:
        frames = []
        for depth in sorted({r["depth"] for r in rows}):  # each depth read to its own loop count only
            subset = [r for r in rows if r["depth"] == depth]
            loops = max(depth, past or 0)
            frames.append(read_rows(looped, tokenizer, subset, loops=loops, batch_size=batch_size).frame())
        frame = pd.concat(frames, ignore_index=True)
        active = frame[frame["loop"] <= frame["depth"]]
    looped.train(was_training)
    acc = active.groupby(["depth", "loop"])["correct"].mean()
    matrix: dict[str, dict[str, float]] = {}
    for (d, t), v in acc.items():
        matrix.setdefault(str(d), {})[str(t)] = float(v)
    return matrix, frame


def park_reading(frame: pd.DataFrame) -> dict:
    """How a symbol frame read past the depths (`evaluate(..., past=T)`) holds the answer at loops t > d.

    Returns {"park": {depth: {loop: share of rows reading x_d}}, "park_cells": the (row, loop) cells past d,
    "park_share": the share of those cells reading x_d (None when there are none)}.
    """
    answer = frame[frame["loop"] == frame["depth"]].set_index("row_id")["target"]
    past = frame[frame["loop"] > frame["depth"]]
    parked = past.assign(parked=past["predicted"].to_numpy() == past["row_id"].map(answer).to_numpy())
    matrix: dict[str, dict[str, float]] = {}
    for (d, t), v in parked.groupby(["depth", "loop"])["parked"].mean().items():
        matrix.setdefault(str(d), {})[str(t)] = float(v)
    share = round(float(parked["parked"].mean()), 4) if len(parked) else None
    return {"park": matrix, "park_cells": len(parked), "park_share": share}


def evaluate_dense(looped, tokenizer, rows: list[dict], kind: str, batch_size: int = 16) -> tuple[dict, pd.DataFrame]:
    """A dense control's held-out accuracy in the looped arm's shape: {depth: {position: accuracy}}.

    direct: one answer per row, filed under its depth (cell d, d: the final answer, as the looped arm's loop d);
    scratchpad: the k-th written symbol against x_k for k = 1..d (free-running greedy decoding), cell d, d being
    its answer.
    """
    was_training = looped.training
    looped.eval()
    frame = (read_direct if kind == "direct" else read_scratchpad)(looped, tokenizer, rows, batch_size)
    looped.train(was_training)
    matrix: dict[str, dict[str, float]] = {}
    for d, g in frame.groupby("depth"):
        if kind == "direct":
            matrix[str(d)] = {str(d): float(g["correct"].mean())}
        else:
            matrix[str(d)] = {str(k): float((g["written"].map(lambda w, k=k: w[k - 1]) ==
                                               g["chain"].map(lambda c, k=k: c[k - 1])).mean())
                              for k in range(1, int(d) + 1)}
    return matrix, frame
