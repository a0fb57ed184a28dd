"""Paper 000's (the retrofit paper's) measures and the verdict tests only its claims use, each registered where it is
written (`@measure`, `@verdict_test`): the depth matrix, overshoot, the guardrail, identity, the arms compared, the
support family, the splice, patching, heads, drift, the gradient audit and the verbal surfaces."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from workbench.analysis.claims.ledger import (
    ALPHA,
    BATTERY,
    MAJORITY,
    ROOT,
    Missing,
    _depth_tracking,
    _gate,
    _halting,
    _pick,
    _summary,
    _table,
    _top,
    measure,
    verdict_test,
)
from workbench.analysis.claims.nulls import CHANCE, ENTRY, MAJORITY_KIND, SEED, chance, random_entries
from workbench.analysis.stats import fisher, paired_counts
from workbench.analysis.stats import frontier as stats_frontier
from workbench.defaults import INSTALL_BAR
from workbench.guardrail_set import GUARDRAIL_VERSION, guardrail_rows


# ----------------------------------------------------------------------------- measures
@measure
def diagonal(specimen: Path, claim: dict) -> dict:
    """Final-loop correct / rows at each depth (depth-matrix rows with loop = depth)."""
    f = _table(specimen, "depth_matrix")
    f = f[(f["loop"] == f["depth"]) & f["depth"].isin(claim["depths"])]
    counts = [[int(g["correct"].sum()), len(g)] for _, g in f.groupby("depth")]
    major = [[_majority(g), len(g)] for _, g in f.groupby("depth")]
    return {"counts": counts, "text": ", ".join(f"{k}/{n}" for k, n in counts) + f" at depths "
            f"{claim['depths'][0]}-{claim['depths'][-1]}", "rows": sum(n for _, n in counts),
            "nulls": {MAJORITY: {"counts": major, "text": ", ".join(f"{k}/{n}" for k, n in major)}}}


def _majority(f: pd.DataFrame) -> int:
    """How many of these cells a policy that always answers their most frequent target gets right."""
    return int(f["target"].value_counts().iloc[0]) if len(f) else 0


@measure
def intermediate(specimen: Path, claim: dict) -> dict:
    """Active intermediate labels (loop t < depth d) correct / cells, over the claim's depths."""
    f = _table(specimen, "depth_matrix")
    f = f[(f["loop"] < f["depth"]) & f["depth"].isin(claim["depths"])]
    k, n = int(f["correct"].sum()), len(f)
    m = _majority(f)
    return {"counts": [[k, n]], "text": f"{k}/{n} ({k / n:.1%})", "rows": int(f["row_id"].nunique()),
            "nulls": {MAJORITY: {"counts": [[m, n]], "text": f"{m}/{n}"}}}


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
    top = d.groupby("depth")["iterate_symbol"].transform(_top)          # per depth, as the depth matrix's null
    m_it, m_park = int((d["iterate_symbol"] == top).sum()), int((d["park_symbol"] == top).sum())
    out["nulls"] = {
        MAJORITY: {"counts": [[m_it, n]], "park": [m_park, n],
                   "text": f"{m_it}/{n} iterate, {m_park}/{n} park (the most frequent next symbol at each depth)"},
        "a model that holds x_d (parks)": {"counts": [[0, n]], "park": [n, n], "text": f"0/{n} iterate, {n}/{n} park"}}
    if claim.get("within_support") and out["max_loop"] > support:
        _gate(out, f"the loops read ({loops}) lie past this specimen's trained support of {support}, while the "
                   f"paper's loops lay inside its own support")
    return out


@measure
def overshoot_inside(specimen: Path, claim: dict) -> dict:
    """Extra loops t in (d, support]: iterate / park counts."""
    return _overshoot(specimen, claim, inside=True)


@measure
def overshoot_beyond(specimen: Path, claim: dict) -> dict:
    """Extra loops t > support: iterate / park counts."""
    return _overshoot(specimen, claim, inside=False)


