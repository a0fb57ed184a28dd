"""The gradient-audit probe's headline: the gradient reaching the re-entry, block and Coda at loop 2, and the
finite-difference check.

Read from the probe's tables alone (`workbench.probes.gradient_audit` writes them), so a results directory is read
again without the model.
"""

from __future__ import annotations

import pandas as pd

from workbench.analysis.headlines import Headline, judge_above, measured


def headline(tables: dict[str, pd.DataFrame]) -> Headline:
    """Gradient RMS reaching the re-entry, block and Coda at loop 2, and the finite-difference agreement."""
    g = tables["gradient_audit"]
    fd = tables["gradient_audit__fd"].iloc[0]
    t = 2 if (g["loop"] == 2).any() else int(g["loop"].max())
    at = g[g["loop"] == t]
    reentry = at[at["group"].str.startswith("reentry")]["grad_rms"]
    pick = {"re-entry": float(reentry.max()) if len(reentry) else float("nan"),
            **{k: float(at.loc[at["group"] == k, "grad_rms"].max()) for k in ("block", "coda") if (at["group"] == k).any()}}
    numbers = [judge_above(measured(f"rms_{k}", f"loop-{t} loss: gradient RMS reaching the {k}", v, expect="> 0"), 0.0)
               for k, v in pick.items()]
    numbers.append(measured("fd_rel_error", "autograd vs finite differences, relative error", float(fd["rel_error"]),
                            expect="≪ 1 (about 1e-2 floor on tiny models)"))
    zero = [k for k, v in pick.items() if not v > 0]
    sentence = (f"Loop {t}'s loss reaches " + ", ".join(f"the {k} (RMS {v:.2g})" for k, v in pick.items())
                + (f"; nothing reaches the {', '.join(zero)}" if zero else "")
                + f"; autograd agrees with finite differences to a relative error of {float(fd['rel_error']):.2g}.")
    return Headline("gradient_audit", numbers, sentence)
