"""The logit-lens probe's headline: per lens, how often x_t ranks first at loop t.

Read from the probe's tables alone (`workbench.probes.logit_lens` writes them), so a results directory is read again
without the model.
"""

from __future__ import annotations

import pandas as pd

from workbench.analysis.headlines import Headline, clustered_mean, judge_above, proportion, ranges

LENSES = ("coda", "raw", "tuned")


def last_loop_answers(f: pd.DataFrame) -> pd.DataFrame:
    """The entries of rows whose depth is not given (chain_index 0: their answer) at the last loop read."""
    answers = f[f["chain_index"] == 0]
    return answers[answers["loop"] == f["loop"].max()]


LENS_WORDS = {"coda": "the Coda readout", "raw": "the raw lens (no Coda)", "tuned": "the tuned lens"}


def headline(tables: dict[str, pd.DataFrame]) -> Headline:
    """Per lens: how often x_t ranks first among the candidates at loop t (t <= d), row bootstrap over entries."""
    f = tables["logit_lens"]
    diag = f[f["chain_index"] == f["loop"]]
    diag = diag.set_index(diag["row_id"] + "@" + diag["loop"].astype(str))
    numbers = []
    for lens in [x for x in LENSES if x in set(diag["lens"])] + sorted(set(diag["lens"]) - set(LENSES)):
        g = diag[diag["lens"] == lens]
        number = clustered_mean(f"top1_{lens}", f"{LENS_WORDS.get(lens, lens)} ranks x_t first at loop t",
                                g["rank"] == 0, g["row_id"],
                                expect="most entries (95% interval above 0.5) for the Coda if each loop holds x_t"
                                if lens == "coda" else "")
        numbers.append(judge_above(number, 0.5) if lens == "coda" else number)
    n_rows = diag["row_id"].nunique()
    words = [f"{LENS_WORDS.get(n.key.removeprefix('top1_'), n.key)} in {n.text()}" for n in numbers]
    sentence = f"At loop t (t ≤ d, d = {ranges(diag['depth'])})"
    if numbers:
        first = LENS_WORDS.get(numbers[0].key.removeprefix("top1_"), numbers[0].key)
        sentence += (f" {first} ranks x_t first among the task's candidates in {numbers[0].text()} of {numbers[0].n} "
                     f"(row, loop) entries from {n_rows} rows" + "".join(f"; {w}" for w in words[1:]))
    answers = last_loop_answers(f)
    if len(answers):  # rows whose depth is not given: their answer at the last loop
        T, found = int(f["loop"].max()), []
        for lens in [x for x in LENSES if x in set(answers["lens"])] + sorted(set(answers["lens"]) - set(LENSES)):
            g = answers[answers["lens"] == lens].set_index("row_id")
            found.append((lens, proportion(f"answer_top1_{lens}", f"{LENS_WORDS.get(lens, lens)} ranks the answer "
                                           f"first at the last loop (rows without a depth)", g["rank"] == 0)))
        numbers += [n for _, n in found]
        words = [f"{LENS_WORDS.get(lens, lens)} in {n.text()}" for lens, n in found]
        (lens, n), rest = found[0], words[1:]
        part = (f"for the {answers['row_id'].nunique()} rows without a depth, at the last loop (t = {T}) "
                f"{LENS_WORDS.get(lens, lens)} ranks the answer first among the candidates in {n.text()}"
                + "".join(f"; {w}" for w in rest))
        sentence = f"{sentence}; {part}" if len(diag) else part[0].upper() + part[1:]
    sentence += "."
    return Headline("logit_lens", numbers, sentence)
