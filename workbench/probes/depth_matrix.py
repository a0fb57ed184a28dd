"""Depth matrix: active-label accuracy at every (depth d, loop t <= d), the diagonal, and the frontier.

One forward per row batch reads every loop through the reader (`workbench.tasks.reader`).

Tables:
    depth_matrix: row_id, depth, loop, target, predicted, correct — one row per (row_id, loop <= T);
        `target` is x_t for t <= d, None past d (where `correct` is <NA>).
    depth_matrix__frontier: bar (0.60, 0.71, 0.80), frontier, support, frontier_over_support —
        the threshold-crossing depth of the diagonal accuracy (ANALYSES.md §3), `support` the
        trained support (max supervised depth) when known, else the manifest's max depth.
"""

from __future__ import annotations

import math

import pandas as pd

from workbench.stats import frontier
from workbench.tasks.reader import read_rows

BARS = (0.60, 0.71, 0.80)


def run(model, tokenizer, rows: list[dict], loops: int | None = None, support: int | None = None,
        bars=BARS, batch_size: int = 16, progress: bool = False) -> dict[str, pd.DataFrame]:
    """Returns {"depth_matrix": per (row, loop) frame, "depth_matrix__frontier": per bar}.

    Args:
        loops: T, loops to read (default the rows' max depth).
        support: the trained support; default the rows' max depth.
        bars: frontier bars.
    """
    T = loops or max(r["depth"] for r in rows)
    frame = read_rows(model, tokenizer, rows, loops=T, batch_size=batch_size, progress=progress).frame()
    return {"depth_matrix": frame, "depth_matrix__frontier": frontier_table(frame, support, bars)}


def diagonal(frame: pd.DataFrame) -> pd.Series:
    """Final-answer accuracy (loop = depth) per depth."""
    final = frame[frame["loop"] == frame["depth"]]
    return final.groupby("depth")["correct"].mean().astype(float)


def frontier_table(frame: pd.DataFrame, support: int | None, bars=BARS) -> pd.DataFrame:
    """Returns bar, frontier, support, frontier_over_support from a depth_matrix frame."""
    acc = diagonal(frame)
    support = support or int(frame["depth"].max())
    records = []
    for bar in bars:
        f = frontier(acc.to_dict(), bar=bar)
        records.append({"bar": float(bar), "frontier": f, "support": int(support),
                        "frontier_over_support": f / support if not math.isnan(f) else math.nan})
    return pd.DataFrame.from_records(records)


def matrix(frame: pd.DataFrame) -> dict[str, dict[str, float]]:
    """{depth: {loop: active-label accuracy}} for t <= d."""
    active = frame[frame["loop"] <= frame["depth"]]
    out: dict[str, dict[str, float]] = {}
    for (d, t), v in active.groupby(["depth", "loop"])["correct"].mean().items():
        out.setdefault(str(int(d)), {})[str(int(t))] = round(float(v), 4)
    return out


def summarize(tables: dict[str, pd.DataFrame]) -> dict:
    """Headline numbers: the matrix, the diagonal, pooled counts and the frontier at each bar."""
    frame, front = tables["depth_matrix"], tables["depth_matrix__frontier"]
    active = frame[frame["loop"] <= frame["depth"]]
    final = frame[frame["loop"] == frame["depth"]]
    return {
        "rows": int(frame["row_id"].nunique()),
        "matrix": matrix(frame),
        "diagonal": {str(int(d)): round(float(v), 4) for d, v in diagonal(frame).items()},
        "final_correct": int(final["correct"].sum()),
        "final_total": len(final),
        "active_correct": int(active["correct"].sum()),
        "active_total": len(active),
        "frontier": {f"{r.bar:.2f}": _num(r.frontier) for r in front.itertuples()},
        "support": int(front["support"].iloc[0]),
        "frontier_over_support": {f"{r.bar:.2f}": _num(r.frontier_over_support) for r in front.itertuples()},
    }


def _num(x: float) -> float | None:
    return None if math.isnan(x) else round(float(x), 4)