@measure
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
            "nulls": {MAJORITY: _majority_frontier(specimen, claim, support)},
            "text": f"{frontier['0.71']:.2f}{mark['0.71']} / {support} = {ratios['0.71']:.2f}{mark['0.71']} "
                    f"({ratios['0.60'] or float('nan'):.2f}{mark['0.60']} at 0.60, "
                    f"{ratios['0.80'] or float('nan'):.2f}{mark['0.80']} at 0.80)"
                    + ("; + censored: the deepest row depth is still above the bar, so the frontier is at least this"
                       if censored else "")}


def _majority_frontier(specimen: Path, claim: dict, support: int) -> dict:
    """frontier / support of the majority answer on the same depth-matrix rows (loop = depth, the most frequent target
    at each depth): no depth it reads reaches a bar has frontier 0, as a model that never installs."""
    f = _table(specimen, "depth_matrix", claim.get("results", BATTERY))
    f = f[f["loop"] == f["depth"]]
    acc = {int(d): float((g["target"] == _top(g["target"])).mean()) for d, g in f.groupby("depth")}
    ratios = {}
    for bar in ("0.60", "0.71", "0.80"):
        at = stats_frontier(acc, float(bar))
        ratios[bar] = 0.0 if math.isnan(at) else at / support
    return {"ratios": ratios, "censored": [], "range": [min(ratios.values()), max(ratios.values())],
            "text": f"{ratios['0.71']:.2f} (accuracy {min(acc.values()):.2f}-{max(acc.values()):.2f} over depths "
                    f"{min(acc)}-{max(acc)})"}


def _censored(diagonal: dict, frontier: dict) -> list[str]:
    """The bars whose frontier is the deepest depth read while that depth is still at or above the bar: the rows
    end before the accuracy falls, so the frontier (and frontier / support) is only a lower bound there."""
    last = max(diagonal, key=int)
    return [bar for bar, f in frontier.items()
            if f is not None and float(f) == float(last) and diagonal[last] >= float(bar)]


@measure
def guardrail(specimen: Path, claim: dict) -> dict:
    """Base vs specimen on the arithmetic guardrail at loop 1, row-paired (identity probe's table)."""
    f = _table(specimen, "identity__guardrail", claim.get("results", BATTERY))
    c = paired_counts(f["base_correct"], f["checkpoint_correct"])
    base, ours, n = c.a_correct, c.b_correct, c.n
    answers = {r["row_id"]: r["answer"] for r in guardrail_rows()}
    if set(f["row_id"]) - set(answers):
        raise Missing(f"the guardrail table holds rows the guardrail set ({GUARDRAIL_VERSION}) does not")
    top = _top(pd.Series([answers[r] for r in f["row_id"]]))
    major = sum(answers[r] == top for r in f["row_id"])
    return {"counts": [[base, n], [ours, n]], "drop": 100.0 * (base - ours) / n, "helped": c.helped, "hurt": c.hurt,
            "p": c.p_mcnemar, "rows": n,
            "text": f"base {base}/{n} -> {ours}/{n} ({c.helped} helped, {c.hurt} hurt, McNemar p = {c.p_mcnemar:.3g})",
            "nulls": {MAJORITY: {"drop": 100.0 * (base - major) / n,
                                 "text": f"always '{top}': base {base}/{n} -> {major}/{n}"}}}


def _identity(specimen: Path, variant: str) -> dict:
    f = _table(specimen, "identity")
    g = f[f["variant"] == variant]
    if g.empty:
        raise Missing(f"no identity rows of variant '{variant}'")
    worst = float(g["max_abs_diff"].max())
    out = {"value": worst, "rows": len(g), "text": f"max |Δlogit| = {worst:g} over {len(g)} configuration(s)"}
    other = f[f["variant"] == "checkpoint_vs_base"]   # the same comparison where the model differs: it can read > 0
    if not other.empty:
        v = float(other["max_abs_diff"].max())
        out["nulls"] = {"the trained checkpoint (adapter on) against the base": {
            "value": v, "text": f"max |Δlogit| = {v:g} at loop 1"}}
    return out


@measure
def identity_fresh(specimen: Path, claim: dict) -> dict:
    return _identity(specimen, "fresh")


@measure
def identity_adapter_off(specimen: Path, claim: dict) -> dict:
    return _identity(specimen, "adapter_off_vs_base")


