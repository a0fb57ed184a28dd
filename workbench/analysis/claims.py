"""The claims ledger: each testable claim of the two papers against a committed specimen's numbers.

The claims and the papers' numbers live in `workbench/data/claims.toml` (data, not code). Each
names a `measure` (a function below) that reads a specimen's committed battery results
(`<specimen>/battery/summary.json` and the parquet tables beside it), and a `test` that turns
the paper's number and ours into a verdict:

- reproduced: ours meets the paper's claim under the stated test;
- not reproduced: ours misses it (the comparison says by how much);
- not comparable: the specimen or its results are missing, or the setting cannot answer it (a *gate*
  failed: the loops read lie past the trained support, the Stage 1 model does not park, an arm has not
  installed a depth, the control never reaches its horizon, ...). Ours is still measured and shown, with
  what the rule alone would read, what would make the claim comparable and what that costs
  (`comparable_when`, `cost`: measured seconds per step from a committed run's provenance).

Every claim declares its `rule` (the verdict rule and its bar, in words) in the data file before the
specimen it reads is trained; the ledger prints it. The rules are built so that a trivial policy
cannot pass them: a halting head must also beat every constant-depth policy at its own mean loops,
installation gates hold per depth, overshoot counts the cells where the chain's cycle makes the
iterate and park symbols coincide apart, a stateful claim is gated on the best rule with no model.

The ledger is a pure function of committed files, so `workbench claims` regenerates it byte
for byte (a test checks `claims/LEDGER.md`).
"""

from __future__ import annotations

import html
import json
import math
import re
from pathlib import Path

import pandas as pd
from scipy import stats as sps

from workbench.analysis.arms import compare_arms, load_arm
from workbench.analysis.headlines import ranges
from workbench.analysis.results import read_table
from workbench.analysis.stats import PairedCounts, fisher, paired_counts, paired_difference
from workbench.defaults import DATA, data_root
from workbench.errors import WorkbenchError
from workbench.io import read_json, read_toml, write_bytes_atomic

CLAIMS_FILE = DATA / "claims.toml"
ROOT = data_root()   # the checkout's root, or an installed package's data: training/keepers/<specimen>
BATTERY = "battery"
ALPHA = 0.05
VERDICTS = ("reproduced", "not reproduced", "not comparable")


def load_claims(path: str | Path = CLAIMS_FILE) -> list[dict]:
    """The claims of the data file, each checked for the keys every claim needs."""
    data = read_toml(path, "claims file")
    claims = data.get("claims", [])
    if not isinstance(claims, list) or not all(isinstance(c, dict) for c in claims):
        raise WorkbenchError(f"{path}: 'claims' must be an array of tables ([[claims]])")
    for c in claims:
        missing = [k for k in ("id", "paper", "section", "claim", "paper_value", "measure", "specimen", "test",
                               "rule", "setting", "like_for_like") if k not in c]
        if missing:
            raise WorkbenchError(f"{path}: claim '{c.get('id', '?')}' lacks '{missing[0]}'")
        if c["measure"] not in MEASURES or c["test"] not in TESTS:
            raise WorkbenchError(f"{path}: claim '{c['id']}' names an unknown measure or test")
    return claims


# ----------------------------------------------------------------------------- measures
class Missing(Exception):
    """A specimen or one of its result files is not there: the claim is not comparable (yet)."""


def _gate(ours: dict, reason: str) -> None:
    """Marks a measured claim not comparable: the setting cannot answer it (`reason` says why)."""
    ours.setdefault("gates", []).append(reason)


def _results(specimen: Path, results: str = BATTERY) -> Path:
    folder = specimen / results
    if not (folder / "summary.json").is_file() and not (folder / "final.json").is_file():
        raise Missing(f"{specimen.relative_to(ROOT) if specimen.is_relative_to(ROOT) else specimen} has no "
                      f"{results}/summary.json (a battery) or {results}/final.json (scripts/final_answers.py)")
    return folder


def _table(specimen: Path, name: str, results: str = BATTERY) -> pd.DataFrame:
    path = _results(specimen, results) / f"{name}.parquet"
    if not path.is_file():
        raise Missing(f"no {results}/{name}.parquet")
    return read_table(path)


def _summary(specimen: Path, results: str = BATTERY) -> dict:
    return read_json(_results(specimen, results) / "summary.json", "summary")


def diagonal(specimen: Path, claim: dict) -> dict:
    """Final-loop correct / rows at each depth (depth-matrix rows with loop = depth)."""
    f = _table(specimen, "depth_matrix")
    f = f[(f["loop"] == f["depth"]) & f["depth"].isin(claim["depths"])]
    counts = [[int(g["correct"].sum()), len(g)] for _, g in f.groupby("depth")]
    return {"counts": counts, "text": ", ".join(f"{k}/{n}" for k, n in counts) + f" at depths "
            f"{claim['depths'][0]}-{claim['depths'][-1]}", "rows": sum(n for _, n in counts)}


def intermediate(specimen: Path, claim: dict) -> dict:
    """Active intermediate labels (loop t < depth d) correct / cells, over the claim's depths."""
    f = _table(specimen, "depth_matrix")
    f = f[(f["loop"] < f["depth"]) & f["depth"].isin(claim["depths"])]
    k, n = int(f["correct"].sum()), len(f)
    return {"counts": [[k, n]], "text": f"{k}/{n} ({k / n:.1%})", "rows": int(f["row_id"].nunique())}


def _overshoot(specimen: Path, claim: dict, inside: bool) -> dict:
    """Iterate / park counts on the extra loops where the two differ; the cells where the chain's cycle returns
    to x_d (iterate symbol = park symbol, so the read cannot tell iterating from parking) are counted apart."""
    f = _table(specimen, "overshoot")
    support = _summary(specimen)["checkpoint"]["support"]
    f = f[f["depth"].isin(claim["depths"])]
    f = f[f["loop"] <= support] if inside else f[f["loop"] > support]
    if f.empty:
        raise Missing(f"no overshoot loops {'inside' if inside else 'beyond'} the support of {support}")
    same = f["iterate_symbol"] == f["park_symbol"]
    d = f[~same]
    it, park, n = int((d["cls"] == "iterate").sum()), int((d["cls"] == "park").sum()), len(d)
    loops = f"loops {int(f['loop'].min())}-{int(f['loop'].max())}"
    out = {"counts": [[it, n]], "park": [park, n], "coincident": int(same.sum()), "cells": len(f),
           "rows": int(f["row_id"].nunique()), "max_loop": int(f["loop"].max()), "support": support,
           "text": f"{it}/{n} iterate ({it / n:.1%}), {park}/{n} park on the cells where the two differ; "
                   f"{int(same.sum())} of {len(f)} cells coincide (the chain's cycle returns to x_d) and are "
                   f"counted apart; {loops}, support {support}"}
    if claim.get("within_support") and out["max_loop"] > support:
        _gate(out, f"the loops read ({loops}) lie past this specimen's trained support of {support}, while the "
                   f"paper's loops lay inside its own support")
    return out


def overshoot_inside(specimen: Path, claim: dict) -> dict:
    """Extra loops t in (d, support]: iterate / park counts."""
    return _overshoot(specimen, claim, inside=True)


def overshoot_beyond(specimen: Path, claim: dict) -> dict:
    """Extra loops t > support: iterate / park counts."""
    return _overshoot(specimen, claim, inside=False)


def frontier_ratio(specimen: Path, claim: dict) -> dict:
    """Frontier / support at the bars 0.60, 0.71, 0.80 (from the depth-matrix summary)."""
    s = _summary(specimen, claim.get("results", BATTERY))
    support = s["checkpoint"]["support"]
    frontier = s["probes"]["depth_matrix"]["frontier"]
    ratios = {bar: (None if frontier.get(bar) is None else frontier[bar] / support) for bar in ("0.60", "0.71", "0.80")}
    if ratios["0.71"] is None:
        raise Missing("no frontier at 0.71")
    spread = [v for v in ratios.values() if v is not None]
    censored = _censored(s["probes"]["depth_matrix"]["diagonal"], frontier)
    mark = {bar: ("+" if bar in censored else "") for bar in ratios}
    return {"ratios": ratios, "censored": censored, "range": [min(spread), max(spread)],
            "rows": s["probe_runs"]["depth_matrix"]["rows"]["n"],
            "text": f"{frontier['0.71']:.2f}{mark['0.71']} / {support} = {ratios['0.71']:.2f}{mark['0.71']} "
                    f"({ratios['0.60'] or float('nan'):.2f}{mark['0.60']} at 0.60, "
                    f"{ratios['0.80'] or float('nan'):.2f}{mark['0.80']} at 0.80)"
                    + ("; + censored: the deepest row depth is still above the bar, so the frontier is at least this"
                       if censored else "")}


def _censored(diagonal: dict, frontier: dict) -> list[str]:
    """The bars whose frontier is the deepest depth read while that depth is still at or above the bar: the rows
    end before the accuracy falls, so the frontier (and frontier / support) is only a lower bound there."""
    last = max(diagonal, key=int)
    return [bar for bar, f in frontier.items()
            if f is not None and float(f) == float(last) and diagonal[last] >= float(bar)]


