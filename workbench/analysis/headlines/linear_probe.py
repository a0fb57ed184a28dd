"""The linear-probe headline: per target, the worst loop's held-out accuracy against its null.

Read from the probe's tables alone (`workbench.probes.linear_probe` writes them), so a results directory is read
again without the model.
"""

from __future__ import annotations

import pandas as pd

from workbench.analysis.headlines import Headline, counted, judge_above, ranges

TARGET_WORDS = {"x_t": "x_t", "x_prev": "x_{t−1}", "x_next": "x_{t+1}"}


def headline(tables: dict[str, pd.DataFrame]) -> Headline:
    """Per target, at the loop state: the worst loop's held-out accuracy (Wilson over its test rows) and the
    largest null p95 (block-layer sites are in the figure)."""
    f = tables["linear_probe"].dropna(subset=["accuracy"])
    f = f[f["site"] == "state"]
    numbers, words = [], []
    for target in [t for t in TARGET_WORDS if t in set(f["target"])]:
        g = f[f["target"] == target]
        worst = g.loc[g["accuracy"].idxmin()]
        t, n = int(worst["loop"]), int(worst["n_test"])
        null = float(g["null_p95"].max())
        num = counted(f"state/{target}", f"{TARGET_WORDS[target]} from loop t's state, worst t = {t} "
                                         f"(null p95 ≤ {null:.2f})",
                      round(float(worst["accuracy"]) * n), n,
                      expect="95% interval above the null's p95" + (" (≈ 1 if the state holds x_t)"
                                                                     if target == "x_t" else ""))
        judge_above(num, null)
        numbers.append(num)
        words.append(f"{TARGET_WORDS[target]} at {num.text()} or better (worst t = {t}, n = {n} test rows; "
                     f"null p95 ≤ {null:.2f})")
    sentence = (f"A logistic probe on loop t's state at the read position (t = {ranges(f['loop'])}, held-out rows) "
                f"decodes " + "; ".join(words) + ".") if words else "No linear probe was fitted on the loop state."
    return Headline("linear_probe", numbers, sentence)
