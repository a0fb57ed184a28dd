"""Overshoot (persistence, retrofit paper Sec. 5.2): force depth-d rows past d and classify each extra loop.

At loop t = d + k (k = 1..extra) the read symbol is *iterate* when it equals f^t(x0) (the
chain continued), *park* when it equals x_d (the state holds the answer), else *other*;
iterate is checked first, so when f^t(x0) = x_d (the orbit returns to x_d) the loop counts
as iterate and `coincide` marks it; the headline and the figure leave such loops out of their
shares and count them apart. One forward per row batch reads every loop.

Tables:
    overshoot: row_id, depth, loop, extra, predicted, iterate_symbol, park_symbol, cls, coincide
    overshoot__cost: depth, extra, n, answer_acc (predicted = x_d), iterate_acc (predicted = f^t(x0))
        — how far past d the answer survives.
"""

from __future__ import annotations

import pandas as pd

from workbench.analysis.headlines.overshoot import headline
from workbench.probes.common import FUNCTION_TABLE, check_loops, iterate, require_chase
from workbench.probes.options import Count, probe_options
from workbench.probes.spec import ProbeSpec
from workbench.tasks.reader import read_rows


def classify(predicted: str, iterate_symbol: str, park_symbol: str) -> str:
    """Returns "iterate", "park" or "other", in that priority."""
    if predicted == iterate_symbol:
        return "iterate"
    if predicted == park_symbol:
        return "park"
    return "other"


def run(model, tokenizer, rows: list[dict], extra: int = 5, batch_size: int = 16,
        progress: bool = False) -> dict[str, pd.DataFrame]:
    """Returns {"overshoot": one row per (row, extra loop), "overshoot__cost": per (depth, extra)}.

    Args:
        extra: loops past each row's depth to run and classify (the paper: depth 3, loops 4..8).
    """
    require_chase(rows)
    T = check_loops(model, max(r["depth"] for r in rows) + extra)
    result = read_rows(model, tokenizer, rows, loops=T, batch_size=batch_size, progress=progress)
    records = []
    for row, predicted in zip(rows, result.predicted_symbols()):
        d = row["depth"]
        for t in range(d + 1, d + extra + 1):
            it, park = iterate(row, t), row["chain"][-1]
            pred = predicted[t - 1]
            records.append((row["row_id"], d, t, t - d, pred, it, park, classify(pred, it, park), it == park))
    frame = pd.DataFrame.from_records(records, columns=["row_id", "depth", "loop", "extra", "predicted",
                                                        "iterate_symbol", "park_symbol", "cls", "coincide"])
    return {"overshoot": frame, "overshoot__cost": cost_table(frame)}


def cost_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Per (depth, extra): rows, accuracy against the answer x_d and against the continued chain."""
    g = frame.assign(answer_ok=frame["predicted"] == frame["park_symbol"],
                     iterate_ok=frame["predicted"] == frame["iterate_symbol"]).groupby(["depth", "extra"])
    out = g.agg(n=("row_id", "size"), answer_acc=("answer_ok", "mean"), iterate_acc=("iterate_ok", "mean"))
    return out.reset_index()


def summarize(tables: dict[str, pd.DataFrame]) -> dict:
    """Headline numbers: the iterate / park / other split over every extra loop, with counts."""
    frame = tables["overshoot"]
    counts = frame["cls"].value_counts()
    n = len(frame)
    split = {c: {"count": int(counts.get(c, 0)), "share": round(float(counts.get(c, 0)) / n, 4) if n else None}
             for c in ("iterate", "park", "other")}
    cost = tables["overshoot__cost"].groupby("extra")["answer_acc"].mean()
    return {"extra_loops": n, "split": split, "coincide": int(frame["coincide"].sum()),
            "answer_acc_by_extra": {str(int(k)): round(float(v), 4) for k, v in cost.items()},
            "headline": headline(tables).to_dict()}


@probe_options
class Options:
    """The overshoot probe's options (`run`'s keywords), checked before any probe of a battery runs."""

    extra: int = 5
    batch_size: Count = 16
    progress: bool = False


SPEC = ProbeSpec(
    name="overshoot", parts=("cost",), run=run, summarize=summarize,
    needs=("prompt", "answer", "symbols", "chain", "depth", "table", "start", FUNCTION_TABLE),
    options=Options,
)