def guardrail(specimen: Path, claim: dict) -> dict:
    """Base vs specimen on the arithmetic guardrail at loop 1, row-paired (identity probe's table)."""
    f = _table(specimen, "identity__guardrail", claim.get("results", BATTERY))
    c = paired_counts(f["base_correct"], f["checkpoint_correct"])
    base, ours, n = c.a_correct, c.b_correct, c.n
    return {"counts": [[base, n], [ours, n]], "drop": 100.0 * (base - ours) / n, "helped": c.helped, "hurt": c.hurt,
            "p": c.p_mcnemar, "rows": n,
            "text": f"base {base}/{n} -> {ours}/{n} ({c.helped} helped, {c.hurt} hurt, McNemar p = {c.p_mcnemar:.3g})"}


def _identity(specimen: Path, variant: str) -> dict:
    f = _table(specimen, "identity")
    g = f[f["variant"] == variant]
    if g.empty:
        raise Missing(f"no identity rows of variant '{variant}'")
    worst = float(g["max_abs_diff"].max())
    return {"value": worst, "rows": len(g), "text": f"max |Δlogit| = {worst:g} over {len(g)} configuration(s)"}


def identity_fresh(specimen: Path, claim: dict) -> dict:
    return _identity(specimen, "fresh")


def identity_adapter_off(specimen: Path, claim: dict) -> dict:
    return _identity(specimen, "adapter_off_vs_base")


def _arms(specimen: Path, claim: dict) -> dict:
    """The paired comparison of `specimen` (A) against `claim["against"]` (B), from their `results` folders."""
    other = claim.get("_root", ROOT) / claim["against"]
    results = claim.get("results", "arms")
    for s in (specimen, other):
        _results(s, results)
    return compare_arms(load_arm(specimen, specimen / results), load_arm(other, other / results))


def arms_depths(specimen: Path, claim: dict) -> dict:
    """A vs B final-answer counts at the claim's depths, row-paired (exact McNemar) and unpaired (Fisher)."""
    out = _arms(specimen, claim)
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


def arms_beyond(specimen: Path, claim: dict) -> dict:
    """A vs B pooled beyond the trained support (paired), the crossover depth and each arm's frontier at 0.71 with
    its 0.60-0.80 sensitivity. `b_horizon_bar`: B must fall below that accuracy at some depth beyond the support,
    else the rows never reach B's horizon and the claim about what lies past it is not comparable."""
    out = _arms(specimen, claim)
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


def arms_overall(specimen: Path, claim: dict) -> dict:
    """A vs B pooled over every depth read (paired), with the per-depth counts."""
    out = _arms(specimen, claim)
    p = out["pooled"]["all"]
    a, b = out["arms"]
    per = "; ".join(f"d{r.depth} {r.a_correct} vs {r.b_correct}" for r in out["depths"].itertuples())
    return {"compared": p, "depths": out["depths"].to_dict("records"), "rows": p["n"],
            "text": f"all depths {a} {p['a_correct']}/{p['n']} vs {b} {p['b_correct']}/{p['n']} ({b} helped "
                    f"{p['b_helped']}, hurt {p['b_hurt']}, McNemar p = {p['p_mcnemar']:.3g}); {per} of "
                    f"{int(out['depths']['n'].iloc[0])} each"}


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
    return {"depths": per, "rows": len(depths), "cpu": cpu,
            "text": f"median ms per row, {a.name} vs {b.name}: "
                    + "; ".join(f"d{r['depth']} {1e3 * r['a_s']:.0f} vs {1e3 * r['b_s']:.0f}" for r in per)
                    + f" (batch 1, fp32, {cpu[a.name]})"}


def support_scaling(specimen: Path, claim: dict) -> dict:
    """Frontier / support at the bars 0.60 / 0.71 / 0.80 for each specimen of the family (`claim["family"]`)."""
    per = []
    for rel in [claim["specimen"], *claim["family"]]:
        spec = claim.get("_root", ROOT) / rel
        if not spec.is_dir():
            raise Missing(f"specimen {rel} is not committed")
        r = frontier_ratio(spec, claim)
        per.append((_summary(spec, claim.get("results", BATTERY))["checkpoint"]["support"], Path(rel).name, r))
    per.sort(key=lambda x: x[:2])
    at = [r["ratios"]["0.71"] for *_, r in per if "0.71" not in r["censored"]] or [r["ratios"]["0.71"] for *_, r in per]
    spread = [[v for v in r["ratios"].values() if v is not None] for *_, r in per]
    repeated = {s for s, *_ in per if sum(x[0] == s for x in per) > 1}   # several seeds: name each run
    label = {name: f"support {s}" + (f" ({name})" if s in repeated else "") for s, name, _ in per}
    judged = claim.get("judged_supports")
    out = {"per_support": [{"support": s, "run": name, "label": label[name], **r["ratios"], "censored": r["censored"],
                            "judged": judged is None or s in judged} for s, name, r in per],
           "range": [min(at), max(at)], "rows": sum(r["rows"] for *_, r in per),
           "text": "; ".join(f"{label[name]}: {r['ratios']['0.71']:.2f}{'+' if '0.71' in r['censored'] else ''} "
                             f"(0.60-0.80: {min(v):.2f}-{max(v):.2f}{'+' if r['censored'] else ''})"
                             + ("" if judged is None or s in judged else " (not judged)")
                             for (s, name, r), v in zip(per, spread))
           + ("; + censored: the deepest depth read is still above the bar, a lower bound"
              if any(r["censored"] for *_, r in per) else "")}
    if judged is not None:
        read = [x for x in out["per_support"] if x["judged"] and "0.71" not in x["censored"]]
        if len(read) < 2:
            _gate(out, f"the paper claims the ratio at supports {', '.join(str(j) for j in judged)}; of those this "
                       f"family reads {len(read)} uncensored ({', '.join(str(x['support']) for x in read) or 'none'}), "
                       "and a constant ratio needs at least two")
    return out


def _paired(c: PairedCounts) -> dict:
    """Paired counts of A and B right/wrong on the same rows, in B's view (as the arms comparisons), exact McNemar."""
    return {"n": c.n, "a_correct": c.a_correct, "b_correct": c.b_correct, "b_helped": c.helped, "b_hurt": c.hurt,
            "p_mcnemar": c.p_mcnemar}


def _halting(specimen: Path, claim: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the compute-accuracy curve, the chosen methods row by row) of a halting battery's results."""
    results = claim.get("results", "halting")
    return _table(specimen, "halting", results), _table(specimen, "halting__chosen", results)


def _pick(chosen: pd.DataFrame, method: str) -> pd.DataFrame:
    g = chosen[chosen["method"] == method].set_index("row_id")
    if g.empty:
        raise Missing(f"the halting results hold no '{method}' method")
    return g


def stage1_parks(claim: dict) -> dict | None:
    """How often the Stage 1 model under a halting head (`claim["stage1"]`) parks on the answer past d.

    From its committed overshoot table, on the cells where the iterate and park symbols differ. Returns
    {"park", "n", "share", "bar", "text"}, or None when the claim names no Stage 1 model."""
    if "stage1" not in claim:
        return None
    spec = claim.get("_root", ROOT) / claim["stage1"]
    if not spec.is_dir():
        raise Missing(f"the Stage 1 model {claim['stage1']} is not committed")
    f = _table(spec, "overshoot")
    d = f[f["iterate_symbol"] != f["park_symbol"]]
    park, n = int((d["cls"] == "park").sum()), len(d)
    bar = claim.get("park_bar", 0.5)
    return {"park": park, "n": n, "share": park / n if n else 0.0, "bar": bar,
            "text": f"the Stage 1 model ({Path(claim['stage1']).name}) parks on {park}/{n} ({park / max(n, 1):.1%}) of "
                    f"the overshoot cells where iterate and park differ"}


def _stage1_gate(ours: dict, claim: dict) -> dict:
    """RecurTrace's head detects that the answer has settled; on a Stage 1 model that keeps iterating past d
    a fixed depth k is right only on depth-k rows and a head must count to the stated depth instead."""
    parks = stage1_parks(claim)
    if parks is not None:
        ours["stage1"] = parks
        if parks["share"] < parks["bar"]:
            _gate(ours, f"{parks['text']} (bar {parks['bar']:.2f}): it iterates the rule past a row's depth instead of "
                        "holding the answer, so a fixed depth k is right only on depth-k rows (where the fixed-depth "
                        "curve peaks is set by the manifest's depth mix) and a halting head must count to the depth "
                        "stated in the prompt rather than detect a settled answer, which is what RecurTrace's head does")
    return ours


