"""The patching probe's headline: where the read-position state first carries an edited entry, and the cell that
recovers most per corruption.

Read from the probe's tables alone (`workbench.probes.patching` writes them), so a results directory is read again
without the model.
"""

from __future__ import annotations

import pandas as pd

from workbench.analysis.headlines import Headline, Number, measured

RECOVERS = 0.5   # the registered bar: a cell "recovers" the answer when its share's estimate reaches it


def first_recovering(steps: pd.DataFrame) -> dict[int, int | None]:
    """{step k: the first loop whose read-position state recovers >= RECOVERS of the margin (None: none does)}."""
    out = {}
    for k, g in steps.groupby("step"):
        hit = g[g["recovered"] >= RECOVERS].sort_values("loop")
        out[int(k)] = int(hit["loop"].iloc[0]) if len(hit) else None
    return out


def headline(tables: dict[str, pd.DataFrame]) -> Headline:
    """The operation reading (does the read-position state first carry an edited entry at the loop that reads
    it?), and for each corruption the attention or MLP cell that recovers most."""
    steps, g, pairs = tables["patching__steps"], tables["patching__grid"], tables["patching__pairs"]
    numbers: list[Number] = []
    first = first_recovering(steps)
    if first:
        matched = sum(1 for k, t in first.items() if t == k)
        numbers.append(measured("steps_at_their_loop", "steps whose read-position state first carries the edit at "
                                "the loop that reads it", matched, kind="count", n=len(first),
                                expect=f"= {len(first)} (one lookup per loop)"))
        for k in sorted(first):
            row = steps[(steps["step"] == k) & (steps["loop"] == k)]
            if len(row):
                r = row.iloc[0]
                numbers.append(Number(f"state_recovered_step{k}_loop{k}", f"read-position state at loop {k}, entry "
                                      f"read by loop {k}", float(r.recovered), int(r.n), float(r.low), float(r.high),
                                      "row bootstrap", "proportion", f">= {RECOVERS}"))
            before = steps[(steps["step"] == k) & (steps["loop"] == k - 1)]
            if len(before):
                r = before.iloc[0]
                numbers.append(Number(f"state_recovered_step{k}_loop{k - 1}", f"read-position state at loop {k - 1}, "
                                      f"entry read by loop {k}", float(r.recovered), int(r.n), float(r.low),
                                      float(r.high), "row bootstrap", "proportion", f"< {RECOVERS}"))
    parts = []
    for corruption, part in g[g["component"] != "resid"].groupby("corruption", sort=False):
        best = part.sort_values("recovered", ascending=False).iloc[0]
        numbers.append(Number(f"top_{corruption}", f"{corruption} edit: the most recovering attention / MLP cell "
                              f"({best.component}, loop {best.loop}, layer {best.layer}, {best.position})",
                              float(best.recovered), int(best.n), float(best.low), float(best.high),
                              "row bootstrap", "proportion"))
        parts.append(f"for the {corruption} edit the {best.component} output of layer {best.layer} at loop "
                     f"{best.loop} ({best.position} positions) recovers most, {best.recovered:.2f}")
    if first:
        said = ", ".join(f"step {k}: loop {t if t is not None else 'none'}" for k, t in sorted(first.items()))
        lead = (f"The read-position state first carries an edited entry (>= {RECOVERS} of the margin) at {said}"
                f" ({matched} of {len(first)} steps at their own loop)")
    else:
        lead = "No entry edit was read"
    sentence = "; ".join([lead, *parts, f"{len(pairs)} pairs."])
    return Headline("patching", numbers, sentence)
