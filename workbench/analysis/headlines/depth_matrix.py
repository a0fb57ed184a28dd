"""The depth-matrix probe's headline: the worst cell within the trained support, the final answer per depth and
the frontier.

The frontier table is computed here from the matrix too (`frontier_table`): the probe writes it, and a results
directory without it still has a headline.

Read from the probe's tables alone (`workbench.probes.depth_matrix` writes them), so a results directory is read
again without the model.
"""

from __future__ import annotations

import math

import pandas as pd

from workbench.analysis.headlines import Headline, fmt, measured, proportion, ranges, span
from workbench.analysis.stats import frontier
from workbench.defaults import INSTALL_BAR

BARS = (0.60, INSTALL_BAR, 0.80)


def diagonal(frame: pd.DataFrame) -> pd.Series:
    """Final-answer accuracy (loop = depth) per depth."""
    final = frame[frame["loop"] == frame["depth"]]
    return final.groupby("depth")["correct"].mean().astype(float)


def frontier_table(frame: pd.DataFrame, support: int | None, bars=BARS) -> pd.DataFrame:
    """Returns bar, frontier, support, frontier_over_support, support_source from a depth_matrix frame."""
    acc = diagonal(frame)
    source = "trained" if support else "rows"
    support = support or int(frame["depth"].max())
    records = []
    for bar in bars:
        f = frontier(acc.to_dict(), bar=bar)
        records.append({"bar": float(bar), "frontier": f, "support": int(support),
                        "frontier_over_support": f / support if not math.isnan(f) else math.nan,
                        "support_source": source})
    return pd.DataFrame.from_records(records)


def support_of(tables: dict[str, pd.DataFrame]) -> tuple[int, bool]:
    """(support, whether it is the trained support); older tables without `support_source` count a
    support below the rows' max depth as trained."""
    front = tables["depth_matrix__frontier"]
    support = int(front["support"].iloc[0])
    if "support_source" in front:
        return support, front["support_source"].iloc[0] == "trained"
    return support, support < int(tables["depth_matrix"]["depth"].max())


def headline(tables: dict[str, pd.DataFrame]) -> Headline:
    """The worst cell t <= d within the trained support, the final answer per depth, the frontier.

    Proportions carry Wilson intervals over rows (each row is read once per loop).
    """
    frame = tables["depth_matrix"]
    if "depth_matrix__frontier" not in tables:  # a partial results directory: the frontier from the matrix
        tables = {**tables, "depth_matrix__frontier": frontier_table(frame, None)}
    front = tables["depth_matrix__frontier"]
    support, trained = support_of(tables)
    active = frame[(frame["loop"] <= frame["depth"]) & frame["correct"].notna()]
    within = active[active["depth"] <= support] if trained else active
    cells = {}
    for (d, t), g in within.groupby(["depth", "loop"]):
        values = g.set_index(g["row_id"] + f"@{int(t)}")["correct"]
        cells[(int(d), int(t))] = proportion("worst_cell", "", values)
    (wd, wt), worst = min(cells.items(), key=lambda kv: (kv[1].value, -(kv[1].n or 0)))
    depths_in = sorted({d for d, _ in cells})
    where = f"d = {ranges(depths_in)}" + (" (the trained support)" if trained else "")
    worst.label = f"worst cell t ≤ d, d = {ranges(depths_in)} (at d = {wd}, t = {wt})"
    worst.expect = "≈ 1.00 if each loop applies the rule once"
    final = active[active["loop"] == active["depth"]]
    finals = []
    for d, g in final.groupby("depth"):
        past = trained and d > support
        finals.append(proportion(f"final_d{int(d)}", f"final answer (t = d), d = {int(d)}",
                                 g.set_index("row_id")["correct"],
                                 expect="falls past the support" if past else "≈ 1.00 within the support"))
    by_bar = {round(float(r.bar), 2): r for r in front.itertuples()}
    bar = min(by_bar, key=lambda b: abs(b - INSTALL_BAR))
    main = by_bar[bar]
    numbers = [worst, *finals,
               measured(f"frontier_{bar:.2f}", f"frontier at {bar:.2f} (where the diagonal crosses it)",
                        _round(main.frontier), expect="beyond the support")]
    if trained:
        numbers.append(measured(f"frontier_over_support_{bar:.2f}", f"frontier / trained support of {support}",
                                rounded(main.frontier_over_support), kind="ratio", expect="> 1 (paper: 1.44-1.50)"))
    # words
    all_cells_equal = len({fmt(c.value, "proportion") for c in cells.values()}) == 1
    ns = sorted({c.n for c in cells.values()})
    n_text = f"n = {ns[0]}" if len(ns) == 1 else f"n = {ns[0]}-{ns[-1]} per cell"
    if trained:
        if all_cells_equal:
            first = f"Loop t decodes x_t at {worst.text()}, {n_text}, for every t ≤ d, {where}"
        else:
            first = (f"Loop t decodes x_t at {worst.text()} or better (worst cell d = {wd}, t = {wt}, n = {worst.n}) "
                     f"for every t ≤ d, {where}")
        past = [f for f in finals if int(f.key.removeprefix("final_d")) > support]
        if past:
            first += "; past it the final answer reads " + _join(
                [f"{f.text()} at d = {f.key.removeprefix('final_d')}" for f in past])
    else:
        first = (f"With no trained support, the final answer (t = d) reads {span(f.value for f in finals)} over "
                 f"d = {ranges(final['depth'])} (worst cell d = {wd}, t = {wt}: {worst.text()}, n = {worst.n})")
    sentence = f"{first}; {_frontier_words(main, bar, support, trained, by_bar, finals)}."
    return Headline("depth_matrix", numbers, sentence)


def _frontier_words(main, bar, support, trained, by_bar, finals) -> str:
    if math.isnan(main.frontier):
        return f"the final answer at d = {finals[0].key.removeprefix('final_d')} is below {bar:.2f}, so there is no frontier"
    last = finals[-1]
    if main.frontier == float(last.key.removeprefix("final_d")) and (last.value or 0) >= bar:
        text = f"the diagonal never falls below {bar:.2f} through d = {int(main.frontier)} (the frontier is at least that)"
    else:
        text = f"the frontier at {bar:.2f} is {fmt(_round(main.frontier))}"
    if trained:
        others = [f"{fmt(rounded(r.frontier_over_support), 'ratio')} at {b:.2f}" for b, r in by_bar.items()
                  if b != bar and not math.isnan(r.frontier_over_support)]
        text += (f", {fmt(rounded(main.frontier_over_support), 'ratio')} the trained support of {support}"
                 + (f" ({', '.join(others)})" if others else ""))
    return text


def _join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _round(x: float) -> float | None:
    return None if math.isnan(x) else round(float(x), 2)


def rounded(x: float) -> float | None:
    return None if math.isnan(x) else round(float(x), 4)
