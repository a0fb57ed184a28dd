"""The claims ledger: each testable claim of the two papers against a committed specimen's numbers.

The claims and the papers' numbers live in `workbench/data/claims.toml` (data, not code). Each
names a `measure` (a function below) that reads a specimen's committed battery results
(`<specimen>/battery/summary.json` and the parquet tables beside it), and a `test` that turns
the paper's number and ours into a verdict:

- reproduced: ours meets the paper's claim under the stated test;
- not reproduced: ours misses it (the comparison says by how much);
- not comparable: the specimen or its results are missing, or the setting cannot answer it.

The ledger is a pure function of committed files, so `workbench claims` regenerates it byte
for byte (a test checks `claims/LEDGER.md`).
"""

from __future__ import annotations

import html
import json
import math
from pathlib import Path

import pandas as pd

from workbench.arms import compare_arms, load_arm
from workbench.errors import WorkbenchError
from workbench.io import read_json, read_toml, write_bytes_atomic
from workbench.results import read_table
from workbench.stats import fisher, mcnemar

CLAIMS_FILE = Path(__file__).resolve().parent / "data" / "claims.toml"
ROOT = Path(__file__).parent / "data"   # the repository's layout: training/keepers/<specimen> (workbench.defaults)
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
                               "setting", "like_for_like") if k not in c]
        if missing:
            raise WorkbenchError(f"{path}: claim '{c.get('id', '?')}' lacks '{missing[0]}'")
        if c["measure"] not in MEASURES or c["test"] not in TESTS:
            raise WorkbenchError(f"{path}: claim '{c['id']}' names an unknown measure or test")
    return claims


# ----------------------------------------------------------------------------- measures
class Missing(Exception):
    """A specimen or one of its result files is not there: the claim is not comparable (yet)."""


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
    f = _table(specimen, "overshoot")
    support = _summary(specimen)["checkpoint"]["support"]
    f = f[f["depth"].isin(claim["depths"])]
    f = f[f["loop"] <= support] if inside else f[f["loop"] > support]
    if f.empty:
        raise Missing(f"no overshoot loops {'inside' if inside else 'beyond'} the support of {support}")
    it, park, n = int((f["cls"] == "iterate").sum()), int((f["cls"] == "park").sum()), len(f)
    loops = f"loops {int(f['loop'].min())}-{int(f['loop'].max())}"
    return {"counts": [[it, n]], "park": [park, n], "rows": int(f["row_id"].nunique()),
            "text": f"{it}/{n} iterate ({it / n:.1%}), {park}/{n} park; {loops}, support {support}"}


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
    base, ours = int(f["base_correct"].sum()), int(f["checkpoint_correct"].sum())
    helped = int((~f["base_correct"] & f["checkpoint_correct"]).sum())
    hurt = int((f["base_correct"] & ~f["checkpoint_correct"]).sum())
    n = len(f)
    return {"counts": [[base, n], [ours, n]], "drop": 100.0 * (base - ours) / n, "helped": helped, "hurt": hurt,
            "p": mcnemar(helped, hurt), "rows": n,
            "text": f"base {base}/{n} -> {ours}/{n} ({helped} helped, {hurt} hurt, McNemar p = {mcnemar(helped, hurt):.3g})"}


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


def arms_beyond(specimen: Path, claim: dict) -> dict:
    """A vs B pooled beyond the trained support (paired), the crossover depth and each arm's frontier at 0.71."""
    out = _arms(specimen, claim)
    if "beyond_support" not in out["pooled"]:
        raise Missing("no depth beyond the trained support was read")
    p = out["pooled"]["beyond_support"]
    inside = out["pooled"]["inside_support"]
    fr = out["frontier"][out["frontier"]["bar"] == 0.71].set_index("arm")["frontier"]
    a, b = out["arms"]
    cross = out["crossover"]
    return {"beyond": p, "compared": p, "inside": inside, "crossover": cross, "frontier": {a: fr[a], b: fr[b]}, "rows": p["n"],
            "text": f"beyond the support {a} {p['a_correct']}/{p['n']} vs {b} {p['b_correct']}/{p['n']} "
                    f"({b} helped {p['b_helped']}, hurt {p['b_hurt']}, McNemar p = {p['p_mcnemar']:.3g}); inside "
                    f"{inside['a_correct']} vs {inside['b_correct']} of {inside['n']}; frontiers {fr[a]:.2f} vs "
                    f"{fr[b]:.2f}; " + (f"cross at depth {cross:.2f}" if cross is not None else "no crossing")}


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
    cpu = {x.name: json.loads((x.results_dir / "final.json").read_text()).get("cpu") for x in arms}
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
    return {"per_support": [{"support": s, "run": name, "label": label[name], **r["ratios"], "censored": r["censored"]}
                            for s, name, r in per],
            "range": [min(at), max(at)], "rows": sum(r["rows"] for *_, r in per),
            "text": "; ".join(f"{label[name]}: {r['ratios']['0.71']:.2f}{'+' if '0.71' in r['censored'] else ''} "
                              f"(0.60-0.80: {min(v):.2f}-{max(v):.2f}{'+' if r['censored'] else ''})"
                              for (_, name, r), v in zip(per, spread))
            + ("; + censored: the deepest depth read is still above the bar, a lower bound"
               if any(r["censored"] for *_, r in per) else "")}


