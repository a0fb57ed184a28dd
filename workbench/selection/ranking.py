"""The window sweep's statistics (`workbench.selection.window_sweep`): each candidate's seeds pooled into one table row, the
ranking rule, the recommendation's margin over the runner-up, and Stage 1's agreement with the trained ranking.

The rule, fixed before any run reads it: finished before stopped by the guardrail, then held-out CE (mean over rows
of the mean CE over the row's loops t <= d, or over loops 2 <= t <= d with `cells="iterate"`; lower first), then the
window's start. The recommendation is *separated* from the runner-up when the paired per-row CE difference's
bootstrap interval excludes 0 and every seed pair orders the two the same way.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.stats import spearmanr

from workbench.analysis.stats import bootstrap_mean, paired_bootstrap, wilson
from workbench.errors import WorkbenchError

RANK_CELLS = ("all", "iterate")         # the cells the ranking CE reads: every loop t <= d, or loops 2 <= t <= d


def cells_key(cells: str) -> str:
    if cells not in RANK_CELLS:
        raise WorkbenchError(f"--rank-cells {cells!r} is unknown; accepted: {', '.join(RANK_CELLS)}")
    return "row_ce" if cells == "all" else "row_ce_iterate"


def summarize(name: str, role: str, readings: list[dict | None], runs: list[dict], cells: str = "all") -> dict:
    """One table row: a candidate's seeds pooled (per-row CE, over the `cells` the rule reads, averaged over its
    finished seeds)."""
    key = cells_key(cells)
    done = [r for r in readings if r is not None]
    stopped = [run for run in runs if run.get("status") != "finished"]
    row = {"window": name, "role": role, "seeds": len(runs), "runs": runs,
           "stopped_by_guardrail": bool(stopped)}
    if not done:
        return {**row, "heldout_ce": None}
    if any(key not in r or not r[key] for r in done):
        raise WorkbenchError(f"{name}: its ranking reading has no {key} (a reading made before --rank-cells "
                             f"{cells}, or no row of depth >= 2); delete its readings/ file and --resume")
    per_row = np.mean([r[key] for r in done], axis=0)
    ci = bootstrap_mean(per_row, n_boot=4000, seed=0)
    d2 = [r["correct"].get("2", {}).get("2") for r in done]
    if all(v is not None for v in d2):
        hits = int(sum(sum(v) for v in d2))
        n = sum(len(v) for v in d2)
        lo, hi = wilson(hits, n)
        row["acc_d2_loop2"] = {"value": hits / n, "low": lo, "high": hi, "n": n}
    row.update(heldout_ce={"value": ci.estimate, "low": ci.low, "high": ci.high, "rows": len(per_row)},
               seed_ce=[float(np.mean(r[key])) for r in done],
               ce=done[0]["ce"] if len(done) == 1 else _mean_tables([r["ce"] for r in done]),
               acc=done[0]["acc"] if len(done) == 1 else _mean_tables([r["acc"] for r in done]),
               row_ce=per_row.tolist())
    return row


def _mean_tables(tables: list[dict]) -> dict:
    return {d: {t: round(float(np.mean([tb[d][t] for tb in tables])), 6) for t in loops}
            for d, loops in tables[0].items()}


def order(table: list[dict]) -> list[dict]:
    """The ranking rule: finished before stopped, then held-out CE (lower first), then the window's start."""
    def key(row):
        ce = row.get("heldout_ce")
        return (row["stopped_by_guardrail"] or ce is None, math.inf if ce is None else ce["value"],
                int(row["window"].split(":")[0]))
    ranked = sorted(table, key=key)
    for i, row in enumerate(ranked, start=1):
        row["rank"] = i
    return ranked


def margin(first: dict, second: dict) -> dict:
    """The recommendation's margin: paired per-row CE difference (second − first) and seed agreement."""
    if first.get("heldout_ce") is None or second.get("heldout_ce") is None:
        return {"separated": False, "why": "the runner-up has no reading (stopped or not trained)"}
    diff = paired_bootstrap(first["row_ce"], second["row_ce"], n_boot=4000, seed=0)
    pairs = [(a, b) for a in first["seed_ce"] for b in second["seed_ce"]]
    agree = all(a < b for a, b in pairs)
    separated = diff.low > 0 and agree
    return {"ce_difference": {"value": diff.estimate, "low": diff.low, "high": diff.high},
            "seed_pairs_agree": agree, "separated": separated,
            "why": ("the interval excludes 0 and every seed pair orders them the same way" if separated else
                    "the paired interval includes 0" if diff.low <= 0 else
                    "a seed pair orders them the other way")}


def spearman(xs: list[float], ys: list[float]) -> float | None:
    """Spearman's rho of two equally long lists (average ranks for ties); None under 3 pairs."""
    if len(xs) < 3:
        return None
    rho = spearmanr(xs, ys).statistic
    return None if rho is None or not np.isfinite(rho) else round(float(rho), 4)


def agreement(selection: dict, ranked: list[dict], damage: list[dict] | None = None) -> dict:
    """How Stage 1 (untrained damage, the span) agrees with the trained ranking over the windows both read.

    `damage` is damage.json (`untrained_damage` of every candidate, the sweep's own); without it, Stage 1's
    windows (its stride) are used, which may share few windows with the candidates."""
    source = damage if damage is not None else selection["windows"]
    damage = {f"{w['block'][0]}:{w['block'][1]}": w["damage"] for w in source}
    both = [r for r in ranked if r["window"] in damage and r.get("heldout_ce") is not None]
    lo, hi = selection["prelude_end"], selection["coda_start"]
    inside = [r for r in ranked if r.get("heldout_ce") is not None]

    def in_span(name):
        a, b = (int(x) for x in name.split(":"))
        return lo <= a and b <= hi
    return {"windows_in_both": [r["window"] for r in both],
            "spearman_damage_vs_ce": spearman([damage[r["window"]] for r in both],
                                              [r["heldout_ce"]["value"] for r in both]),
            "stage1_recommended": "{}:{}".format(*selection["recommended"]),
            "stage1_recommended_rank": next((r["rank"] for r in ranked
                                             if r["window"] == "{}:{}".format(*selection["recommended"])), None),
            "best_in_span": next((in_span(r["window"]) for r in inside), None)}
