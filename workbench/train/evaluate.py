"""Held-out evaluation of a retrofit: active-label accuracy per depth and loop."""

from __future__ import annotations

import pandas as pd

from workbench.tasks.reader import read_rows


def evaluate(looped, tokenizer, rows: list[dict], batch_size: int = 16) -> tuple[dict, pd.DataFrame]:
    """Returns ({depth: {loop: active-label accuracy}} for t <= d, the reader's tidy frame)."""
    was_training = looped.training
    looped.eval()
    frames = []
    for depth in sorted({r["depth"] for r in rows}):  # each depth read to its own loop count only
        subset = [r for r in rows if r["depth"] == depth]
        frames.append(read_rows(looped, tokenizer, subset, loops=depth, batch_size=batch_size).frame())
    frame = pd.concat(frames, ignore_index=True)
    looped.train(was_training)
    active = frame[frame["loop"] <= frame["depth"]]
    acc = active.groupby(["depth", "loop"])["correct"].mean()
    matrix: dict[str, dict[str, float]] = {}
    for (d, t), v in acc.items():
        matrix.setdefault(str(d), {})[str(t)] = float(v)
    return matrix, frame