def _paired(a: pd.Series, b: pd.Series) -> dict:
    """Paired counts of A and B right/wrong on the same rows, in B's view (as the arms comparisons), exact McNemar."""
    helped, hurt = int((b & ~a).sum()), int((a & ~b).sum())
    return {"n": len(a), "a_correct": int(a.sum()), "b_correct": int(b.sum()), "b_helped": helped, "b_hurt": hurt,
            "p_mcnemar": mcnemar(helped, hurt)}


def _halting(specimen: Path, claim: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the compute-accuracy curve, the chosen methods row by row) of a halting battery's results."""
    results = claim.get("results", "halting")
    return _table(specimen, "halting", results), _table(specimen, "halting__chosen", results)


def _pick(chosen: pd.DataFrame, method: str) -> pd.DataFrame:
    g = chosen[chosen["method"] == method].set_index("row_id")
    if g.empty:
        raise Missing(f"the halting results hold no '{method}' method")
    return g


def halting_fixed_peak(specimen: Path, claim: dict) -> dict:
    """Accuracy of every fixed depth on the reported rows, and the best fixed depth (chosen on calibration rows)."""
    curve, chosen = _halting(specimen, claim)
    fixed = curve[curve["method"] == "fixed_k"].sort_values("mean_loops")
    best = int(fixed[fixed["chosen"]]["mean_loops"].iloc[0])
    by_k = {int(r.mean_loops): float(r.accuracy) for r in fixed.itertuples()}
    n = int(fixed["n"].iloc[0])
    return {"best": best, "by_k": by_k, "rows": n,
            "text": f"fixed depth k = 1..{max(by_k)}: " + ", ".join(f"{v:.2f}" for v in by_k.values())
                    + f" ({n} reported rows); best k on the calibration rows: {best} ({by_k[best]:.3f})"}


def halting_head_vs_fixed(specimen: Path, claim: dict) -> dict:
    """The distilled head at its chosen threshold against the best fixed depth, paired on the reported rows."""
    _, chosen = _halting(specimen, claim)
    head, fixed = _pick(chosen, claim.get("method", "head")), _pick(chosen, "fixed_k")
    fixed = fixed.loc[head.index]
    a, b = head["correct"].astype(bool), fixed["correct"].astype(bool)
    k, loops = int(fixed["loops"].iloc[0]), float(head["loops"].mean())
    p = _paired(a, b)
    helped, hurt = p["b_helped"], p["b_hurt"]
    ceiling = ""
    if (chosen["method"] == "oracle").any():      # the first right loop: what a perfect head would reach
        o = _pick(chosen, "oracle").loc[head.index]
        ceiling = f"; the oracle {int(o['correct'].sum())}/{len(o)} at {float(o['loops'].mean()):.2f} loops"
    return {"compared": p, "head_loops": loops, "best_k": k, "tau": float(head["threshold"].iloc[0]), "rows": len(a),
            "text": f"head (tau = {head['threshold'].iloc[0]:g}) {p['a_correct']}/{p['n']} at {loops:.2f} loops vs "
                    f"fixed k = {k} {p['b_correct']}/{p['n']} (head alone right on {hurt}, fixed alone on {helped})"
                    + ceiling}


def halting_collapse(specimen: Path, claim: dict) -> dict:
    """Each indirect head (`claim["methods"]`) at its chosen threshold: mean loops and the share stopping at loop 1."""
    _, chosen = _halting(specimen, claim)
    per = {}
    for m in claim["methods"]:
        g = _pick(chosen, m)
        per[m] = {"mean_loops": float(g["loops"].mean()), "at_one": float((g["loops"] == 1).mean()),
                  "accuracy": float(g["correct"].mean()), "threshold": float(g["threshold"].iloc[0]), "n": len(g)}
    return {"methods": per, "rows": max(v["n"] for v in per.values()),
            "text": "; ".join(f"{m} (threshold {v['threshold']:g}) {v['mean_loops']:.2f} loops, {v['at_one']:.0%} of "
                              f"rows at loop 1, accuracy {v['accuracy']:.3f}" for m, v in per.items())}


