"""The attribution probe's headline: per corruption, how well the gradient estimate ranks the exact patching
grid, and what it costs.

Read from the probe's tables alone (`workbench.probes.attribution` writes them), so a results directory is read
again without the model.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from workbench.analysis.headlines import Headline, Number, measured

# The gradient map is trusted for a component where its Spearman against the exact grid reaches SPEARMAN_BAR and
# at least TOP_BAR of the exact grid's TOP largest cells are among its own TOP (the probe flags each component).
SPEARMAN_BAR, TOP, TOP_BAR = 0.8, 10, 7


def headline(tables: dict[str, pd.DataFrame]) -> Headline:
    """Per corruption: Spearman and top-10 overlap of the gradient map against the exact grid, and the cost ratio."""
    a, cost = tables["attribution__agreement"], tables["attribution__cost"].iloc[0]
    numbers, parts = [], []
    for r in a[a["component"] == "all"].itertuples():
        numbers.append(Number(f"spearman_{r.corruption}", f"{r.corruption} edit: Spearman of the gradient map against "
                              f"the exact grid over {r.cells} cells", None if not np.isfinite(r.spearman) else
                              float(r.spearman), int(r.cells), kind="value", expect=f">= {SPEARMAN_BAR} to trust"))
        numbers.append(measured(f"top10_{r.corruption}", f"{r.corruption} edit: exact grid's top {r.top_k} cells "
                                "among the gradient map's", int(r.top10), kind="count", n=int(r.top_k),
                                expect=f">= {TOP_BAR} of {TOP} to trust"))
        comps = a[(a["corruption"] == r.corruption) & (a["component"] != "all")]
        trusted = [x.component for x in comps.itertuples() if x.trusted]
        parts.append(f"for the {r.corruption} edit the gradient map {'can' if r.trusted else 'cannot'} be trusted "
                     f"(Spearman {r.spearman:.2f}, {r.top10} of the top {r.top_k} cells shared"
                     + (f"; trusted for {', '.join(trusted)}" if trusted and not r.trusted else "") + ")")
    if np.isfinite(cost["ratio"]):
        numbers.append(measured("exact_over_gradient", "exact grid's time over the gradient map's, same pairs",
                                float(cost["ratio"]), kind="ratio", n=int(cost["pairs"])))
        parts.append(f"the exact grid took {cost['ratio']:.0f}x the gradient map's time on {int(cost['pairs'])} pairs "
                     f"({cost['exact_s']:.0f} s against {cost['gradient_s']:.1f} s)")
    sentence = "; ".join(parts) if parts else "No pair was checked against the exact grid (check_pairs = 0)"
    n = len(tables["attribution__pairs"])
    return Headline("attribution", numbers, sentence[0].upper() + sentence[1:] + f"; {n} pairs mapped.")
