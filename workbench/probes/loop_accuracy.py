"""Loop accuracy: the final answer read at every loop count 1..T, for rows of any task (RecurTrace Table 5).

One forward per row batch reads every loop. Symbol rows (chase, p-hop) go through the symbol
reader (`read_rows`: the argmax over the row's symbols against x_d); multi-token answers (state
tracking, arithmetic, a user's free text) through `read_answers` (exact: greedy decoding at loop t
writes the answer, `workbench.tasks.reader.writes_answer`). Unlike the depth matrix, loop t is not
tied to step t: this is accuracy by the number of loops spent, the fixed depths of the
compute-accuracy curve.

Tables:
    loop_accuracy: row_id, depth, loop, predicted, correct — one row per (row_id, loop 1..T).
"""

from __future__ import annotations

import pandas as pd

from workbench.analysis.headlines.loop_accuracy import headline
from workbench.probes.common import check_loops, read_final
from workbench.probes.options import Count, probe_options
from workbench.probes.spec import ProbeSpec

DEFAULT_LOOPS = 8


def run(model, tokenizer, rows: list[dict], loops: int | None = None, batch_size: int = 16,
        progress: bool = False) -> dict[str, pd.DataFrame]:
    """Returns {"loop_accuracy": per (row, loop) frame}.

    Args:
        loops: T, loops to read (default 8, or the model's max_loops when smaller).
    """
    T = check_loops(model, loops or min(DEFAULT_LOOPS, model.max_loops))
    read = read_final(model, tokenizer, rows, T, batch_size, progress)
    records = [(r["row_id"], int(r["depth"]), t + 1, read.predicted[i][t], bool(read.correct[i, t]))
               for i, r in enumerate(rows) for t in range(T)]
    return {"loop_accuracy": pd.DataFrame.from_records(
        records, columns=["row_id", "depth", "loop", "predicted", "correct"])}


def by_loop(frame: pd.DataFrame) -> pd.Series:
    """Accuracy per loop over every row."""
    return frame.groupby("loop")["correct"].mean().astype(float)


def summarize(tables: dict[str, pd.DataFrame]) -> dict:
    """Headline numbers: accuracy per loop (pooled and per depth) and the best loop."""
    frame = tables["loop_accuracy"]
    acc = by_loop(frame)
    per_depth = frame.groupby(["depth", "loop"])["correct"].mean()
    matrix: dict[str, dict[str, float]] = {}
    for (d, t), v in per_depth.items():
        matrix.setdefault(str(int(d)), {})[str(int(t))] = round(float(v), 4)
    return {"rows": int(frame["row_id"].nunique()),
            "by_loop": {str(int(t)): round(float(v), 4) for t, v in acc.items()},
            "by_depth": matrix, "best_loop": int(acc.idxmax()), "headline": headline(tables).to_dict()}


@probe_options
class Options:
    """The loop-accuracy probe's options (`run`'s keywords), checked before any probe of a battery runs."""

    loops: int | None = None
    batch_size: Count = 16
    progress: bool = False


SPEC = ProbeSpec(
    name="loop_accuracy", run=run, summarize=summarize,
    needs=("prompt", "answer", "symbols"),
    options=Options,
)
