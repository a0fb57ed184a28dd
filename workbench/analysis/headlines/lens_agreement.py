"""The lens-agreement probe's headline: per lens, x_t ranked first and agreement with the final output, what a
splice carries, and the t = T identity.

Read from the probe's tables alone (`workbench.probes.lens_agreement` writes them), so a results directory is read
again without the model.
"""

from __future__ import annotations

import pandas as pd

from workbench.analysis.headlines import Headline, clustered_mean, measured, ranges

LENSES = ("logit", "coda", "tuned")
WORDS = {"logit": "the logit lens", "coda": "the coda lens", "tuned": "the tuned lens"}


def headline(tables: dict[str, pd.DataFrame]) -> Headline:
    """Per lens: x_t ranked first at t <= d and agreement with the final output at every pass (row bootstrap
    over (row, pass) entries); per lens the share of disagreeing cells its reading carries through a splice;
    the t = T identity."""
    f = tables["lens_agreement"]
    f = f.set_index(f["row_id"] + "@" + f["loop"].astype(str))
    numbers, words = [], []
    inside = f[(f["loop"] <= f["depth"]) & f["agree_label"].notna()]   # a user's row without a chain: only t = d
    for lens in [x for x in LENSES if x in set(f["lens"])]:
        g = inside[inside["lens"] == lens]
        if len(g):
            numbers.append(clustered_mean(f"label_{lens}", f"{WORDS[lens]} reads x_t at pass t (t ≤ d)",
                                          g["agree_label"].astype(float), g["row_id"],
                                          expect="high for the coda lens" if lens == "coda" else ""))
            words.append(f"{WORDS[lens]} reads x_t in {numbers[-1].text()}")
        g = f[f["lens"] == lens]
        numbers.append(clustered_mean(f"final_{lens}", f"{WORDS[lens]} agrees with the final output (every pass)",
                                      g["agree_final"].astype(float), g["row_id"]))
    sentence = (f"At pass t ≤ d (d = {ranges(f['depth'])}, {f['row_id'].nunique()} rows) " + "; ".join(words)
                if words else "No pass within the depth")
    if not words and (f["depth"] < 1).any():   # rows from a user's file without a depth: no pass has a label x_t
        finals = [n for n in numbers if n.key.startswith("final_")]
        agree = [f"{WORDS[n.key.removeprefix('final_')]} agrees with the final output in {n.text()} of (row, pass) "
                 "entries" for n in finals]
        sentence = f"No row gives a depth ({f['row_id'].nunique()} rows), so no pass has a label x_t; " + "; ".join(agree)
    causal = tables.get("lens_agreement__causal")
    if causal is not None and len(causal):
        j = 1 if (causal["j"] == 1).any() else 0
        kept = causal[(causal["j"] == j) & ~causal["coincide"].astype(bool)]
        kept = kept.set_index(kept["row_a"] + "@" + kept["loop"].astype(str) + ">" + kept["row_b"])
        for kind, lenses, words_of in (("logit-coda", ("logit", "coda"), "the logit and coda lenses disagree"),
                                       ("all", LENSES, "any two lenses disagree")):
            cells = kept if kind == "all" else kept[kept["disagree"] == kind]
            parts = []
            for lens in lenses:
                g = cells[cells[lens].notna()]
                if len(g):
                    key = f"carried_{lens}" + ("" if kind == "all" else "_logit_coda")
                    numbers.append(clustered_mean(key, f"cells where {words_of} whose {lens} reading a splice "
                                                  f"carries (j = {j})", g[f"carried_{lens}"].astype(float), g["row_a"],
                                                  expect="high for the causal lens"))
                    parts.append(f"{lens} {numbers[-1].text()}")
            if parts:
                sentence += (f"; where {words_of} ({len(cells)} spliced cells without coincidences) B's read {j} "
                             f"pass{'es' if j != 1 else ''} after the splice follows the reading of " + ", ".join(parts))
            else:
                sentence += f"; no spliced cell where {words_of}"
    ident = tables.get("lens_agreement__identity")
    if ident is not None and len(ident):
        diff = float(ident["max_abs_diff"].iloc[0])
        numbers.append(measured("identity_max_abs_diff", "max |Δlogit|, coda lens at t = T vs the model's output",
                                diff, expect="≈ 0 (checked; the probe fails otherwise)", n=int(ident["rows"].iloc[0])))
        sentence += f"; at t = T the coda lens is the model's output (max |Δlogit| {diff:.2g})"
    return Headline("lens_agreement", numbers, sentence + ".")
