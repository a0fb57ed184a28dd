"""The splice probe's headline: per site, span and k0, the share of the class the mechanism predicts, and the
verdict.

Read from the probe's tables alone (`workbench.probes.splice` writes them), so a results directory is read again
without the model.
"""

from __future__ import annotations

from collections import defaultdict

import pandas as pd

from workbench.analysis.headlines import Headline, clustered_mean

CLASSES = ("source_orbit", "lawful", "shortcut", "other")
THRESHOLDS = (("source_orbit", 0.75), ("lawful", 0.75), ("shortcut", 0.50))
VERDICT_HORIZON = 3


def verdict(shares: dict[str, float], n: int) -> str:
    """The registered verdict from class fractions."""
    if n == 0:
        return "undetermined"
    for cls, bar in THRESHOLDS:
        if shares[cls] >= bar:
            return cls
    return "mixed"


SPAN_WORDS = {"all": "every position", "read": "the read position"}
# What the mechanism predicts per span: a read-position splice moves only B's symbol, which A's loop
# then looks up in A's own table; an all-position splice moves B's whole context into loop k0.
PREDICTED = {"read": ("lawful", "≥ 0.75: A's table applied to B's symbol"),
             "all": ("source_orbit", "≥ 0.75: B's whole context moves in")}
CLASS_WORDS = {"lawful": "A applies its own table to B's symbol (lawful)",
               "source_orbit": "A follows B's chain (source orbit)",
               "shortcut": "A ignores the splice (shortcut)"}


def headline(tables: dict[str, pd.DataFrame]) -> Headline:
    """Per (site, span, k0): the share of the class the mechanism predicts for the span, over 1 <= j <= 3
    without coincidences (row bootstrap over pairs), and the verdict in words."""
    f = tables["splice"]
    numbers, groups = [], defaultdict(list)
    for (site, span, k0), g in f.groupby(["site", "span", "k0"], sort=False):
        kept = g[(g["j"] >= 1) & (g["j"] <= VERDICT_HORIZON) & ~g["coincide"]]
        kept = kept.set_index(kept["pair_id"].astype(str) + "@" + kept["j"].astype(str))
        shares = {c: float((kept["cls"] == c).mean()) if len(kept) else float("nan") for c in CLASSES}
        v = verdict(shares, len(kept))
        cls, expect = PREDICTED.get(span, ("lawful", "≥ 0.75"))
        numbers.append(clustered_mean(f"{cls} {site}/{span}/k0={k0}",
                                      f"{cls.replace('_', ' ')} share: {site} at {SPAN_WORDS.get(span, span)}, k0 = {k0}",
                                      kept["cls"] == cls, kept["pair_id"].astype(str), expect=expect))
        groups[v].append(f"{site} at {SPAN_WORDS.get(span, span)} (k0 = {k0}"
                         + (f", {shares[v]:.2f} of {len(kept)} entries)" if v in shares else ")"))
    parts = []
    for v, where in groups.items():
        if v in CLASS_WORDS:
            parts.append(f"{CLASS_WORDS[v]} when B's state is spliced in at {_and(where)}")
        else:
            parts.append(f"no class reaches its bar ({v}) at {_and(where)}")
    sentence = ("; ".join(parts) + f"; {f['pair_id'].nunique()} pairs, j = 1-{VERDICT_HORIZON} loops after the splice, "
                                   f"coincidences left out.")
    return Headline("splice", numbers, sentence[0].upper() + sentence[1:])


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]
