"""The heads probe's headline: per loop, the top retrieval head and how concentrated the target mass is against its
null.

Read from the probe's tables alone (`workbench.probes.heads` writes them), so a results directory is read again
without the model.
"""

from __future__ import annotations

import pandas as pd

from workbench.analysis.headlines import Headline, counted, judge_above, measured


def headline(tables: dict[str, pd.DataFrame]) -> Headline:
    """Per loop: the top head by target-mass share and on how many rows it retrieves (Wilson), and the
    concentration of target mass against its circular-shift null."""
    s, frame = tables["heads__summary"], tables["heads"]
    numbers, above, tops = [], [], []
    for loop, g in s.groupby("loop"):
        t = int(loop)
        top = g.sort_values("share", ascending=False).iloc[0]
        name = f"L{int(top['layer'])}H{int(top['head'])}"
        n = int(frame.loc[frame["loop"] == t, "row_id"].nunique())
        numbers.append(judge_above(counted(f"top_head_loop{t}", f"loop {t}: rows on which the top head ({name}) "
                                           "retrieves", round(float(top["retrieval_frac"]) * n), n,
                                           expect="most rows (95% interval above 0.5) if one head does the lookup"),
                                   0.5))
        conc, null = float(g["concentration"].iloc[0]), float(g["null_p95"].iloc[0])
        numbers.append(judge_above(measured(f"concentration_loop{t}",
                                            f"loop {t}: top-2 concentration (null p95 {null:.2g})", conc,
                                            expect="above the null's p95"), null))
        if conc > null:
            above.append(t)
        tops.append(f"{name} at loop {t} ({float(top['share']):.2f} of the mass, retrieving on {numbers[-2].text()} "
                    f"of {n} rows)")
    loops = sorted(int(t) for t in s["loop"].unique())
    sentence = (f"The head carrying most of the target-line attention is {'; '.join(tops)}; the target mass "
                f"concentrates above its circular-shift null at {len(above)} of {len(loops)} loops"
                + (f" ({', '.join(map(str, above))})" if above else "") + ".")
    return Headline("heads", numbers, sentence)
