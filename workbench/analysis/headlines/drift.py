"""The drift probe's headline: how far the loop states' principal subspace turns per loop, and the concentration test.

Read from the probe's tables alone (`workbench.probes.drift` writes them), so a results directory is read again
without the model.
"""

from __future__ import annotations

import pandas as pd

from workbench.analysis.headlines import Headline, measured


def headline(tables: dict[str, pd.DataFrame]) -> Headline:
    """Mean principal angle at the first and last consecutive step and against loop 1, and the concentration test."""
    a = tables["drift"].groupby(["comparison", "loop"])["angle_deg"].mean()
    numbers, words = [], []
    if "consecutive" in a.index.get_level_values(0):
        c = a["consecutive"]
        first, last = int(c.index.min()), int(c.index.max())
        for t in dict.fromkeys((first, last)):
            numbers.append(measured(f"consecutive_loop{t}", f"mean principal angle, loop {t} vs {t - 1} (degrees)",
                                    round(float(c[t]), 1), expect="shrinks as the state settles"))
        words.append(f"consecutive loop subspaces turn by {c[first]:.1f}° on average at loop {first}"
                     + (f" and {c[last]:.1f}° at loop {last}" if last != first else ""))
    if "vs_loop1" in a.index.get_level_values(0):
        v = a["vs_loop1"]
        last = int(v.index.max())
        numbers.append(measured(f"vs_loop1_loop{last}", f"mean principal angle, loop {last} vs loop 1 (degrees)",
                                round(float(v[last]), 1)))
        words.append(f"loop {last} sits {v[last]:.1f}° from loop 1")
    conc = tables.get("drift__concentration")
    if conc is not None and len(conc):
        above = conc[conc["top3_share"] > conc["null_p95"]]
        numbers.append(measured("concentrated_loops", "loops whose drift concentrates in 3 heads above the null",
                                int(len(above)), kind="count", n=int(len(conc)), expect="most loops if a few heads drive it"))
        words.append(f"the drift outside loop 1's subspace concentrates in three heads' subspaces above the random-"
                     f"partition null at {len(above)} of {len(conc)} loops")
    sentence = ("; ".join(words) + ".") if words else "No drift measured."
    return Headline("drift", numbers, sentence[0].upper() + sentence[1:])
