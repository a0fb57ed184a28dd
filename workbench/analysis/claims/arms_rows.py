"""The arms compared, row-paired: a looped arm against the full block, a direct or a scratchpad control (paper 000's
arms rows), their final answers depth by depth, beyond the trained support, pooled, and their batch-1 latency;
each row's null is the same comparison with the credited arm answering the majority answer (`majority_arm`).
Registered where written (`@measure`, `@verdict_test`), as `retrofit`'s."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pandas as pd

from workbench.analysis.arms import Arm, compare_arms, load_arm
from workbench.analysis.claims.ledger import (
    ALPHA,
    MAJORITY,
    ROOT,
    Missing,
    _gate,
    _results,
    _top,
    measure,
    verdict_test,
)
from workbench.analysis.headlines import ranges
from workbench.analysis.results import read_table
from workbench.defaults import INSTALL_BAR
from workbench.readers import read_json


# ----------------------------------------------------------------------------- measures
def _load_arms(specimen: Path, claim: dict) -> tuple[Arm, Arm]:
    """`specimen` (A) and `claim["against"]` (B), read from their `results` folders."""
    other = claim.get("_root", ROOT) / claim["against"]
    results = claim.get("results", "arms")
    for s in (specimen, other):
        _results(s, results)
    return load_arm(specimen, specimen / results), load_arm(other, other / results)


def majority_arm(arm: Arm) -> Arm:
    """`arm`'s rows answered by the most frequent target at each depth (from its own table): a policy that reads
    nothing, in the arm's place."""
    dm, fa = arm.results_dir / "depth_matrix.parquet", arm.results_dir / "final.parquet"
    f = read_table(dm) if dm.is_file() else read_table(fa)
    if "loop" in f:
        f = f[f["loop"] == f["depth"]]
    f = f.assign(correct=f["target"] == f.groupby("depth")["target"].transform(_top))
    final = arm.final[["row_id", "depth"]].merge(f[["row_id", "depth", "correct"]], on=["row_id", "depth"],
                                                 validate="one_to_one")
    return replace(arm, name=MAJORITY, final=final, latency=None, guardrail=None)


def _arms_measure(read):
    """A measure on the paired comparison of A and B, with its null: the same reading with the arm the claim credits
    (B for `b_leads_beyond`, else A) answering the majority answer at each depth."""
    def measured(specimen: Path, claim: dict) -> dict:
        a, b = _load_arms(specimen, claim)
        out = read(compare_arms(a, b), claim)
        if claim["test"] == "b_leads_beyond":
            null, whose = read(compare_arms(a, majority_arm(b)), claim), b.name
        else:
            null, whose = read(compare_arms(majority_arm(a), b), claim), a.name
        out["nulls"] = {f"{MAJORITY} in place of {whose}": null}
        return out
    measured.__name__, measured.__doc__ = read.__name__, read.__doc__
    return measured


@measure
@_arms_measure
def arms_depths(out: dict, claim: dict) -> dict:
    """A vs B final-answer counts at the claim's depths, row-paired (exact McNemar) and unpaired (Fisher)."""
    d = out["depths"].set_index("depth").loc[claim["depths"]]
    counts = [[[int(r.a_correct), int(r.n)], [int(r.b_correct), int(r.n)]] for r in d.itertuples()]
    a, b = out["arms"]
    text = "; ".join(f"d{i}: {r.a_correct}/{r.n} vs {r.b_correct}/{r.n}" for i, r in zip(d.index, d.itertuples()))
    return {"counts": counts, "depths": d.reset_index().to_dict("records"), "rows": int(d["n"].sum()),
            "text": f"{a} vs {b}: {text}"}


def _frontier_spread(frame: pd.DataFrame, arm: str) -> str:
    """An arm's frontier at 0.71 with its sensitivity over the bars 0.60-0.80 ("5.61 (0.60-0.80: 5.42-6.16)")."""
    g = frame[frame["arm"] == arm].set_index("bar")["frontier"]
    spread = [float(g[b]) for b in (0.60, 0.71, 0.80) if b in g.index and not math.isnan(g[b])]
    at = float(g[0.71]) if 0.71 in g.index else math.nan
    return f"{at:.2f}" + (f" (0.60-0.80: {min(spread):.2f}-{max(spread):.2f})" if spread else "")


