"""Two specimens probed on the same rows, number by number: B − A with a paired bootstrap interval over the shared rows,
and the exact McNemar p when the values are 0/1 and one per row (`compare_headlines`, read by `workbench compare`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from workbench.analysis.headlines.values import LEVEL, N_BOOT, Headline, Number, fmt
from workbench.analysis.stats import paired_bootstrap, paired_counts


@dataclass
class Pairing:
    """B − A for one number over the rows both were computed on."""

    key: str
    diff: float | None
    low: float | None
    high: float | None
    p_mcnemar: float | None
    n: int | None
    note: str = ""

    def text(self) -> str:
        if self.diff is None:
            return self.note or "–"
        return f"{self.diff:+.2f} [{self.low:+.2f}, {self.high:+.2f}]"


def pair(a: Number, b: Number, seed: int = 0) -> Pairing:
    """Returns b − a with a paired bootstrap interval over the shared rows, and McNemar's p for 0/1 rows.

    A pairing needs both numbers to carry their per-row values over the same row ids; otherwise
    the result says why there is no paired test.
    """
    if a.units is None or b.units is None:
        return Pairing(a.key, None, None, None, None, None, "")
    if set(a.units.index) != set(b.units.index):
        return Pairing(a.key, None, None, None, None, None, "rows differ")
    ua, ub = a.units.sort_index(), b.units.loc[a.units.sort_index().index]
    clusters = a.clusters.loc[ua.index].to_numpy() if a.clusters is not None else None
    iv = paired_bootstrap(ua.to_numpy(), ub.to_numpy(), n_boot=N_BOOT, seed=seed, clusters=clusters, level=LEVEL)
    p = None
    binary = set(np.unique(np.concatenate([ua.to_numpy(), ub.to_numpy()]))) <= {0.0, 1.0}
    if binary and clusters is None:
        p = paired_counts(ua.to_numpy(), ub.to_numpy()).p_mcnemar
    return Pairing(a.key, iv.estimate, iv.low, iv.high, p, int(len(ua)))


def compare_headlines(a: Mapping[str, Headline], b: Mapping[str, Headline]) -> list[dict]:
    """Returns one record per (probe, number) in either: label, A's and B's text, B − A, McNemar p.

    Probes and numbers keep B's order, then A's extras.
    """
    out = []
    for probe in list(b) + [p for p in a if p not in b]:
        ha, hb = a.get(probe), b.get(probe)
        keys = (hb.keys() if hb else []) + [k for k in (ha.keys() if ha else []) if not hb or k not in hb.keys()]
        for key in keys:
            na = ha[key] if ha and key in ha.keys() else None
            nb = hb[key] if hb and key in hb.keys() else None
            ref = nb or na
            pairing = pair(na, nb) if na is not None and nb is not None else None
            out.append({"probe": probe, "key": key, "label": ref.label, "kind": ref.kind,
                        "a": na.text() if na else "–", "n_a": na.n if na else None,
                        "a_value": fmt(na.value, na.kind) if na else "–",
                        "b": nb.text() if nb else "–", "n_b": nb.n if nb else None,
                        "b_value": fmt(nb.value, nb.kind) if nb else "–",
                        "diff": pairing.text() if pairing else "–",
                        "diff_value": pairing.diff if pairing else None,
                        "diff_low": pairing.low if pairing else None, "diff_high": pairing.high if pairing else None,
                        "p_mcnemar": pairing.p_mcnemar if pairing else None})
    return out
