"""Depth matrix: active-label accuracy at every (depth d, loop t <= d), the diagonal, and the frontier.

One forward per row batch reads every loop through the reader (`workbench.tasks.reader`).

Tables:
    depth_matrix: row_id, depth, loop, target, predicted, correct — one row per (row_id, loop <= T);
        `target` is x_t for t <= d, None past d (where `correct` is <NA>).
    depth_matrix__frontier: bar (0.60, 0.71, 0.80), frontier, support, frontier_over_support,
        support_source — the threshold-crossing depth of the diagonal accuracy (docs/analyses.md),
        `support` the trained support (max supervised depth, `support_source` "trained") when
        known, else the rows' max depth ("rows").
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from workbench.analysis.headlines.depth_matrix import BARS, diagonal, frontier_table, headline, rounded
from workbench.probes.common import ONE_TOKEN, require_symbols
from workbench.probes.options import Count, probe_options
from workbench.probes.spec import ProbeSpec
from workbench.tasks.reader import read_rows


def run(model, tokenizer, rows: list[dict], loops: int | None = None, support: int | None = None,
        bars=BARS, batch_size: int = 16, progress: bool = False) -> dict[str, pd.DataFrame]:
    """Returns {"depth_matrix": per (row, loop) frame, "depth_matrix__frontier": per bar}.

    Args:
        loops: T, loops to read (default the rows' max depth).
        support: the trained support; default the rows' max depth.
        bars: frontier bars.
    """
    require_symbols(rows)
    T = loops or max(r["depth"] for r in rows)
    frame = read_rows(model, tokenizer, rows, loops=T, batch_size=batch_size, progress=progress).frame()
    return {"depth_matrix": frame, "depth_matrix__frontier": frontier_table(frame, support, bars)}


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
        "frontier": {f"{r.bar:.2f}": rounded(r.frontier) for r in front.itertuples()},
        "support": int(front["support"].iloc[0]),
        "frontier_over_support": {f"{r.bar:.2f}": rounded(r.frontier_over_support) for r in front.itertuples()},
        "headline": headline(tables).to_dict(),
    }


@probe_options
class Options:
    """The depth matrix's options (`run`'s keywords), checked before any probe of a battery runs."""

    loops: int | None = None
    support: int | None = None
    bars: Sequence[float] = BARS
    batch_size: Count = 16
    progress: bool = False


SPEC = ProbeSpec(
    name="depth_matrix", parts=("frontier",), run=run, summarize=summarize,
    needs=("prompt", "answer", "symbols", "chain", "depth", ONE_TOKEN),
    options=Options,
)