def halting_fixed_peak(specimen: Path, claim: dict) -> dict:
    """Accuracy of every fixed depth on the reported rows, and the best fixed depth (chosen on calibration rows)."""
    curve, chosen = _halting(specimen, claim)
    fixed = curve[curve["method"] == "fixed_k"].sort_values("mean_loops")
    best = int(fixed[fixed["chosen"]]["mean_loops"].iloc[0])
    by_k = {int(r.mean_loops): float(r.accuracy) for r in fixed.itertuples()}
    n = int(fixed["n"].iloc[0])
    return _stage1_gate({"best": best, "by_k": by_k, "rows": n,
                         "text": f"fixed depth k = 1..{max(by_k)}: " + ", ".join(f"{v:.2f}" for v in by_k.values())
                                 + f" ({n} reported rows); best k on the calibration rows: {best} ({by_k[best]:.3f})"},
                        claim)


def constant_envelope(acc_by_k: dict[int, float], loops: float) -> tuple[float, str]:
    """The best accuracy a constant-depth policy reaches with at most `loops` mean loops, and which policy.

    A constant policy stops every row at one loop k; mixing two of them (a share of rows at k1, the rest at k2)
    reaches any mean in between, so the bar at a head's mean loops m is the upper envelope of the fixed-depth
    curve at m: the best of every k <= m and of every mix k1 <= m <= k2 with mean exactly m.
    """
    ks = sorted(acc_by_k)
    best, label = -math.inf, "none"
    for k in ks:
        if k <= loops + 1e-12 and acc_by_k[k] > best:
            best, label = acc_by_k[k], f"k = {k}"
    for k1 in ks:
        for k2 in ks:
            if k1 < loops < k2:
                w = (loops - k1) / (k2 - k1)
                v = (1 - w) * acc_by_k[k1] + w * acc_by_k[k2]
                if v > best + 1e-12:
                    best, label = v, f"k = {k1} / {k2} mixed {1 - w:.0%} / {w:.0%}"
    return best, label


def _spearman(loops: pd.Series, depths: pd.Series) -> float | None:
    """Spearman's rank correlation of the stopping loop with the row's depth (None when either is constant)."""
    if loops.nunique() < 2 or depths.nunique() < 2:
        return None
    return float(sps.spearmanr(loops.to_numpy(), depths.to_numpy()).statistic)


def _depth_tracking(g: pd.DataFrame) -> dict:
    rho = _spearman(g["loops"], g["depth"])
    at_d = float((g["loops"] == g["depth"]).mean())
    modal = g["loops"].value_counts()
    return {"spearman": rho, "at_depth": at_d, "modal_loop": int(modal.index[0]),
            "modal_share": float(modal.iloc[0] / len(g)),
            "text": f"Spearman(stopping loop, depth) = {'undefined (one stopping loop)' if rho is None else f'{rho:.2f}'}"
                    f", {at_d:.0%} of rows stop exactly at d"}


def halting_head_vs_fixed(specimen: Path, claim: dict) -> dict:
    """The distilled head at its chosen threshold against the best fixed depth, paired on the reported rows.

    Beside the paired counts: the paired difference head − fixed with Newcombe's 95% interval, the best
    constant-depth policy at the head's own mean loops (`constant_envelope`) and the rank correlation of the
    head's stopping loop with the row's depth."""
    curve, chosen = _halting(specimen, claim)
    head, fixed = _pick(chosen, claim.get("method", "head")), _pick(chosen, "fixed_k")
    fixed = fixed.loc[head.index]
    a, b = head["correct"].astype(bool), fixed["correct"].astype(bool)
    k, loops = int(fixed["loops"].iloc[0]), float(head["loops"].mean())
    c = paired_counts(a, b)
    p, helped, hurt = _paired(c), c.helped, c.hurt
    diff = paired_difference(hurt, helped, c.both, c.neither)
    by_k = {int(r.mean_loops): float(r.accuracy) for r in curve[curve["method"] == "fixed_k"].itertuples()}
    envelope, policy = constant_envelope(by_k, loops)
    track = _depth_tracking(head)
    ceiling = ""
    if (chosen["method"] == "oracle").any():      # the first right loop: what a perfect head would reach
        o = _pick(chosen, "oracle").loc[head.index]
        ceiling = f"; the oracle {int(o['correct'].sum())}/{len(o)} at {float(o['loops'].mean()):.2f} loops"
    out = {"compared": p, "head_loops": loops, "best_k": k, "tau": float(head["threshold"].iloc[0]), "rows": len(a),
           "head_acc": float(a.mean()), "diff": diff, "envelope": envelope, "envelope_policy": policy,
           "tracking": track,
           "text": f"head (tau = {head['threshold'].iloc[0]:g}) {p['a_correct']}/{p['n']} at {loops:.2f} loops vs "
                   f"fixed k = {k} {p['b_correct']}/{p['n']} (head alone right on {hurt}, fixed alone on {helped}); "
                   f"head − fixed {100 * diff[0]:+.1f} points [{100 * diff[1]:+.1f}, {100 * diff[2]:+.1f}]; best "
                   f"constant-depth policy at {loops:.2f} loops ({policy}) {envelope:.3f} vs the head's {a.mean():.3f}; "
                   f"{track['text']}" + ceiling}
    return _stage1_gate(out, claim)


def halting_collapse(specimen: Path, claim: dict) -> dict:
    """Each indirect head (`claim["methods"]`) at its chosen threshold: mean loops, the share stopping at loop 1, and
    the modal stopping loop with its share (a collapse to one global depth that is not loop 1 shows there)."""
    _, chosen = _halting(specimen, claim)
    per = {}
    for m in claim["methods"]:
        g = _pick(chosen, m)
        modal = g["loops"].value_counts()
        per[m] = {"mean_loops": float(g["loops"].mean()), "at_one": float((g["loops"] == 1).mean()),
                  "modal_loop": int(modal.index[0]), "modal_share": float(modal.iloc[0] / len(g)),
                  "accuracy": float(g["correct"].mean()), "threshold": float(g["threshold"].iloc[0]), "n": len(g)}
    return _stage1_gate({"methods": per, "rows": max(v["n"] for v in per.values()),
                         "text": "; ".join(f"{m} (threshold {v['threshold']:g}) {v['mean_loops']:.2f} loops, "
                                           f"{v['at_one']:.0%} of rows at loop 1, {round(v['modal_share'] * v['n'])}/"
                                           f"{v['n']} at its modal loop {v['modal_loop']}, accuracy {v['accuracy']:.3f}"
                                           for m, v in per.items())}, claim)


def halting_depth_choice(specimen: Path, claim: dict) -> dict:
    """Whether learned heads choose a per-row depth (retrofit paper Sec. 12): for each head (`claim["methods"]`) at
    its chosen threshold, Spearman of its stopping loop with the row's depth, the share stopping exactly at d and
    the modal stopping loop's share."""
    _, chosen = _halting(specimen, claim)
    per = {m: _depth_tracking(_pick(chosen, m)) for m in claim["methods"]}
    return {"methods": per, "rows": len(_pick(chosen, claim["methods"][0])),
            "text": "; ".join(f"{m}: {v['text']}, {v['modal_share']:.0%} at loop {v['modal_loop']}"
                              for m, v in per.items())}


def early_exit_saving(specimen: Path, claim: dict) -> dict:
    """The head run through real early exit (`halting__adaptive`: rows leave the batch) against the fixed budget, in
    the same run: row-loops and wall-clock seconds, and each as a ratio to the fixed budget's."""
    f = _table(specimen, "halting__adaptive", claim.get("results", "halting")).set_index("policy")
    fixed = f"fixed_{int(f.loc['head', 'budget'])}" if "head" in f.index else None
    if fixed not in f.index:
        raise Missing("halting__adaptive holds no head and fixed-budget rows")
    h, x = f.loc["head"], f.loc[fixed]
    loops, wall = h["row_loops"] / x["row_loops"], h["wall_s"] / x["wall_s"]
    return {"loop_ratio": float(loops), "wall_ratio": float(wall), "agree": float(h["agree"]), "rows": int(h["rows"]),
            "text": f"head (tau = {h['tau']:g}) {int(h['row_loops'])} row-loops in {h['wall_s']:.1f} s vs {fixed} "
                    f"{int(x['row_loops'])} in {x['wall_s']:.1f} s: {loops:.2f}x the loops, {wall:.2f}x the wall-clock "
                    f"({h['agree']:.0%} of rows stop where the one-pass reading says; one timing, shared CPU)"}


def _last_set(row: dict) -> str:
    """The asked register after the last unconditional `set q to v` rule, else its start value (no model)."""
    q = row["query"]
    value = dict(zip(row["registers"], row["start"].split()))[q]
    for step in row["steps"]:
        m = re.fullmatch(rf"set {re.escape(q)} to (\S+)", step)
        if m:
            value = m.group(1)
    return value


def _start_value(row: dict) -> str:
    """The asked register's start value (no model)."""
    return dict(zip(row["registers"], row["start"].split()))[row["query"]]


# The rules with no model a stateful claim is gated on, per task: a model that does not beat the best of them
# is not shown to track state.
NO_MODEL_RULES = {"state_query": {"the last `set q to v`, else the start value": _last_set,
                                  "the start value": _start_value}}