@measure
@_arms_measure
def arms_beyond(out: dict, claim: dict) -> dict:
    """A vs B pooled beyond the trained support (paired), the crossover depth and each arm's frontier at 0.71 with
    its 0.60-0.80 sensitivity. `b_horizon_bar`: B must fall below that accuracy at some depth beyond the support,
    else the rows never reach B's horizon and the claim about what lies past it is not comparable."""
    if "beyond_support" not in out["pooled"]:
        raise Missing("no depth beyond the trained support was read")
    p = out["pooled"]["beyond_support"]
    inside = out["pooled"]["inside_support"]
    fr = out["frontier"][out["frontier"]["bar"] == 0.71].set_index("arm")["frontier"]
    a, b = out["arms"]
    cross = out["crossover"]
    res = {"beyond": p, "compared": p, "inside": inside, "crossover": cross, "frontier": {a: fr[a], b: fr[b]},
           "rows": p["n"],
           "text": f"beyond the support {a} {p['a_correct']}/{p['n']} vs {b} {p['b_correct']}/{p['n']} "
                   f"({b} helped {p['b_helped']}, hurt {p['b_hurt']}, McNemar p = {p['p_mcnemar']:.3g}); inside "
                   f"{inside['a_correct']} vs {inside['b_correct']} of {inside['n']}; frontiers "
                   f"{_frontier_spread(out['frontier'], a)} vs {_frontier_spread(out['frontier'], b)}; "
                   + (f"cross at depth {cross:.2f}" if cross is not None else "no crossing")}
    bar = claim.get("b_horizon_bar")
    if bar is not None:
        d = out["depths"]
        past = d[d["depth"] > int(out["frontier"]["support"].max())]
        acc = past["b_correct"] / past["n"]
        if (acc >= bar).all():
            _gate(res, f"{b} reads {int(past['b_correct'].sum())}/{int(past['n'].sum())} beyond the support (at least "
                       f"{acc.min():.2f} at every depth {int(past['depth'].min())}-{int(past['depth'].max())}, bar "
                       f"{bar:g}): the rows never reach its horizon, so what happens past it cannot be read")
    return res


@measure
@_arms_measure
def arms_overall(out: dict, claim: dict) -> dict:
    """A vs B pooled over every depth read (paired), with the per-depth counts."""
    p = out["pooled"]["all"]
    a, b = out["arms"]
    per = "; ".join(f"d{r.depth} {r.a_correct} vs {r.b_correct}" for r in out["depths"].itertuples())
    return {"compared": p, "depths": out["depths"].to_dict("records"), "rows": p["n"],
            "text": f"all depths {a} {p['a_correct']}/{p['n']} vs {b} {p['b_correct']}/{p['n']} ({b} helped "
                    f"{p['b_helped']}, hurt {p['b_hurt']}, McNemar p = {p['p_mcnemar']:.3g}); {per} of "
                    f"{int(out['depths']['n'].iloc[0])} each"}