@measure
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
    null = [{"support": s, "run": name, "label": f"support {s}" + (f" ({name})" if s in repeated else ""),
             **r["nulls"][MAJORITY]["ratios"], "censored": [], "judged": judged is None or s in judged}
            for s, name, r in per]
    out = {"nulls": {MAJORITY: {"per_support": null, "range": [0.0, max(max(x[b] for b in ("0.60", "0.71", "0.80"))
                                                                     for x in null)],
                                "text": "; ".join(f"{x['label']}: {x['0.71']:.2f}" for x in null)}},
           "per_support": [{"support": s, "run": name, "label": label[name], **r["ratios"], "censored": r["censored"],
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


@measure
def halting_depth_choice(specimen: Path, claim: dict) -> dict:
    """Whether learned heads choose a per-row depth (retrofit paper Sec. 12): for each head (`claim["methods"]`) at
    its chosen threshold, Spearman of its stopping loop with the row's depth, the share stopping exactly at d and
    the modal stopping loop's share."""
    _, chosen = _halting(specimen, claim)
    per = {m: _depth_tracking(_pick(chosen, m)) for m in claim["methods"]}
    text = lambda per: "; ".join(f"{m}: {v['text']}, {v['modal_share']:.0%} at loop {v['modal_loop']}"  # noqa: E731
                                 for m, v in per.items())
    first = _pick(chosen, claim["methods"][0])
    at_one = {m: _depth_tracking(first.assign(loops=1)) for m in claim["methods"]}
    return {"methods": per, "rows": len(first), "text": text(per),
            "nulls": {"heads that always stop at loop 1": {"methods": at_one, "text": "every head at loop 1"}}}


@measure
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
    cells = _table(specimen, "splice")                # n counts classified cells; say from how many pairs
    total = int(cells["pair_id"].nunique())
    kept = cells[~cells["coincide"]].groupby(["site", "span", "k0"])["pair_id"].nunique()
    for k, v in read.items():
        site, span, k0 = k.split("/")
        v["pairs"] = int(kept.get((site, span, int(k0.removeprefix("k0="))), 0))
    # its null: one answer at every classified cell of a (site, span, k0), the most frequent symbol of the class the
    # share counts (the best any single answer does on it)
    null = {}
    for k in read:
        site, span, k0 = k.split("/")
        g = cells[~cells["coincide"] & (cells["site"] == site) & (cells["span"] == span)
                  & (cells["k0"] == int(k0.removeprefix("k0=")))]
        null[k] = {share: float((g[f"{cls}_symbol"] == _top(g[f"{cls}_symbol"])).mean()) if len(g) else 0.0
                   for share, cls in (("source_orbit", "source"), ("lawful", "lawful"))}
    nulls = {MAJORITY: {"per": null, "want": want, "text": "; ".join(
        f"{k}: {want[k.rsplit('/', 1)[0]]} {v[want[k.rsplit('/', 1)[0]]]:.2f}" for k, v in null.items())}}
    return {"per": read, "want": want, "rows": total, "nulls": nulls,
            "text": "; ".join(f"{k}: source orbit {v['source_orbit']:.2f}, lawful {v['lawful']:.2f}, shortcut "
                              f"{v['shortcut']:.2f} ({v['verdict']}, {v['n']} cells from {v['pairs']} of {total} "
                              "pairs)" for k, v in read.items())}


@measure
def patching_steps(specimen: Path, claim: dict) -> dict:
    """The patching grid's read-position state per edited step (`patching__steps`): for an edit to the entry loop k
    reads, the recovered share of the answer's margin when the clean read-position state after loop t is patched
    in, at t = k - 1 and t = k, with its row-bootstrap interval."""
    f = _table(specimen, "patching__steps", claim.get("results", BATTERY))
    curves = {int(k): g.set_index("loop") for k, g in f.groupby("step")}
    if not curves:
        raise Missing("the patching results hold no entry edit")
    # its null: each step entering at a loop drawn at random (`nulls.random_entries`), knowing nothing of which
    # loop reads which entry; a curve copied from the model's own steps would fail the rule by construction
    drawn = random_entries(curves)
    entry = {k: int(at.index[at["recovered"] > 0][0]) for k, at in drawn.items()}
    nulls = {f"each step entering at a random loop (seed {SEED})": {
        **_steps(drawn), "kind": ENTRY,
        "text": "entering at loops " + ", ".join(f"{entry[k]} (step {k})" for k in sorted(entry))}}
    return _steps(curves) | {"nulls": nulls}


def _steps(curves: dict[int, pd.DataFrame]) -> dict:
    """`patching_steps`' reading of {step k: its recovered share by loop}."""
    per = {k: {"at": _share(at, k), "before": _share(at, k - 1) if k > 1 else None} for k, at in curves.items()}
    return {"per": per, "curves": {k: tuple(at["recovered"].round(6)) for k, at in curves.items()},
            "rows": max(int(at["n"].max()) for at in curves.values()),
            "text": "; ".join(f"step {k}: loop {k} {v['at']['value']:.2f} [{v['at']['low']:.2f}, {v['at']['high']:.2f}]"
                              + (f", loop {k - 1} {v['before']['value']:.2f} [{v['before']['low']:.2f}, "
                                 f"{v['before']['high']:.2f}]" if v["before"] else "") + f" ({v['at']['n']} pairs)"
                              for k, v in sorted(per.items()))}


def _share(by_loop: pd.DataFrame, t: int) -> dict:
    r = by_loop.loc[t]
    return {"value": float(r["recovered"]), "low": float(r["low"]), "high": float(r["high"]), "n": int(r["n"])}


CONTROL = "the untrained retrofit (the same base and block, untrained)"


def _control(specimen: Path, claim: dict, read) -> dict:
    """{CONTROL: the reading of the claim's `control` results folder}: the same probe on the run's untrained control
    (`workbench probe --checkpoint untrained:RUN_DIR`), a null for a finding said to come from training. A claim
    that names a control whose results are missing is a missing reading, not a row without its null."""
    return {CONTROL: read(specimen, claim["control"])} if claim.get("control") else {}


@measure
def retrieval_heads(specimen: Path, claim: dict) -> dict:
    """Retrieval-head specialisation by loop (`heads__summary`): per loop, the top-2 concentration against its null
    p95 (random rotations), the retrieval heads and the top head, and whether the top head changes with the loop;
    with a `control`, the same on the untrained retrofit as its null."""
    return {**_retrieval(specimen), "nulls": _control(specimen, claim, _retrieval)}


def _retrieval(specimen: Path, results: str = BATTERY) -> dict:
    f = _table(specimen, "heads__summary", results)
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


@measure
def drift_null(specimen: Path, claim: dict) -> dict:
    """Subspace drift's concentration test (`drift__concentration`): per loop, the top-3 heads' share of the residual
    outside loop 1's PCA envelope against its null p95 (random partitions); with a `control`, the same on the
    untrained retrofit as its null."""
    return {**_drift(specimen), "nulls": _control(specimen, claim, _drift)}


def _drift(specimen: Path, results: str = BATTERY) -> dict:
    f = _table(specimen, "drift__concentration", results)
    per = {int(r.loop): {"share": float(r.top3_share), "null_p95": float(r.null_p95),
                         "residual": float(r.residual_frac)} for r in f.itertuples()}
    return {"per": per, "rows": len(per), "above": [t for t, v in per.items() if v["share"] > v["null_p95"]],
            "text": "; ".join(f"loop {t}: top-3 share {v['share']:.3f} vs null p95 {v['null_p95']:.3f}"
                              for t, v in per.items())}


@measure
def finite_difference(specimen: Path, claim: dict) -> dict:
    """The gradient audit's finite-difference check (`gradient_audit__fd`): autograd's directional derivative
    against central differences, and the relative error, worst over the directions read."""
    f = _table(specimen, "gradient_audit__fd")
    worst = f.sort_values("rel_error", ascending=False).iloc[0]
    fd = float(worst["finite_difference"])

    def rel(g: float) -> float:   # the audit's relative error (workbench.train.audit)
        return abs(fd - g) / max(abs(fd), abs(g), 1e-30)

    # its nulls: a gradient that does not flow (zero) and one of the wrong sign, against the same differences
    nulls = {name: {"value": rel(g), "text": f"{g:.4g} vs {fd:.4g}: relative error {rel(g):.2g}"}
             for name, g in (("a gradient that does not flow (zero)", 0.0),
                             ("the gradient with its sign flipped", -float(worst["autograd"])))}
    return {"value": float(worst["rel_error"]), "rows": len(f), "nulls": nulls,
            "text": f"autograd {worst['autograd']:.4g} vs finite differences {fd:.4g} along a "
                    f"{worst['direction']} direction: relative error {worst['rel_error']:.2g} (worst of {len(f)})"}


@measure
def verbal_zero_shot(specimen: Path, claim: dict) -> dict:
    """Final-answer accuracy on the verbal surfaces read without verbal training: the depth matrices of the
    specimen's `results` folders (one per surface, `claim["surfaces"]`), pooled over depths."""
    per, major, guess = {}, {}, {}
    for surface, results in claim["surfaces"].items():
        f = _table(specimen, "depth_matrix", results)
        f = f[f["loop"] == f["depth"]]
        per[surface], major[surface] = (int(f["correct"].sum()), len(f)), (_majority(f), len(f))
        [guess[surface]] = chance([per[surface]], f["target"].nunique())
    sym = _table(specimen, "depth_matrix")       # the floor: the same model on its own symbolic rows
    sym = sym[(sym["loop"] == sym["depth"]) & sym["depth"].isin(claim["competence_depths"])]
    competence, null_competence = float(sym["correct"].mean()), _majority(sym) / len(sym)
    text = lambda per, c: ("; ".join(f"{s} {k}/{n} ({k / n:.1%})" for s, (k, n) in per.items())  # noqa: E731
                           + f"; symbolic rows at depths {claim['competence_depths'][0]}-"
                             f"{claim['competence_depths'][-1]} {c:.2f}")
    return {"counts": list(per.values()), "rows": sum(n for _, n in per.values()), "competence": competence,
            "text": text(per, competence),
            "nulls": {MAJORITY: {"kind": MAJORITY_KIND, "counts": list(major.values()), "competence": null_competence,
                                 "text": text(major, null_competence)},
                      "chance (a uniform guess over the answers each surface reads)": {
                          "kind": CHANCE, "counts": list(guess.values()), "competence": 1 / sym["target"].nunique(),
                          "text": text(guess, 1 / sym["target"].nunique())}}}


# ----------------------------------------------------------------------------- tests
@verdict_test
def counts_not_worse(claim: dict, ours: dict) -> tuple[str, str]:
    """Per count pair: one-sided Fisher that ours is below the paper's; reproduced when none is at p < 0.05."""
    pairs = list(zip(claim["paper_counts"], ours["counts"]))
    ps = [fisher(k, n, pk, pn, alternative="less") for (pk, pn), (k, n) in pairs]
    worst = min(range(len(ps)), key=ps.__getitem__)
    (pk, pn), (k, n) = pairs[worst]
    how = f"one-sided Fisher, ours below the paper: smallest p = {ps[worst]:.3g} ({k}/{n} vs {pk}/{pn})"
    bar = claim.get("min_share", INSTALL_BAR)   # a floor: "not significantly worse" on a few rows is not installed
    low = [f"{k}/{n}" for k, n in ours["counts"] if k / n < bar]
    if low:
        how += f"; below the installation bar {bar:g}: {', '.join(low)}"
    return ("reproduced" if ps[worst] >= ALPHA and not low else "not reproduced"), how


@verdict_test
def iterate_not_worse(claim: dict, ours: dict) -> tuple[str, str]:
    """Iterate share not below the paper's and park share not above it (one-sided Fisher each)."""
    (pk, pn), (k, n) = claim["paper_counts"][0], ours["counts"][0]
    p_it = fisher(k, n, pk, pn, alternative="less")
    (pp, ppn), (park, m) = claim["paper_park"], ours["park"]
    p_park = fisher(park, m, pp, ppn, alternative="greater")
    ok = p_it >= ALPHA and p_park >= ALPHA
    return ("reproduced" if ok else "not reproduced"), (f"one-sided Fisher: iterate below the paper's p = {p_it:.3g}; "
                                                         f"park above it p = {p_park:.3g}")


@verdict_test
def ratio_in_band(claim: dict, ours: dict) -> tuple[str, str]:
    lo, hi = claim["paper_band"]
    a, b = ours["range"]
    ok = a <= hi and b >= lo
    return ("reproduced" if ok else "not reproduced"), \
        f"ours spans {a:.2f}-{b:.2f} over the bars 0.60-0.80; the paper's band is {lo:.2f}-{hi:.2f}"


@verdict_test
def exactly_zero(claim: dict, ours: dict) -> tuple[str, str]:
    return ("reproduced" if ours["value"] == 0.0 else "not reproduced"), "exact: max |Δlogit| must be 0.0"


@verdict_test
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


@verdict_test
def no_per_row_depth(claim: dict, ours: dict) -> tuple[str, str]:
    """The negative of Sec. 12: no head chooses a per-row depth, i.e. every head's Spearman(stopping loop, depth) is
    below `max_spearman` (undefined counts as 0: one global depth) and it stops exactly at d on fewer than
    `max_at_depth` of rows."""
    rmax, amax, cmax = claim["max_spearman"], claim["max_at_depth"], claim.get("max_modal", 0.9)
    chooses = [m for m, v in ours["methods"].items() if (v["spearman"] or 0.0) >= rmax or v["at_depth"] >= amax]
    varies = [m for m, v in ours["methods"].items() if v["modal_share"] < cmax]   # a floor: some head tried
    ok = not chooses and bool(varies)
    return ("reproduced" if ok else "not reproduced"), \
        (f"bars: Spearman < {rmax:g} and at d < {amax:.0%} for every head, and at least one head spreading its stops "
         f"(under {cmax:.0%} at its modal loop); "
         + ("no head chooses a per-row depth" if not chooses else f"per-row depth chosen by {', '.join(chooses)}")
         + (f"; spreading: {', '.join(varies)}" if varies else "; every head stops at one loop: nothing was tried"))


@verdict_test
def shares_at_least(claim: dict, ours: dict) -> tuple[str, str]:
    """Each declared splice cell reaches `bar` on its declared share (`cells`: {"site/span": share}) at every k0."""
    bar = claim["bar"]
    short = [f"{k} {ours['want'][k.rsplit('/', 1)[0]]} {v[ours['want'][k.rsplit('/', 1)[0]]]:.2f}"
             for k, v in ours["per"].items() if v[ours["want"][k.rsplit("/", 1)[0]]] < bar]
    return ("reproduced" if not short else "not reproduced"), \
        (f"bar {bar:g} on " + ", ".join(f"{c}: {sh}" for c, sh in ours["want"].items())
         + (f"; below it: {'; '.join(short)}" if short else "; every k0 reaches it"))


@verdict_test
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


@verdict_test
def above_null_every_loop(claim: dict, ours: dict) -> tuple[str, str]:
    """Retrieval concentration above its null p95 at every loop read."""
    below = [t for t, v in ours["per"].items() if v["concentration"] <= v["null_p95"]]
    return ("reproduced" if not below else "not reproduced"), \
        (f"concentration above the null p95 at {len(ours['per']) - len(below)} of {len(ours['per'])} loops"
         + (f"; not at loop {', '.join(map(str, below))}" if below else "")
         + f"; the top head changes with the loop: {'yes' if len(ours['top_heads']) > 1 else 'no'}")


@verdict_test
def drift_distinguishable_not_concentrated(claim: dict, ours: dict) -> tuple[str, str]:
    """Drift distinguishable from random partitions (top-3 share above the null p95 at a majority of loops) and
    below the concentration bar (`bar`, the share at which a few heads would carry the drift) at every loop."""
    n, above = len(ours["per"]), len(ours["above"])
    top = max(v["share"] for v in ours["per"].values())
    ok = above * 2 > n and top < claim["bar"]
    return ("reproduced" if ok else "not reproduced"), \
        (f"above the null p95 at {above} of {n} loops (majority needed); largest top-3 share {top:.3f} "
         f"(bar {claim['bar']:g})")