def _manifest_rows(specimen: Path, results: str, root: Path) -> dict[str, dict]:
    manifests = _summary(specimen, results).get("manifests", {})
    for rel in manifests:
        path = root / rel
        if path.is_file():
            return {r["row_id"]: r for r in map(json.loads, path.read_text().splitlines()) if r}
    raise Missing(f"none of the manifests {sorted(manifests)} read by {specimen.name}/{results} is committed")


def no_model_rule(rows: list[dict], task: str) -> tuple[str, pd.Series]:
    """The best rule with no model for `task` on `rows`: (its name, whether it is right on each row, by row id)."""
    if task not in NO_MODEL_RULES:
        raise WorkbenchError(f"no rule without a model is declared for task '{task}' (known: {sorted(NO_MODEL_RULES)})")
    scored = {name: pd.Series({r["row_id"]: rule(r) == r["answer"] for r in rows}) for name, rule
              in NO_MODEL_RULES[task].items()}
    name = max(scored, key=lambda k: (int(scored[k].sum()), k))
    return name, scored[name]


def memory_vs_plain(specimen: Path, claim: dict) -> dict:
    """Memory (the specimen) against plain looping (`against`), row-paired at loops = depth over the claim's depths.

    Both read by `workbench probe --only loop_accuracy` into `results`. Gated per depth: each arm's accuracy at
    loops = depth must reach `installed_bar` at *every* depth of `installed_depths` (default: the compared depths;
    the trained depths when the comparison is on extrapolation depths, as the paper's), not pooled over them, so a
    depth-1 ceiling cannot hide a depth that did not install. `no_model_rule = "<task>"`: the memory arm must also
    beat the best rule with no model on the compared rows (exact McNemar, p < 0.05), else it is not shown to track
    state."""
    results = claim.get("results", "loops")
    root = claim.get("_root", ROOT)
    other = root / claim["against"]
    frames = [_table(s, "loop_accuracy", results) for s in (specimen, other)]
    installed = claim.get("installed_depths", claim["depths"])
    bar = claim.get("installed_bar", 0.0)
    failed = []
    for name, f in zip(("memory", "plain"), frames):
        at = f[(f["loop"] == f["depth"]) & f["depth"].isin(installed)].groupby("depth")["correct"]
        for d, g in at:
            if g.mean() < bar:
                failed.append(f"{name} d{int(d)} {int(g.sum())}/{len(g)} = {g.mean():.2f}")
        if at.ngroups == 0:
            failed.append(f"{name}: no rows at depths {ranges(installed)}")
    mem, plain = (f[(f["loop"] == f["depth"]) & f["depth"].isin(claim["depths"])].set_index("row_id")
                  for f in frames)
    plain = plain.loc[mem.index]
    a, b = mem["correct"].astype(bool), plain["correct"].astype(bool)
    per = {int(d): (int(a[g.index].sum()), int(b[g.index].sum()), len(g)) for d, g in mem.groupby("depth")}
    detail = ", ".join(f"d{d} {x}/{n} vs {y}/{n}" for d, (x, y, n) in per.items())
    p = _paired(paired_counts(a, b))
    out = {"compared": p, "rows": len(a),
           "text": f"loops = depth, memory {p['a_correct']}/{p['n']} vs plain {p['b_correct']}/{p['n']} ({detail})"}
    if failed:
        _gate(out, f"an arm has not installed every trained depth: {', '.join(failed)} (bar {bar:g} at each of "
                   f"depths {ranges(installed)}, per depth, not pooled)")
    if claim.get("no_model_rule"):
        rows = _manifest_rows(specimen, results, root)
        name, right = no_model_rule([rows[i] for i in mem.index], claim["no_model_rule"])
        vs = _paired(paired_counts(right.loc[mem.index], a))          # B = memory: helped = rows only memory gets right
        out["no_model"] = {"rule": name, "correct": int(right.sum()), "n": len(right), "vs_memory": vs}
        out["text"] += f"; the best rule with no model ({name}) {int(right.sum())}/{len(right)}"
        if not (vs["b_helped"] > vs["b_hurt"] and vs["p_mcnemar"] < ALPHA):
            _gate(out, f"the memory arm does not beat the best rule with no model ({name}: {int(right.sum())}/"
                       f"{len(right)} vs memory {int(a.sum())}/{len(a)}, exact McNemar p = {vs['p_mcnemar']:.3g}), so "
                       "neither arm is shown to track state")
    return out


def splice_sites(specimen: Path, claim: dict) -> dict:
    """The counterfactual splice's shares per (site, span) at each k0 (`splice__verdict`): source orbit (B's chain
    carried on) and lawful (A's rule applied to B's symbol) over the classified later loops, pairs where the
    classes coincide skipped by the probe."""
    f = _table(specimen, "splice__verdict")
    per = {f"{r.site}/{r.span}/k0={int(r.k0)}": {"source_orbit": float(r.source_orbit), "lawful": float(r.lawful),
                                                   "shortcut": float(r.shortcut), "verdict": r.verdict, "n": int(r.n)}
           for r in f.itertuples()}
    want = claim["cells"]           # {"state/all": "source_orbit", "state/read": "lawful", ...}
    read = {k: v for k, v in per.items() if k.rsplit("/", 1)[0] in want}
    if not read:
        raise Missing(f"the splice results hold none of {sorted(want)}")
    return {"per": read, "want": want, "rows": max(v["n"] for v in read.values()),
            "text": "; ".join(f"{k}: source orbit {v['source_orbit']:.2f}, lawful {v['lawful']:.2f}, shortcut "
                              f"{v['shortcut']:.2f} ({v['verdict']}, {v['n']} pairs)" for k, v in read.items())}


def patching_steps(specimen: Path, claim: dict) -> dict:
    """The patching grid's read-position state per edited step (`patching__steps`): for an edit to the entry loop k
    reads, the recovered share of the answer's margin when the clean read-position state after loop t is patched
    in, at t = k - 1 and t = k, with its row-bootstrap interval."""
    f = _table(specimen, "patching__steps", claim.get("results", BATTERY))
    per = {}
    for k, g in f.groupby("step"):
        at = g.set_index("loop")
        per[int(k)] = {"at": _share(at, int(k)), "before": _share(at, int(k) - 1) if int(k) > 1 else None}
    if not per:
        raise Missing("the patching results hold no entry edit")
    return {"per": per, "rows": int(f["n"].max()),
            "text": "; ".join(f"step {k}: loop {k} {v['at']['value']:.2f} [{v['at']['low']:.2f}, {v['at']['high']:.2f}]"
                              + (f", loop {k - 1} {v['before']['value']:.2f} [{v['before']['low']:.2f}, "
                                 f"{v['before']['high']:.2f}]" if v["before"] else "") + f" ({v['at']['n']} pairs)"
                              for k, v in sorted(per.items()))}


def _share(by_loop: pd.DataFrame, t: int) -> dict:
    r = by_loop.loc[t]
    return {"value": float(r["recovered"]), "low": float(r["low"]), "high": float(r["high"]), "n": int(r["n"])}


def retrieval_heads(specimen: Path, claim: dict) -> dict:
    """Retrieval-head specialisation by loop (`heads__summary`): per loop, the top-2 concentration against its null
    p95 (random rotations), the retrieval heads and the top head, and whether the top head changes with the loop."""
    f = _table(specimen, "heads__summary")
    per = {}
    for loop, g in f.groupby("loop"):
        top = g.sort_values("share", ascending=False).iloc[0]
        per[int(loop)] = {"concentration": float(g["concentration"].iloc[0]), "null_p95": float(g["null_p95"].iloc[0]),
                          "retrieval_heads": int(g["is_retrieval"].sum()),
                          "top": f"L{int(top['layer'])}H{int(top['head'])}"}
    tops = {v["top"] for v in per.values()}
    return {"per": per, "rows": len(per), "top_heads": sorted(tops),
            "text": "; ".join(f"loop {t}: concentration {v['concentration']:.4f} vs null p95 {v['null_p95']:.4f}, "
                              f"{v['retrieval_heads']} retrieval heads, top {v['top']}" for t, v in per.items())
            + f"; top head by loop: {len(tops)} distinct ({', '.join(sorted(tops))})"}


def drift_null(specimen: Path, claim: dict) -> dict:
    """Subspace drift's concentration test (`drift__concentration`): per loop, the top-3 heads' share of the residual
    outside loop 1's PCA envelope against its null p95 (random partitions)."""
    f = _table(specimen, "drift__concentration")
    per = {int(r.loop): {"share": float(r.top3_share), "null_p95": float(r.null_p95),
                         "residual": float(r.residual_frac)} for r in f.itertuples()}
    return {"per": per, "rows": len(per), "above": [t for t, v in per.items() if v["share"] > v["null_p95"]],
            "text": "; ".join(f"loop {t}: top-3 share {v['share']:.3f} vs null p95 {v['null_p95']:.3f}"
                              for t, v in per.items())}


