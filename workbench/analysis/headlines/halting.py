"""The halting probe's headline: the head at its chosen threshold against the best fixed depth and the oracle.

Read from the probe's tables alone (`workbench.probes.halting` writes them), so a results directory is read again
without the model.
"""

from __future__ import annotations

import pandas as pd

from workbench.analysis.headlines import Headline, measured, proportion


def headline(tables: dict[str, pd.DataFrame]) -> Headline:
    """The head at its chosen tau against the best fixed depth and the oracle, on the reported rows."""
    f = tables["halting"]
    rows = tables.get("halting__rows")
    reported = rows[(rows["split"] == "reported") & (rows["head"] == "head")] if rows is not None else None
    numbers, words = [], []
    floored = sorted({m for m in f["method"] if m.startswith("head+floor")})
    for method, words_of in (("fixed_k", "the best fixed depth"), ("head", "the halting head"),
                             *((m, f"the halting head with a {m.removeprefix('head+floor')}-loop floor")
                               for m in floored), ("oracle", "the oracle")):
        g = f[(f["method"] == method) & f["chosen"]] if "chosen" in f else f[f["method"] == method]
        if g.empty:
            continue
        r = g.iloc[0]
        n = int(r["n"]) if "n" in r else 0
        acc = measured(f"{method}_accuracy", f"accuracy, {words_of}", round(float(r["accuracy"]), 4), "proportion",
                       n=n or None)
        if reported is not None and method == "fixed_k":  # per-row correctness at that depth: a Wilson interval
            at = reported[reported["loop"] == int(r["mean_loops"])].set_index("row_id")["correct_answer"]
            acc = proportion(f"{method}_accuracy", f"accuracy, {words_of} (k = {int(r['mean_loops'])})", at)
        loops = measured(f"{method}_loops", f"mean loops, {words_of}", round(float(r["mean_loops"]), 2))
        numbers += [acc, loops]
        tau = "" if pd.isna(r["threshold"]) else f" at tau = {r['threshold']:g}"
        words.append(f"{words_of}{tau} reads {acc.text()} after {loops.value} loops on average")
    how = f" by {f['select'].iloc[-1]}" if "select" in f else ""
    sentence = ("; ".join(words) + f" (thresholds chosen{how} on calibration rows, read on the others).") if words \
        else "No halting result."
    return Headline("halting", numbers, sentence[0].upper() + sentence[1:])