def memory_vs_plain(specimen: Path, claim: dict) -> dict:
    """Memory (the specimen) against plain looping (`against`), row-paired at loops = depth over the claim's depths.

    Both read by `workbench probe --only loop_accuracy` into `results`. Not comparable while the memory run has
    not installed the task: its accuracy at loops = depth over `installed_depths` (default: the compared depths;
    the trained depths when the comparison is on extrapolation depths, as the paper's) must reach `installed_bar`."""
    results = claim.get("results", "loops")
    other = claim.get("_root", ROOT) / claim["against"]
    frames = [_table(s, "loop_accuracy", results) for s in (specimen, other)]
    at_depth = frames[0][frames[0]["loop"] == frames[0]["depth"]]
    installed = claim.get("installed_depths", claim["depths"])
    bar = at_depth[at_depth["depth"].isin(installed)]["correct"].astype(bool)
    mem, plain = (f[(f["loop"] == f["depth"]) & f["depth"].isin(claim["depths"])].set_index("row_id")
                  for f in frames)
    plain = plain.loc[mem.index]
    a, b = mem["correct"].astype(bool), plain["correct"].astype(bool)
    per = {int(d): (int(a[g.index].sum()), int(b[g.index].sum()), len(g)) for d, g in mem.groupby("depth")}
    detail = ", ".join(f"d{d} {x}/{n} vs {y}/{n}" for d, (x, y, n) in per.items())
    if bar.empty or float(bar.mean()) < claim.get("installed_bar", 0.0):
        level = f"{bar.mean():.3f}" if len(bar) else "no rows"
        raise Missing(f"the memory run has not installed the task: loops = depth accuracy {level} over depths "
                      f"{installed[0]}-{installed[-1]} (bar {claim.get('installed_bar', 0.0)}); memory vs plain "
                      f"{detail}")
    p = _paired(a, b)
    return {"compared": p, "rows": len(a),
            "text": f"loops = depth, memory {p['a_correct']}/{p['n']} vs plain {p['b_correct']}/{p['n']} ({detail})"}


MEASURES = {f.__name__: f for f in (diagonal, intermediate, overshoot_inside, overshoot_beyond, frontier_ratio,
                                    guardrail, identity_fresh, identity_adapter_off, arms_depths, arms_beyond,
                                    arms_overall, arms_latency, support_scaling, halting_fixed_peak,
                                    halting_head_vs_fixed, halting_collapse, memory_vs_plain)}


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


def head_beats_fixed(claim: dict, ours: dict) -> tuple[str, str]:
    """The head more accurate than the best fixed depth at matched compute: A ahead at exact McNemar p < 0.05, its
    mean loops within `loops_slack` of k."""
    p, slack = ours["compared"], claim.get("loops_slack", 0.25)
    ok = _a_ahead(p)[0] and ours["head_loops"] <= ours["best_k"] + slack
    return ("reproduced" if ok else "not reproduced"), \
        (f"head {p['a_correct']} vs fixed k = {ours['best_k']} {p['b_correct']} of {p['n']} (head alone right on "
         f"{p['b_hurt']}, fixed alone on {p['b_helped']}, exact McNemar p = {p['p_mcnemar']:.3g}) at "
         f"{ours['head_loops']:.2f} vs {ours['best_k']} loops")


def head_matches_fixed_with_fewer_loops(claim: dict, ours: dict) -> tuple[str, str]:
    """The head not significantly below the best fixed depth (exact McNemar) while spending fewer mean loops."""
    p = ours["compared"]
    worse = p["b_helped"] > p["b_hurt"] and p["p_mcnemar"] < ALPHA
    fewer = ours["head_loops"] < ours["best_k"]
    return ("reproduced" if fewer and not worse else "not reproduced"), \
        (f"head {p['a_correct']} vs fixed {p['b_correct']} of {p['n']} (exact McNemar p = {p['p_mcnemar']:.3g}"
         f"{', fixed significantly ahead' if worse else ''}); mean loops {ours['head_loops']:.2f} vs "
         f"{ours['best_k']} ({1 - ours['head_loops'] / ours['best_k']:.0%} fewer)")


def collapses_to_one(claim: dict, ours: dict) -> tuple[str, str]:
    """Every indirect head stops at least `share` (default 0.9) of rows at loop 1 at its chosen threshold."""
    share = claim.get("share", 0.9)
    out = [m for m, v in ours["methods"].items() if v["at_one"] < share]
    return ("reproduced" if not out else "not reproduced"), \
        ("; ".join(f"{m}: {v['at_one']:.0%} of rows at loop 1 ({v['mean_loops']:.2f} mean loops)"
                   for m, v in ours["methods"].items()) + f"; collapse means at least {share:.0%} at loop 1"
         + (f"; not collapsed: {', '.join(out)}" if out else ""))