def finite_difference(specimen: Path, claim: dict) -> dict:
    """The gradient audit's finite-difference check (`gradient_audit__fd`): autograd's directional derivative
    against central differences, and the relative error, worst over the directions read."""
    f = _table(specimen, "gradient_audit__fd")
    worst = f.sort_values("rel_error", ascending=False).iloc[0]
    return {"value": float(worst["rel_error"]), "rows": len(f),
            "text": f"autograd {worst['autograd']:.4g} vs finite differences {worst['finite_difference']:.4g} along a "
                    f"{worst['direction']} direction: relative error {worst['rel_error']:.2g} (worst of {len(f)})"}


def _installed(run: Path) -> tuple[bool, str]:
    """Whether a committed run installed its task: its last held-out evaluation (metrics.jsonl), the worst cell at
    loops = depth over the depths its stages trained (recipe.toml), against 0.71."""
    evals = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if '"eval"' in x]
    evals = [e for e in evals if e.get("kind") == "eval"]
    if not evals:
        raise Missing(f"{run.name} logged no held-out evaluation")
    trained = {d for s in read_toml(run / "recipe.toml", "recipe").get("stages", []) for d in s.get("depths", [])}
    acc = evals[-1]["acc"]
    diag = {int(d): float(v[d]) for d, v in acc.items() if d in v and (not trained or int(d) in trained)}
    if not diag:
        raise Missing(f"{run.name}'s last evaluation reads none of its trained depths {sorted(trained)}")
    worst = min(diag, key=diag.get)
    return diag[worst] >= 0.71, f"worst loops = depth cell {diag[worst]:.2f} at depth {worst} (step {evals[-1]['step']})"


# The keys a committed recipe.toml may lack: the trainer records its resolved recipe, every key it knew, so a key is
# absent only from a run recorded before the key existed. Each stands at the default the training recipe
# (`workbench.train.recipe`) fills in for it, the setting such a run trained with; tests/test_claims.py holds every
# committed recipe.toml, filled so, to the training recipe's own reading of it.
RECORDED_LATER = {
    "init_from": "",
    "model": {"loop_codes": False},
    "train": {"precision": "fp32", "compile": False},
    "guardrail": {"enabled": True, "max_drop": 3.0, "every": 0},
    "preserve": {"kl_weight": 0.0, "rows": 8, "positions": 8, "sources": ["corpus", "patterns", "numbers"]},
    "optim": {"loop_codes_lr_mult": 10.0},
    "halting": {"sweep": 0},
}


def recorded_recipe(run: Path) -> dict:
    """A run's recipe.toml as data, with the keys recorded only by later runs (`RECORDED_LATER`) filled in."""
    def filled(recorded: dict, later: dict) -> dict:
        out = dict(recorded)
        for key, value in later.items():
            out[key] = filled(out.get(key, {}), value) if isinstance(value, dict) else out.get(key, value)
        return out

    return filled(read_toml(run / "recipe.toml", "recipe"), RECORDED_LATER)


def _training_recipe(run: Path) -> dict:
    """A run's recorded recipe without what names the run or places the block (name, seed, model.block): two runs
    with equal recipes here trained the same way at different windows (an int and a float of one value are equal)."""
    recipe = recorded_recipe(run)
    for key in ("name", "seed"):
        recipe.pop(key, None)
    recipe["model"].pop("block", None)
    return recipe


def block_recommendation(specimen: Path, claim: dict) -> dict:
    """`select-block`'s recommended window (block_selection.json under `results`) against the windows that were trained
    (`claim["trained"]`, run directories): each run's block, whether it installed (`_installed`), and the layers it
    shares with the recommendation."""
    path = specimen / claim.get("results", "selection") / "block_selection.json"
    if not path.is_file():
        raise Missing(f"no {path.relative_to(specimen.parent)} (workbench select-block --out ...)")
    sel = read_json(path, "block selection")
    lo, hi = sel["recommended"]
    runs = []
    for rel in claim["trained"]:
        run = claim.get("_root", ROOT) / rel
        if not run.is_dir():
            raise Missing(f"trained run {rel} is not committed")
        a, b = read_json(run / "retrofit.json", "retrofit record")["settings"]["block"]
        ok, how = _installed(run)
        runs.append({"run": Path(rel).name, "block": f"{a}:{b}", "installed": ok, "shared": max(0, min(b, hi) - max(a, lo)),
                     "recipe": read_toml(run / "recipe.toml", "recipe").get("name"), "how": how})
    ours = {"recommended": f"{lo}:{hi}", "runs": runs, "rows": len(runs),
            "text": f"recommended {lo}:{hi} ({sel['window']} layers, span {sel['prelude_end']}-{sel['coda_start']}); "
                    + "; ".join(f"{r['block']} ({r['run']}): {'installed' if r['installed'] else 'not installed'}, "
                                f"{r['how']}, {r['shared']} layers shared" for r in runs)}
    # The rule tells a recommendation from any other only where one recipe installed one window and failed another:
    # with every trained window installed (or none), any recommendation would pass (or fail) it.
    recipes = {r["run"]: _training_recipe(claim.get("_root", ROOT) / rel) for r, rel in zip(runs, claim["trained"])}
    split = any(recipes[a["run"]] == recipes[b["run"]] for a in runs if a["installed"] for b in runs
                if not b["installed"])
    if not split:
        _gate(ours, "no recipe both installed one trained window and failed another, so the rule cannot tell this "
                    "recommendation from any other")
    return ours


def _inside(window: str, lo: int, hi: int) -> bool:
    a, b = (int(x) for x in window.split(":"))
    return lo <= a and b <= hi


def stage2_ablation(specimen: Path, claim: dict) -> dict:
    """`select-block --stage2 train`'s sweep (stage2.json and block_selection.json under `results`): the trained
    ranking, the recommendation's margin over the runner-up, and each window outside the angular span against it."""
    folder = specimen / claim.get("results", ".")
    path = folder / "stage2.json"
    if not path.is_file():
        raise Missing(f"no {path.relative_to(specimen.parent)} (workbench select-block --stage2 train --out ...)")
    record = read_json(path, "Stage 2 sweep")
    sel = read_json(folder / "block_selection.json", "block selection")
    lo, hi = sel["prelude_end"], sel["coda_start"]
    table = record["table"]
    outside = [{"window": r["window"], "role": r["role"], "vs": r.get("vs_recommended")}
               for r in table if not _inside(r["window"], lo, hi)]
    m = record.get("margin") or {}
    diff = m.get("ce_difference") or {}
    return {"recommended": record.get("recommended"), "span": f"{lo}:{hi}",
            "recommended_in_span": record.get("recommended") is not None and _inside(record["recommended"], lo, hi),
            "separated": bool(m.get("separated")), "margin_why": m.get("why", ""), "outside": outside,
            "rows": sum(r.get("heldout_ce", {}).get("rows", 0) for r in table[:1]),
            "text": f"{record['budget']}; " + ", ".join(
                f"{r['rank']}. {r['window']} ({r['role']}) CE {r['heldout_ce']['value']:.3f}"
                for r in table if r.get("heldout_ce")) + (
                f"; margin over the runner-up {diff['value']:+.3f} nats [{diff['low']:+.3f}, {diff['high']:+.3f}]"
                if diff else "")}


def verbal_zero_shot(specimen: Path, claim: dict) -> dict:
    """Final-answer accuracy on the verbal surfaces read without verbal training: the depth matrices of the
    specimen's `results` folders (one per surface, `claim["surfaces"]`), pooled over depths."""
    per = {}
    for surface, results in claim["surfaces"].items():
        f = _table(specimen, "depth_matrix", results)
        f = f[f["loop"] == f["depth"]]
        per[surface] = (int(f["correct"].sum()), len(f))
    return {"counts": list(per.values()), "rows": sum(n for _, n in per.values()),
            "text": "; ".join(f"{s} {k}/{n} ({k / n:.1%})" for s, (k, n) in per.items())}


MEASURES = {f.__name__: f for f in (diagonal, intermediate, overshoot_inside, overshoot_beyond, frontier_ratio,
                                    guardrail, identity_fresh, identity_adapter_off, arms_depths, arms_beyond,
                                    arms_overall, arms_latency, support_scaling, halting_fixed_peak,
                                    halting_head_vs_fixed, halting_collapse, halting_depth_choice,
                                    early_exit_saving, memory_vs_plain, splice_sites, retrieval_heads, drift_null,
                                    finite_difference, block_recommendation, verbal_zero_shot, stage2_ablation,
                                    patching_steps)}


# ----------------------------------------------------------------------------- tests
def counts_not_worse(claim: dict, ours: dict) -> tuple[str, str]:
    """Per count pair: one-sided Fisher that ours is below the paper's; reproduced when none is at p < 0.05."""
    pairs = list(zip(claim["paper_counts"], ours["counts"]))
    ps = [fisher(k, n, pk, pn, alternative="less") for (pk, pn), (k, n) in pairs]
    worst = min(range(len(ps)), key=ps.__getitem__)
    (pk, pn), (k, n) = pairs[worst]
    how = f"one-sided Fisher, ours below the paper: smallest p = {ps[worst]:.3g} ({k}/{n} vs {pk}/{pn})"
    return ("reproduced" if ps[worst] >= ALPHA else "not reproduced"), how