@measure
def arms_latency(specimen: Path, claim: dict) -> dict:
    """Median batch-1 latency per depth of A and B (scripts/final_answers.py), and B / A at each depth."""
    results = claim.get("results", "arms")
    other = claim.get("_root", ROOT) / claim["against"]
    arms = []
    for s in (specimen, other):
        _results(s, results)
        arm = load_arm(s, s / results)
        if arm.latency is None:
            raise Missing(f"{s / results} holds no latency.parquet (scripts/final_answers.py writes it)")
        arms.append(arm)
    a, b = arms
    la, lb = (x.latency.set_index("depth")["median_s"] for x in arms)
    depths = sorted(set(la.index) & set(lb.index))
    per = [{"depth": int(d), "a_s": float(la[d]), "b_s": float(lb[d]), "b_over_a": float(lb[d] / la[d])}
           for d in depths]
    cpu = {x.name: read_json(x.results_dir / "final.json", "final answers").get("cpu") for x in arms}
    out = {"depths": per, "rows": len(depths), "cpu": cpu, "trained": _trained_accuracy(a),
           "text": f"median ms per row, {a.name} vs {b.name}: "
                   + "; ".join(f"d{r['depth']} {1e3 * r['a_s']:.0f} vs {1e3 * r['b_s']:.0f}" for r in per)
                   + f" (batch 1, fp32, {cpu[a.name]})"}
    # its null: the majority answer in A's place, given with no forward pass at all (0 s): faster than anything,
    # and told apart by the floor (A answers its trained depths)
    null = _trained_accuracy(majority_arm(a))
    out["nulls"] = {f"{MAJORITY}, given with no forward pass": {
        "depths": [{**r, "a_s": 0.0, "b_over_a": math.inf} for r in per], "trained": null,
        "text": "0 ms at every depth; " + _trained_text(null)}}
    return out


def _trained_accuracy(arm: Arm) -> dict[int, float]:
    """{depth: final-answer accuracy} of `arm` at the depths it was trained on (its support and below)."""
    acc = arm.accuracy()
    return {int(d): float(v) for d, v in acc.items() if d <= arm.support}


def _trained_text(acc: dict[int, float]) -> str:
    return f"accuracy {min(acc.values()):.2f}-{max(acc.values()):.2f} at its trained depths {ranges(list(acc))}"


# ----------------------------------------------------------------------------- tests
@verdict_test
def no_significant_difference(claim: dict, ours: dict) -> tuple[str, str]:
    """No depth where the arms differ at p < 0.05 (two-sided exact McNemar on the paired rows)."""
    worst = min(ours["depths"], key=lambda r: r["p_mcnemar"])
    ok = worst["p_mcnemar"] >= ALPHA
    return ("reproduced" if ok else "not reproduced"), \
        (f"exact McNemar per depth, smallest p = {worst['p_mcnemar']:.3g} at depth {worst['depth']} "
         f"({worst['a_correct']} vs {worst['b_correct']} of {worst['n']}; one-sided Fisher B > A "
         f"p = {worst['p_fisher_b_greater']:.3g})")


@verdict_test
def b_leads_beyond(claim: dict, ours: dict) -> tuple[str, str]:
    """B (the full block) ahead of A beyond the support: more rows helped than hurt at p < 0.05 (exact McNemar)."""
    p = ours["beyond"]
    ok = p["b_helped"] > p["b_hurt"] and p["p_mcnemar"] < ALPHA
    return ("reproduced" if ok else "not reproduced"), \
        f"beyond the support B helped {p['b_helped']}, hurt {p['b_hurt']} (exact McNemar p = {p['p_mcnemar']:.3g})"


@verdict_test
def a_faster_every_depth(claim: dict, ours: dict) -> tuple[str, str]:
    """A's median batch-1 latency below B's at every depth read, A being a model that answers: its final-answer
    accuracy at each depth it was trained on at least `min_share` (default the installation bar), so that answering
    without computing (the majority answer at no cost) is not "faster"."""
    slower = [r for r in ours["depths"] if r["a_s"] >= r["b_s"]]
    ratios = [r["b_over_a"] for r in ours["depths"]]
    how = (f"B / A latency {min(ratios):.2f}-{max(ratios):.2f} over depths "
           f"{ours['depths'][0]['depth']}-{ours['depths'][-1]['depth']}")
    if slower:
        how += f"; A not faster at depth {', '.join(str(r['depth']) for r in slower)}"
    bar = claim.get("min_share", INSTALL_BAR)
    low = {d: v for d, v in ours["trained"].items() if v < bar}
    how += f"; A's {_trained_text(ours['trained'])} (floor {bar:g})"
    if low:
        how += f": below it at depth {', '.join(str(d) for d in low)}"
    return ("reproduced" if not slower and not low else "not reproduced"), how
