"""Held-out evaluation of a retrofit: active-label accuracy per depth and loop."""

from __future__ import annotations

import pandas as pd

from workbench.dense import read_direct, read_scratchpad
from workbench.tasks.reader import read_answers, read_rows, reads_symbol


def evaluate(looped, tokenizer, rows: list[dict], batch_size: int = 16,
             answer_loops: int | None = None) -> tuple[dict, pd.DataFrame]:
    """Returns ({depth: {loop: accuracy}}, the reader's tidy frame).

    Symbol rows: active-label accuracy, x_t at loop t <= d, each depth read to its own loop count.
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
            frames.append(read_rows(looped, tokenizer, subset, loops=depth, batch_size=batch_size).frame())
        frame = pd.concat(frames, ignore_index=True)
        active = frame[frame["loop"] <= frame["depth"]]
    looped.train(was_training)
    acc = active.groupby(["depth", "loop"])["correct"].mean()
    matrix: dict[str, dict[str, float]] = {}
    for (d, t), v in acc.items():
        matrix.setdefault(str(d), {})[str(t)] = float(v)
    return matrix, frame


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