def a_not_ahead(claim: dict, ours: dict) -> tuple[str, str]:
    """A (the specimen) not ahead of B: the negation of `a_leads` (level, or B ahead)."""
    ahead, how = _a_ahead(ours["compared"])
    return ("not reproduced" if ahead else "reproduced"), how


TESTS = {f.__name__: f for f in (counts_not_worse, iterate_not_worse, drop_at_most, ratio_in_band, exactly_zero,
                                 no_significant_difference, b_leads_beyond, a_leads, a_faster_every_depth,
                                 all_ratios_in_band, peak_at, head_beats_fixed,
                                 head_matches_fixed_with_fewer_loops, collapses_to_one, a_not_ahead)}


# ----------------------------------------------------------------------------- the ledger
def build_ledger(claims_file: str | Path = CLAIMS_FILE, root: str | Path = ROOT) -> list[dict]:
    """One row per claim: id, paper, section, claim, paper_value, specimen, ours, rows, comparison, verdict, why."""
    root = Path(root)
    rows = []
    for c in load_claims(claims_file):
        specimen = root / c["specimen"]
        row = {k: c[k] for k in ("id", "paper", "section", "claim", "paper_value", "specimen", "setting",
                                 "like_for_like")}
        try:
            if not specimen.is_dir():
                raise Missing(f"specimen {c['specimen']} is not committed")
            ours = MEASURES[c["measure"]](specimen, {**c, "_root": root})
            verdict, how = TESTS[c["test"]](c, ours)
            why = how if c["like_for_like"] else f"{how}; setting differs: {c['setting']}"
            row.update(ours=ours["text"], rows=ours["rows"], comparison=how, verdict=verdict, why=why)
        except Missing as gap:
            row.update(ours="-", rows=0, comparison="-", verdict="not comparable", why=str(gap))
        rows.append(row)
    return rows


def ledger_markdown(rows: list[dict]) -> str:
    """The ledger as a markdown document (deterministic: the committed claims/LEDGER.md)."""
    out = ["# Claims ledger", "",
           "Generated by `workbench claims` from `workbench/data/claims.toml` and the committed specimens' "
           "battery results. Paper 000 is the retrofit paper, 002 RecurTrace. A verdict holds for the "
           "setting named in its row; rows whose setting differs from the paper's say so.", "",
           "| claim | paper | paper's number | ours | specimen (rows) | verdict |",
           "|---|---|---|---|---|---|"]
    for r in rows:
        cell = lambda s: str(s).replace("|", "\\|")  # noqa: E731
        out.append(f"| {cell(r['claim'])} | {r['paper']} {cell(r['section'])} | {cell(r['paper_value'])} | "
                   f"{cell(r['ours'])} | `{r['specimen']}` ({r['rows']}) | **{r['verdict']}** |")
    out += ["", "## Why each verdict", ""]
    for r in rows:
        like = "like for like" if r["like_for_like"] else "setting differs"
        out.append(f"- **{r['id']}** ({r['verdict']}, {like}): {r['why']}")
    return "\n".join(out) + "\n"


def ledger_html(rows: list[dict]) -> str:
    """The ledger as one self-contained HTML page (no script)."""
    e = html.escape
    body = "".join(
        f"<tr><td>{e(r['claim'])}</td><td>{e(r['paper'])} {e(r['section'])}</td><td>{e(r['paper_value'])}</td>"
        f"<td>{e(r['ours'])}</td><td><code>{e(r['specimen'])}</code> ({e(str(r['rows']))})</td>"
        f"<td class='{e(r['verdict'].replace(' ', '-'))}'>{e(r['verdict'])}</td><td>{e(r['why'])}</td></tr>"
        for r in rows)
    return ("<!doctype html><html><head><meta charset='utf-8'><title>Claims ledger</title><style>"
            "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #ccc;"
            "padding:4px 8px;vertical-align:top}.reproduced{background:#e6f4ea}.not-reproduced{background:#fce8e6}"
            ".not-comparable{background:#f1f3f4}</style></head><body><h1>Claims ledger</h1>"
            "<table><tr><th>claim</th><th>paper</th><th>paper's number</th><th>ours</th><th>specimen (rows)</th>"
            f"<th>verdict</th><th>why</th></tr>{body}</table></body></html>\n")


LEDGER_FILES = ("LEDGER.md", "ledger.html", "ledger.json")  # what `write_ledger` writes


def write_ledger(out: str | Path, rows: list[dict]) -> list[Path]:
    """Writes LEDGER.md, ledger.html and ledger.json into `out`; returns their paths."""
    out = Path(out)
    files = {"LEDGER.md": ledger_markdown(rows), "ledger.html": ledger_html(rows),
             "ledger.json": json.dumps(rows, indent=1, sort_keys=True) + "\n"}
    for name, text in files.items():
        write_bytes_atomic(out / name, text.encode())
    return [out / n for n in files]