def iterate_not_worse(claim: dict, ours: dict) -> tuple[str, str]:
    """Iterate share not below the paper's and park share not above it (one-sided Fisher each)."""
    (pk, pn), (k, n) = claim["paper_counts"][0], ours["counts"][0]
    p_it = fisher(k, n, pk, pn, alternative="less")
    (pp, ppn), (park, m) = claim["paper_park"], ours["park"]
    p_park = fisher(park, m, pp, ppn, alternative="greater")
    ok = p_it >= ALPHA and p_park >= ALPHA
    return ("reproduced" if ok else "not reproduced"), (f"one-sided Fisher: iterate below the paper's p = {p_it:.3g}; "
                                                         f"park above it p = {p_park:.3g}")


def drop_at_most(claim: dict, ours: dict) -> tuple[str, str]:
    drop = ours["drop"]
    return ("reproduced" if drop <= claim["max_drop"] else "not reproduced"), \
        f"drop {drop:+.2f} points (allowed {claim['max_drop']:g})"


def ratio_in_band(claim: dict, ours: dict) -> tuple[str, str]:
    lo, hi = claim["paper_band"]
    a, b = ours["range"]
    ok = a <= hi and b >= lo
    return ("reproduced" if ok else "not reproduced"), \
        f"ours spans {a:.2f}-{b:.2f} over the bars 0.60-0.80; the paper's band is {lo:.2f}-{hi:.2f}"


def exactly_zero(claim: dict, ours: dict) -> tuple[str, str]:
    return ("reproduced" if ours["value"] == 0.0 else "not reproduced"), "exact: max |Δlogit| must be 0.0"


def no_significant_difference(claim: dict, ours: dict) -> tuple[str, str]:
    """No depth where the arms differ at p < 0.05 (two-sided exact McNemar on the paired rows)."""
    worst = min(ours["depths"], key=lambda r: r["p_mcnemar"])
    ok = worst["p_mcnemar"] >= ALPHA
    return ("reproduced" if ok else "not reproduced"), \
        (f"exact McNemar per depth, smallest p = {worst['p_mcnemar']:.3g} at depth {worst['depth']} "
         f"({worst['a_correct']} vs {worst['b_correct']} of {worst['n']}; one-sided Fisher B > A "
         f"p = {worst['p_fisher_b_greater']:.3g})")


def b_leads_beyond(claim: dict, ours: dict) -> tuple[str, str]:
    """B (the full block) ahead of A beyond the support: more rows helped than hurt at p < 0.05 (exact McNemar)."""
    p = ours["beyond"]
    ok = p["b_helped"] > p["b_hurt"] and p["p_mcnemar"] < ALPHA
    return ("reproduced" if ok else "not reproduced"), \
        f"beyond the support B helped {p['b_helped']}, hurt {p['b_hurt']} (exact McNemar p = {p['p_mcnemar']:.3g})"


def _a_ahead(p: dict) -> tuple[bool, str]:
    """Whether A is ahead of B on the paired rows (B hurt more than it helped, exact McNemar p < 0.05), and the counts."""
    return (p["b_hurt"] > p["b_helped"] and p["p_mcnemar"] < ALPHA,
            f"{p['a_correct']} vs {p['b_correct']} of {p['n']}: A alone right on {p['b_hurt']}, B alone on "
            f"{p['b_helped']} (exact McNemar p = {p['p_mcnemar']:.3g})")


def a_leads(claim: dict, ours: dict) -> tuple[str, str]:
    """A (the specimen) ahead of B on the rows compared: B hurt more rows than it helped, exact McNemar p < 0.05."""
    ahead, how = _a_ahead(ours["compared"])
    return ("reproduced" if ahead else "not reproduced"), how


def a_faster_every_depth(claim: dict, ours: dict) -> tuple[str, str]:
    """A's median batch-1 latency below B's at every depth read."""
    slower = [r for r in ours["depths"] if r["a_s"] >= r["b_s"]]
    ratios = [r["b_over_a"] for r in ours["depths"]]
    how = (f"B / A latency {min(ratios):.2f}-{max(ratios):.2f} over depths "
           f"{ours['depths'][0]['depth']}-{ours['depths'][-1]['depth']}")
    if slower:
        how += f"; A not faster at depth {', '.join(str(r['depth']) for r in slower)}"
    return ("reproduced" if not slower else "not reproduced"), how


def all_ratios_in_band(claim: dict, ours: dict) -> tuple[str, str]:
    """Every support's frontier / support, over the bars 0.60-0.80, reaches the paper's band (the rule of
    `ratio_in_band`, applied at each support); the spread of the 0.71 ratios says how constant it is."""
    lo, hi = claim["paper_band"]
    bars = ("0.60", "0.71", "0.80")
    ours = {**ours, "per_support": [r for r in ours["per_support"] if r.get("judged", True)]}
    spans = {r.get("label", r["support"]): [r[b] for b in bars if r.get(b) is not None] for r in ours["per_support"]}
    # a censored bar (the rows end above it) gives only a lower bound: it reaches any band above its value
    reach = {r.get("label", r["support"]): max(v) if not r.get("censored") else math.inf
             for r, v in zip(ours["per_support"], spans.values())}
    out = [s for s, v in spans.items() if not (min(v) <= hi and reach[s] >= lo)]
    censored = [s for s, r in zip(spans, ours["per_support"]) if r.get("censored")]
    supports = sorted({r["support"] for r in ours["per_support"]})
    cens_supports = {r["support"] for r in ours["per_support"] if "0.71" in (r.get("censored") or [])}
    cens_supports -= {r["support"] for r in ours["per_support"] if "0.71" not in (r.get("censored") or [])}
    return ("reproduced" if not out else "not reproduced"), \
        (f"frontier / support at 0.71 spans {ours['range'][0]:.2f}-{ours['range'][1]:.2f} over supports "
         f"{', '.join(str(s) for s in supports if s not in cens_supports)}"
         + (f" (support {', '.join(str(s) for s in sorted(cens_supports))} censored)" if cens_supports else "")
         + f"; over the bars 0.60-0.80 each run reaches "
         f"{'; '.join(f'{s}: {min(v):.2f}-{max(v):.2f}' + ('+' if s in censored else '') for s, v in spans.items())}"
         f"; the paper's band is "
         f"{lo:.2f}-{hi:.2f}" + (f"; outside it: {', '.join(str(s) for s in out)}" if out else "")
         + (f"; censored (the rows end above the bar, so only a lower bound): {', '.join(str(s) for s in censored)}"
            if censored else ""))


def peak_at(claim: dict, ours: dict) -> tuple[str, str]:
    """The best fixed depth (chosen on calibration rows) is the paper's."""
    by_k = ours["by_k"]
    return ("reproduced" if ours["best"] == claim["paper_peak"] else "not reproduced"), \
        (f"best fixed depth {ours['best']} (paper: {claim['paper_peak']}); accuracy at k = {claim['paper_peak']} "
         f"{by_k.get(claim['paper_peak'], float('nan')):.3f}, at k = {ours['best']} {by_k[ours['best']]:.3f}")


def _beats_constant(ours: dict) -> tuple[bool, str]:
    """Whether the head is above every constant-depth policy at its own mean loops (`constant_envelope`)."""
    ok = ours["head_acc"] > ours["envelope"] + 1e-12
    return ok, (f"{'above' if ok else 'not above'} the best constant-depth policy at its {ours['head_loops']:.2f} "
                f"mean loops ({ours['envelope_policy']}: {ours['envelope']:.3f} vs {ours['head_acc']:.3f})")


def head_beats_fixed(claim: dict, ours: dict) -> tuple[str, str]:
    """The head more accurate than the best fixed depth at matched compute: A ahead at exact McNemar p < 0.05, its
    mean loops within `loops_slack` of k, and above every constant-depth policy at its own mean loops."""
    p, slack = ours["compared"], claim.get("loops_slack", 0.25)
    above, how_c = _beats_constant(ours)
    ok = _a_ahead(p)[0] and ours["head_loops"] <= ours["best_k"] + slack and above
    return ("reproduced" if ok else "not reproduced"), \
        (f"head {p['a_correct']} vs fixed k = {ours['best_k']} {p['b_correct']} of {p['n']} (head alone right on "
         f"{p['b_hurt']}, fixed alone on {p['b_helped']}, exact McNemar p = {p['p_mcnemar']:.3g}) at "
         f"{ours['head_loops']:.2f} vs {ours['best_k']} loops; {how_c}; {ours['tracking']['text']}")


