"""The overshoot probe's headline: iterate and park shares on the loops past the depth.

Read from the probe's tables alone (`workbench.probes.overshoot` writes them), so a results directory is read again
without the model.
"""

from __future__ import annotations

import pandas as pd

from workbench.analysis.headlines import Headline, clustered_mean, judge_above, proportion, ranges


def headline(tables: dict[str, pd.DataFrame]) -> Headline:
    """Iterate and park shares (row bootstrap) and iterate at the first and last extra loop (Wilson), all on the
    extra loops where the continued chain differs from x_d: where the two coincide the read symbol cannot tell
    iterating from parking, so those loops are counted apart (one denominator per quantity, as the figure and the
    claims ledger use)."""
    f = tables["overshoot"]
    both = f["coincide"].fillna(False).astype(bool) if "coincide" in f.columns else pd.Series(False, index=f.index)
    coincide, f = int(both.sum()), f[~both]
    entries = f.set_index(f["row_id"] + "@" + f["loop"].astype(str))
    clusters = entries["row_id"]
    where = "extra loops where iterate ≠ park"
    iterate_all = judge_above(clustered_mean("iterate", f"iterate the rule, {where}", entries["cls"] == "iterate",
                                             clusters, expect="most (95% interval above 0.5) if the loop keeps "
                                             "applying the rule (paper: 0.93)"), 0.5)
    park_all = clustered_mean("park", f"park on the answer x_d, {where}", entries["cls"] == "park", clusters,
                              expect="low (paper: 1 of 384)")
    first, last = int(f["extra"].min()), int(f["extra"].max())
    at = {k: proportion(f"iterate_k{k}", f"iterate at extra loop k = {k} (loop d + {k}), where iterate ≠ park",
                        f[f["extra"] == k].set_index("row_id")["cls"] == "iterate") for k in (first, last)}
    n_rows = f["row_id"].nunique()
    loops = f"loops {ranges(f['loop'])}"
    sentence = (f"Forced past their depth (d = {ranges(f['depth'])}, {loops}), rows iterate the rule in "
                f"{iterate_all.text()} of {iterate_all.n} extra loops from {n_rows} rows and park on the answer in "
                f"{park_all.text()}; iterate reads {at[first].text()} at the first extra loop")
    if last != first:
        sentence += f" and {at[last].text()} at extra loop {last}"
    sentence += f" (n = {at[last].n} rows)"
    if coincide:
        sentence += (f"; {coincide} further extra loops, where the chain returns to x_d so iterate and park read the "
                     "same symbol, are counted apart")
    return Headline("overshoot", [iterate_all, park_all, *at.values()], sentence + ".")
