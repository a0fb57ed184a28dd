"""The loop-dynamics probe's headline: the state's settling classes, contraction rate and step sizes, and the heads'
divergence.

Read from the probe's tables alone (`workbench.probes.dynamics` writes them), so a results directory is read again
without the model.
"""

from __future__ import annotations

import pandas as pd

from workbench.analysis.headlines import Headline, counted, measured

CLASSES = ("settling", "marginal", "drifting")


def state_rows(tables: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """The per-row classes of the state (the last block layer read)."""
    r = tables["dynamics__rows"]
    return r[r["layer"] == r["layer"].max()]


def headline(tables: dict[str, pd.DataFrame]) -> Headline:
    """The state's class shares over rows (Wilson), its median contraction rate past the depth, the mean relative
    step at the first and last pass, and the heads' divergence at the first and last pass pair."""
    rows = state_rows(tables)
    n = len(rows)
    layer = int(rows["layer"].iloc[0]) if n else None
    numbers = [counted(f"{c}_share", f"rows whose state is {c} past their depth", int((rows["cls"] == c).sum()), n,
                       expect="settling if the loop has a fixed point" if c == "settling" else "")
               for c in CLASSES]
    rate = float(rows["rate"].median()) if n else None
    numbers.append(measured("median_rate", "median contraction rate of the state past the depth", rate,
                            expect="< 0.9 settling, ≈ 1 an orbit, > 1.11 drifting", n=n))
    f = tables["dynamics"]
    state = f[f["layer"] == f["layer"].max()].groupby("loop")["rel_step"].mean().dropna()
    words = []
    if len(state):
        first, last = int(state.index.min()), int(state.index.max())
        for t in dict.fromkeys((first, last)):
            numbers.append(measured(f"rel_step_{t}", f"mean relative step of the state, pass {t} → {t + 1}",
                                    round(float(state[t]), 4), expect="shrinks if the state settles"))
        words.append(f"its relative step is {state[first]:.3g} from pass {first} to {first + 1} and {state[last]:.3g} "
                     f"from {last} to {last + 1}")
    h = tables.get("dynamics__heads")
    if h is not None and len(h):
        js = h.groupby("loop")["js_mean"].mean()
        a, b = int(js.index.min()), int(js.index.max())
        for t in dict.fromkeys((a, b)):
            numbers.append(measured(f"head_js_{t}", f"mean head attention divergence, passes {t} and {t + 1} (nats)",
                                    round(float(js[t]), 5), expect="shrinks if the heads stabilise"))
        words.append(f"the heads' read-position attention moves by {js[a]:.3g} nats (mean JS) between passes {a} and "
                     f"{a + 1} and {js[b]:.3g} between {b} and {b + 1}")
    shares = ", ".join(f"{nb.text()} {c}" for c, nb in zip(CLASSES, numbers))
    unknown = int((rows["depth"] < 1).sum()) if n else 0   # a user's rows without a depth: classed from pass 1
    where = ("From pass 1 (no row gives a depth)" if unknown == n else
             "Past each row's depth (from pass 1 where a row gives none)" if unknown else "Past each row's depth")
    sentence = (f"{where} the state (block layer {layer}) is {shares} of {n} rows (median contraction rate "
                f"{rate:.3g})" if n else "No rows")
    sentence += ("; " + "; ".join(words)) if words else ""
    return Headline("dynamics", numbers, sentence + ".")