def head_matches_fixed_with_fewer_loops(claim: dict, ours: dict) -> tuple[str, str]:
    """Non-inferiority: the paired difference head − best fixed depth has its 95% lower bound (Newcombe) above
    −`margin`, the head spends fewer mean loops than k, and it is above every constant-depth policy at its own mean
    loops (so stopping every row at one loop cannot pass)."""
    margin = claim["margin"]
    d, lo, hi = ours["diff"]
    above, how_c = _beats_constant(ours)
    fewer = ours["head_loops"] < ours["best_k"]
    ok = lo > -margin and fewer and above
    return ("reproduced" if ok else "not reproduced"), \
        (f"head − fixed k = {ours['best_k']}: {100 * d:+.1f} points, 95% CI [{100 * lo:+.1f}, {100 * hi:+.1f}] "
         f"(Newcombe, paired) against the margin −{100 * margin:g}: "
         f"{'non-inferior' if lo > -margin else 'not shown non-inferior'}"
         f"; mean loops {ours['head_loops']:.2f} vs {ours['best_k']} ({1 - ours['head_loops'] / ours['best_k']:.0%} fewer)"
         f"; {how_c}; {ours['tracking']['text']}")


def collapses_to_one(claim: dict, ours: dict) -> tuple[str, str]:
    """Every indirect head stops at least `share` (default 0.9) of rows at loop 1 at its chosen threshold; the modal
    stopping loop and its share are shown beside it (a collapse to another single depth is not the paper's)."""
    share = claim.get("share", 0.9)
    out = [m for m, v in ours["methods"].items() if v["at_one"] < share]
    return ("reproduced" if not out else "not reproduced"), \
        ("; ".join(f"{m}: {v['at_one']:.0%} of rows at loop 1, {v['modal_share']:.0%} at its modal loop "
                   f"{v['modal_loop']} ({v['mean_loops']:.2f} mean loops)" for m, v in ours["methods"].items())
         + f"; collapse means at least {share:.0%} at loop 1"
         + (f"; not collapsed to loop 1: {', '.join(out)}" if out else ""))


def no_per_row_depth(claim: dict, ours: dict) -> tuple[str, str]:
    """The negative of Sec. 12: no head chooses a per-row depth, i.e. every head's Spearman(stopping loop, depth) is
    below `max_spearman` (undefined counts as 0: one global depth) and it stops exactly at d on fewer than
    `max_at_depth` of rows."""
    rmax, amax = claim["max_spearman"], claim["max_at_depth"]
    chooses = [m for m, v in ours["methods"].items() if (v["spearman"] or 0.0) >= rmax or v["at_depth"] >= amax]
    return ("reproduced" if not chooses else "not reproduced"), \
        (f"bars: Spearman < {rmax:g} and at d < {amax:.0%} for every head; "
         + ("no head chooses a per-row depth" if not chooses else f"per-row depth chosen by {', '.join(chooses)}"))


def shares_at_least(claim: dict, ours: dict) -> tuple[str, str]:
    """Each declared splice cell reaches `bar` on its declared share (`cells`: {"site/span": share}) at every k0."""
    bar = claim["bar"]
    short = [f"{k} {ours['want'][k.rsplit('/', 1)[0]]} {v[ours['want'][k.rsplit('/', 1)[0]]]:.2f}"
             for k, v in ours["per"].items() if v[ours["want"][k.rsplit("/", 1)[0]]] < bar]
    return ("reproduced" if not short else "not reproduced"), \
        (f"bar {bar:g} on " + ", ".join(f"{c}: {sh}" for c, sh in ours["want"].items())
         + (f"; below it: {'; '.join(short)}" if short else "; every k0 reaches it"))


def each_step_at_its_loop(claim: dict, ours: dict) -> tuple[str, str]:
    """For every edited step k: the read-position state after loop k recovers at least `bar` of the margin, and the
    one after loop k - 1 does not reach it even at its interval's upper end (k = 1 has no loop 0). A model that
    makes the answer at one loop for every step (the last, or the first) fails: the steps would share that loop."""
    bar = claim["bar"]
    late = [f"step {k} at loop {k}: {v['at']['value']:.2f}" for k, v in sorted(ours["per"].items())
            if v["at"]["value"] < bar]
    early = [f"step {k} already at loop {k - 1}: {v['before']['high']:.2f}" for k, v in sorted(ours["per"].items())
             if v["before"] is not None and v["before"]["high"] >= bar]
    bad = late + early
    return ("reproduced" if not bad else "not reproduced"), \
        (f"bar {bar:g} at loop k, below it (interval) at loop k - 1, steps {', '.join(map(str, sorted(ours['per'])))}"
         + (f"; missed: {'; '.join(bad)}" if bad else "; every step enters at its own loop"))


def above_null_every_loop(claim: dict, ours: dict) -> tuple[str, str]:
    """Retrieval concentration above its null p95 at every loop read."""
    below = [t for t, v in ours["per"].items() if v["concentration"] <= v["null_p95"]]
    return ("reproduced" if not below else "not reproduced"), \
        (f"concentration above the null p95 at {len(ours['per']) - len(below)} of {len(ours['per'])} loops"
         + (f"; not at loop {', '.join(map(str, below))}" if below else "")
         + f"; the top head changes with the loop: {'yes' if len(ours['top_heads']) > 1 else 'no'}")


def drift_distinguishable_not_concentrated(claim: dict, ours: dict) -> tuple[str, str]:
    """Drift distinguishable from random partitions (top-3 share above the null p95 at a majority of loops) and
    below the concentration bar (`bar`, the share at which a few heads would carry the drift) at every loop."""
    n, above = len(ours["per"]), len(ours["above"])
    top = max(v["share"] for v in ours["per"].values())
    ok = above * 2 > n and top < claim["bar"]
    return ("reproduced" if ok else "not reproduced"), \
        (f"above the null p95 at {above} of {n} loops (majority needed); largest top-3 share {top:.3f} "
         f"(bar {claim['bar']:g})")


def at_most(claim: dict, ours: dict) -> tuple[str, str]:
    return ("reproduced" if ours["value"] <= claim["bar"] else "not reproduced"), \
        f"{ours['value']:.2g} against the bar {claim['bar']:g}"


def wall_below_fixed(claim: dict, ours: dict) -> tuple[str, str]:
    """Real early exit saves wall-clock time: below `bar` times the fixed budget's (the loop ratio beside it)."""
    ok = ours["wall_ratio"] < claim["bar"]
    return ("reproduced" if ok else "not reproduced"), \
        (f"wall-clock {ours['wall_ratio']:.2f}x the fixed budget's at {ours['loop_ratio']:.2f}x its loops (bar: "
         f"below {claim['bar']:g}x)")


def recommendation_installs(claim: dict, ours: dict) -> tuple[str, str]:
    """The recommended window shares more layers with every trained window that installed than with any that did
    not; not comparable (gate, in the claim) while fewer than one installing and one failing window share a recipe."""
    good = [r["shared"] for r in ours["runs"] if r["installed"]]
    bad = [r["shared"] for r in ours["runs"] if not r["installed"]]
    ok = bool(good) and (not bad or min(good) > max(bad))
    return ("reproduced" if ok else "not reproduced"), \
        (f"layers shared with the recommendation: installed {good or 'none'}, not installed {bad or 'none'}")


def ablation_fixes_block(claim: dict, ours: dict) -> tuple[str, str]:
    """RecurTrace App. B's two steps: the angular span holds the trained winner, and the short-training ablation
    fixes the block. Reproduced when the recommendation lies inside the span, is separated from the runner-up
    (paired interval above 0, every seed pair agreeing: `window_sweep.margin`) and every window outside the span
    is behind it with its paired interval above 0. A sweep that cannot tell its windows apart (a null trainer: the
    same CE on every row) or whose winner is the late control fails it."""
    bad = []
    if not ours["recommended_in_span"]:
        bad.append(f"the winner {ours['recommended']} lies outside the span {ours['span']}")
    if not ours["separated"]:
        bad.append(f"the winner is not separated from the runner-up ({ours['margin_why']})")
    for o in ours["outside"]:
        if o["window"] == ours["recommended"]:
            continue
        if not o["vs"] or o["vs"]["low"] <= 0:
            how = f"{o['vs']['value']:+.3f} [{o['vs']['low']:+.3f}, {o['vs']['high']:+.3f}]" if o["vs"] else "no reading"
            bad.append(f"{o['window']} ({o['role']}) is not behind it ({how} nats)")
    ahead = [f"{o['window']} {o['vs']['value']:+.3f} [{o['vs']['low']:+.3f}, {o['vs']['high']:+.3f}]"
             for o in ours["outside"] if o["vs"]]
    why = "; ".join(bad) if bad else (f"winner {ours['recommended']} inside the span {ours['span']}, separated from "
                                       f"the runner-up; outside the span behind it by {', '.join(ahead) or 'none'}")
    return ("not reproduced" if bad else "reproduced"), why


def a_not_ahead(claim: dict, ours: dict) -> tuple[str, str]:
    """A (the specimen) not ahead of B: the negation of `a_leads` (level, or B ahead)."""
    ahead, how = _a_ahead(ours["compared"])
    return ("not reproduced" if ahead else "reproduced"), how


TESTS = {f.__name__: f for f in (counts_not_worse, iterate_not_worse, drop_at_most, ratio_in_band, exactly_zero,
                                 no_significant_difference, b_leads_beyond, a_leads, a_faster_every_depth,
                                 all_ratios_in_band, peak_at, head_beats_fixed,
                                 head_matches_fixed_with_fewer_loops, collapses_to_one, a_not_ahead, no_per_row_depth,
                                 shares_at_least, above_null_every_loop, drift_distinguishable_not_concentrated,
                                 at_most, wall_below_fixed, recommendation_installs, ablation_fixes_block,
                                 each_step_at_its_loop)}


# ----------------------------------------------------------------------------- the ledger
def counts_at_most(claim: dict, ours: dict) -> tuple[str, str]:
    """Every count's share at most `bar` (a claim that something stays low, e.g. minimal zero-shot transfer)."""
    over = [f"{k}/{n}" for k, n in ours["counts"] if k / n > claim["bar"]]
    return ("reproduced" if not over else "not reproduced"), \
        (f"every share at most {claim['bar']:g}" + (f"; above it: {', '.join(over)}" if over else ": none above it"))


TESTS["counts_at_most"] = counts_at_most


def step_seconds(run: Path) -> tuple[float, str]:
    """Measured seconds per training step of a committed run (provenance wall_s / steps) and where it ran."""
    prov = read_json(run / "provenance.json", "provenance")
    if not prov.get("steps") or not prov.get("wall_s"):
        raise Missing(f"{run.name}'s provenance records no steps and wall time")
    hw = (prov.get("precision") or {}).get("hardware", {}).get("name", "this CPU")
    return prov["wall_s"] / prov["steps"], f"{run.name}: {prov['wall_s']:,.0f} s / {prov['steps']:,} steps on {hw}"


def comparable_cost(claim: dict, root: Path) -> str:
    """What would make a not-comparable claim comparable (`comparable_when`) and what it costs (`cost`: `steps` at
    the measured seconds per step of the run `like`, times `scale` for the bigger setting, plus `extra` in words)."""
    when = claim.get("comparable_when")
    if not when:
        return ""
    cost = claim.get("cost")
    if not cost:
        return f"comparable when {when}"
    parts = []
    if "steps" in cost:
        try:
            sps_, where = step_seconds(root / cost["like"])
        except (Missing, OSError) as gap:
            parts.append(f"step time unknown ({gap})")
        else:
            scale = cost.get("scale", 1.0)
            hours = cost["steps"] * sps_ * scale / 3600
            parts.append(f"{cost['steps']:,} steps x {sps_:.2f} s/step (measured, {where})"
                         + (f" x {scale:g} ({cost['scale_why']})" if scale != 1.0 else "")
                         + f" = about {hours:.1f} h of this 2-core CPU")
    if cost.get("extra"):
        parts.append(cost["extra"])
    return f"comparable when {when}; cost: {'; '.join(parts)}"


def build_ledger(claims_file: str | Path = CLAIMS_FILE, root: str | Path = ROOT) -> list[dict]:
    """One row per claim: id, paper, section, claim, paper_value, specimen, rule, ours, rows, comparison, verdict,
    reason (why in words), setting, comparable_when (with its cost; for a not-comparable row) and why (all of it)."""
    root = Path(root)
    rows = []
    for c in load_claims(claims_file):
        specimen = root / c["specimen"]
        row = {k: c[k] for k in ("id", "paper", "section", "claim", "paper_value", "specimen", "rule", "setting",
                                 "like_for_like")}
        try:
            if not specimen.is_dir():
                raise Missing(f"specimen {c['specimen']} is not committed")
            ours = MEASURES[c["measure"]](specimen, {**c, "_root": root})
            verdict, how = TESTS[c["test"]](c, ours)
            gates = list(ours.get("gates", []))
            if c.get("not_comparable"):     # declared: what the setting cannot show, whatever the numbers
                gates.insert(0, c["not_comparable"])
            if gates:
                reason = "; ".join(gates) + f" (the rule alone would read: {verdict})"
                verdict = "not comparable"
            else:
                reason = how
            row.update(ours=ours["text"], rows=ours["rows"], comparison=how, verdict=verdict, reason=reason)
        except Missing as gap:
            row.update(ours="-", rows=0, comparison="-", verdict="not comparable", reason=str(gap))
        row["comparable_when"] = comparable_cost(c, root) if row["verdict"] == "not comparable" else ""
        why = row["reason"] if c["like_for_like"] else f"{row['reason']}; setting differs: {c['setting']}"
        row["why"] = why + (f"; {row['comparable_when']}" if row["comparable_when"] else "")
        rows.append(row)
    return rows


def verdict_counts(rows: list[dict]) -> dict[str, dict[str, int]]:
    """{paper: {verdict: rows}} with every verdict present (0 where none), papers in order."""
    out: dict[str, dict[str, int]] = {}
    for r in rows:
        out.setdefault(r["paper"], dict.fromkeys(VERDICTS, 0))[r["verdict"]] += 1
    return dict(sorted(out.items()))


PAPERS = {"000": "000 (retrofit paper)", "002": "002 (RecurTrace)"}


def counts_table(rows: list[dict]) -> list[str]:
    """The verdict counts per paper as markdown table lines (the README shows the same lines)."""
    lines = ["| paper | reproduced | not reproduced | not comparable | claims |", "|---|---|---|---|---|"]
    for paper, c in verdict_counts(rows).items():
        lines.append(f"| {PAPERS.get(paper, paper)} | {c['reproduced']} | {c['not reproduced']} | "
                     f"{c['not comparable']} | {sum(c.values())} |")
    return lines


def ledger_markdown(rows: list[dict]) -> str:
    """The ledger as a markdown document (deterministic: the committed claims/LEDGER.md)."""
    out = ["# Claims ledger", "",
           "Generated by `workbench claims` from `workbench/data/claims.toml` and the committed specimens' "
           "battery results. Paper 000 is the retrofit paper, 002 RecurTrace. A verdict holds for the "
           "setting named in its row; rows whose setting differs from the paper's say so. Three verdicts: "
           "reproduced, not reproduced, and not comparable (the setting cannot answer the claim, or its "
           "results are not committed: the row says why, what the rule alone would read, what would make it "
           "comparable and what that costs). Every rule and its bar is declared in the data file.", "",
           "| claim | paper | paper's number | ours | specimen (rows) | verdict |",
           "|---|---|---|---|---|---|"]
    for r in rows:
        cell = lambda s: str(s).replace("|", "\\|")  # noqa: E731
        out.append(f"| {cell(r['claim'])} | {r['paper']} {cell(r['section'])} | {cell(r['paper_value'])} | "
                   f"{cell(r['ours'])} | `{r['specimen']}` ({r['rows']}) | **{r['verdict']}** |")
    out += ["", "## Verdicts per paper", "", *counts_table(rows), "", "## Why each verdict", ""]
    for r in rows:
        like = "like for like" if r["like_for_like"] else "setting differs"
        out.append(f"- **{r['id']}** ({r['verdict']}, {like}). Rule: {r['rule'].rstrip('.')}. Reading: {r['reason']}."
                   + ("" if r["like_for_like"] else f" Setting: {r['setting']}.")
                   + (f" {r['comparable_when'][0].upper()}{r['comparable_when'][1:]}." if r["comparable_when"] else ""))
    return "\n".join(out) + "\n"


def ledger_html(rows: list[dict]) -> str:
    """The ledger as one self-contained HTML page (no script)."""
    e = html.escape
    body = "".join(
        f"<tr><td>{e(r['claim'])}</td><td>{e(r['paper'])} {e(r['section'])}</td><td>{e(r['paper_value'])}</td>"
        f"<td>{e(r['ours'])}</td><td><code>{e(r['specimen'])}</code> ({e(str(r['rows']))})</td>"
        f"<td class='{e(r['verdict'].replace(' ', '-'))}'>{e(r['verdict'])}</td><td>{e(r['rule'])}</td>"
        f"<td>{e(r['why'])}</td></tr>"
        for r in rows)
    return ("<!doctype html><html><head><meta charset='utf-8'><title>Claims ledger</title><style>"
            "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #ccc;"
            "padding:4px 8px;vertical-align:top}.reproduced{background:#e6f4ea}.not-reproduced{background:#fce8e6}"
            ".not-comparable{background:#f1f3f4}</style></head><body><h1>Claims ledger</h1>"
            "<table><tr><th>claim</th><th>paper</th><th>paper's number</th><th>ours</th><th>specimen (rows)</th>"
            f"<th>verdict</th><th>rule</th><th>why</th></tr>{body}</table></body></html>\n")


LEDGER_FILES = ("LEDGER.md", "ledger.html", "ledger.json")  # what `write_ledger` writes


def write_ledger(out: str | Path, rows: list[dict]) -> list[Path]:
    """Writes LEDGER.md, ledger.html and ledger.json into `out`; returns their paths."""
    out = Path(out)
    files = {"LEDGER.md": ledger_markdown(rows), "ledger.html": ledger_html(rows),
             "ledger.json": json.dumps(rows, indent=1, sort_keys=True) + "\n"}
    for name, text in files.items():
        write_bytes_atomic(out / name, text.encode())
    return [out / n for n in files]
