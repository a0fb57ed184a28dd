"""Paper 002's (RecurTrace's) measures and verdict tests, each registered where it is written (`@measure`,
`@verdict_test`): the halting head against fixed depths (gated on the Stage 1 model parking), real early exit,
memory against plain looping (gated on the best rule with no model), and block selection (the recommendation
against the trained windows, and the window sweep's ablation)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd

from workbench.analysis.claims.halting_checks import (
    _envelope_interval,
    envelope_mix,
    gradients_alive,
    head_moved,
)
from workbench.analysis.claims.ledger import (
    ALPHA,
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
from workbench.analysis.claims.nulls import (
    FIXED,
    PARKS,
    PROMPT,
    UNTRAINED,
    modal_share,
    parked,
    prompt_matches_oracle,
    stop_policies,
)
from workbench.analysis.claims.rules import _a_ahead
from workbench.analysis.headlines import ranges
from workbench.analysis.stats import PairedCounts, paired_counts, paired_difference
from workbench.defaults import INSTALL_BAR
from workbench.errors import WorkbenchError


# ----------------------------------------------------------------------------- measures
def _paired(c: PairedCounts) -> dict:
    """Paired counts of A and B right/wrong on the same rows, in B's view (as the arms comparisons), exact McNemar."""
    return {"n": c.n, "a_correct": c.a_correct, "b_correct": c.b_correct, "b_helped": c.helped, "b_hurt": c.hurt,
            "p_mcnemar": c.p_mcnemar}


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
    support = _summary(spec).get("checkpoint", {}).get("support")
    diag = _table(spec, "depth_matrix") if support else None
    lost = []
    if diag is not None:   # parking is only half the gate: loops = depth must stay installed at every trained depth
        diag = diag[(diag["loop"] == diag["depth"]) & (diag["depth"] <= support)]
        lost = [f"depth {int(k)}: {g['correct'].mean():.2f}" for k, g in diag.groupby("depth")
                if g["correct"].mean() < INSTALL_BAR]
    return {"park": park, "n": n, "share": park / n if n else 0.0, "bar": bar, "lost": lost,
            "text": f"the Stage 1 model ({Path(claim['stage1']).name}) parks on {park}/{n} ({park / max(n, 1):.1%}) of "
                    f"the overshoot cells where iterate and park differ"}


def _stage1_gate(ours: dict, claim: dict) -> dict:
    """RecurTrace's head detects that the answer has settled; on a Stage 1 model that keeps iterating past d
    a fixed depth k is right only on depth-k rows and a head must count to the stated depth instead."""
    parks = stage1_parks(claim)
    if parks is not None:
        ours["stage1"] = parks
        if parks["lost"]:
            _gate(ours, f"the Stage 1 model ({Path(claim['stage1']).name}) has lost loops = depth below the "
                        f"installation bar {INSTALL_BAR:g} ({', '.join(parks['lost'])}): a model that parks on a wrong answer "
                        "passes the park share alone")
        if parks["share"] < parks["bar"]:
            _gate(ours, f"{parks['text']} (bar {parks['bar']:.2f}): it iterates the rule past a row's depth instead of "
                        "holding the answer, so a fixed depth k is right only on depth-k rows (where the fixed-depth "
                        "curve peaks is set by the manifest's depth mix) and a halting head must count to the depth "
                        "stated in the prompt rather than detect a settled answer, which is what RecurTrace's head does")
    return ours


@measure
def halting_fixed_peak(specimen: Path, claim: dict) -> dict:
    """Accuracy of every fixed depth on the reported rows, and the best fixed depth (chosen on calibration rows).

    Null: a model that parks (each row holds the first answer it got right, so its curve rises and stays flat),
    read against the model's best fixed depth on the same rows. Gate: the prompt-reading policy (`_prompt_gate`)."""
    curve, chosen = _halting(specimen, claim)
    fixed = curve[curve["method"] == "fixed_k"].sort_values("mean_loops")
    best = int(fixed[fixed["chosen"]]["mean_loops"].iloc[0])
    by_k = {int(r.mean_loops): float(r.accuracy) for r in fixed.itertuples()}
    n = int(fixed["n"].iloc[0])
    budget = max(by_k)
    head = _pick(chosen, "fixed_k")
    rows = _per_row_fixed(specimen, claim, head.index).astype(bool)
    parks = parked(rows)
    out = {"best": best, "by_k": by_k, "rows": n, "budget": budget,
           "fall": _paired(paired_counts(rows[best], rows[budget])),
           "nulls": {"a model that parks (each row holds the first answer it got right)": {
               "kind": PARKS, "best": best, "budget": budget, "by_k": {int(k): float(parks[k].mean()) for k in parks},
               "fall": _paired(paired_counts(rows[best], parks[budget])),
               "text": f"right on {int(parks[budget].sum())}/{n} at k = {budget} against the model's k = {best} "
                       f"{int(rows[best].sum())}/{n}"}},
           "text": f"fixed depth k = 1..{max(by_k)}: " + ", ".join(f"{v:.2f}" for v in by_k.values())
                   + f" ({n} reported rows); best k on the calibration rows: {best} ({by_k[best]:.3f})"}
    policies = _stop_nulls(specimen, claim, chosen, head, rows)
    _prompt_gate(out, chosen, policies)
    return _stage1_gate(out, claim)


def _stop_nulls(specimen: Path, claim: dict, chosen: pd.DataFrame, head: pd.DataFrame, rows: pd.DataFrame,
                comparator: int | None = None) -> dict[str, tuple[str, pd.DataFrame]]:
    """The stopping policies a halting or exit rule reads as nulls (`nulls.stop_policies`), on the head's rows: the
    prompts from the manifest the results read, the untrained exit (`claim["null"]`, default "confidence")."""
    results, root = claim.get("results", "halting"), claim.get("_root", ROOT)
    prompts = pd.Series({i: r.get("prompt", "") for i, r in _manifest_rows(specimen, results, root).items()})
    if head.index.difference(prompts.index).size:
        raise Missing(f"the manifest {specimen.name}/{results} read lacks some of its reported rows")
    name = claim.get("null", "confidence")
    return stop_policies(head, rows, prompts, _pick(chosen, name), name, comparator)


def _prompt_gate(out: dict, chosen: pd.DataFrame, policies: dict[str, tuple[str, pd.DataFrame]]) -> None:
    """Not comparable where the prompt-reading policy, which knows only the depth the prompt states, is right on
    every row the oracle (each row's first right loop) is: where to stop is written in the prompt, so the setting
    decides what any stopping rule reads here."""
    if not (chosen["method"] == "oracle").any():
        return
    [prompt] = [p for kind, p in policies.values() if kind == PROMPT]
    oracle = _pick(chosen, "oracle")
    if prompt_matches_oracle(prompt, oracle):
        n = len(prompt)
        _gate(out, f"the prompt states each row's depth, and the prompt-reading policy (no model) is right on "
                   f"{int(prompt['correct'].sum())}/{n} rows at {float(prompt['loops'].mean()):.2f} loops, every row "
                   f"the oracle is right on ({int(oracle.loc[prompt.index, 'correct'].sum())}/{n}): where to stop is "
                   "written in the prompt, so the setting, not a model, decides this row")


def _per_row_fixed(specimen: Path, claim: dict, index: pd.Index) -> pd.DataFrame:
    """Correctness [row, loop] of every fixed depth on the given reported rows (`halting__rows`, the model's head)."""
    rows = _table(specimen, "halting__rows", claim.get("results", "halting"))
    rows = rows[rows["head"] == "head"]
    wide = rows.pivot_table(index="row_id", columns="loop", values="correct_answer", aggfunc="first")
    missing = index.difference(wide.index)
    if len(missing):
        raise Missing(f"halting__rows lacks {len(missing)} of the reported rows")
    return wide.loc[index].astype(float)


@measure
def halting_head_vs_fixed(specimen: Path, claim: dict) -> dict:
    """The distilled head at its chosen threshold against the best fixed depth, paired on the reported rows.

    Beside the paired counts: the paired difference head − fixed with Newcombe's 95% interval, the best
    constant-depth policy at the head's own mean loops (`constant_envelope`) with the row-by-row interval of the
    head's lead over it, and the rank correlation of the head's stopping loop with the row's depth. Nulls: heads
    that stop every row at loop 1 and at the best fixed depth (the same readings from the same rows)."""
    curve, chosen = _halting(specimen, claim)
    head, fixed = _pick(chosen, claim.get("method", "head")), _pick(chosen, "fixed_k")
    fixed = fixed.loc[head.index]
    k = int(fixed["loops"].iloc[0])
    by_k = {int(r.mean_loops): float(r.accuracy) for r in curve[curve["method"] == "fixed_k"].itertuples()}
    rows = _per_row_fixed(specimen, claim, head.index)
    b = fixed["correct"].astype(bool)
    ceiling, oracle_acc = "", None
    if (chosen["method"] == "oracle").any():      # the first right loop: what a perfect head would reach
        o = _pick(chosen, "oracle").loc[head.index]
        oracle_acc = float(o["correct"].mean())
        ceiling = f"; the oracle {int(o['correct'].sum())}/{len(o)} at {float(o['loops'].mean()):.2f} loops"
    out = _head_reading(head, b, k, by_k, rows, f"head (tau = {head['threshold'].iloc[0]:g})", ceiling)
    out["tau"] = float(head["threshold"].iloc[0])
    policies = _stop_nulls(specimen, claim, chosen, head, rows, comparator=k)
    out["nulls"] = {name: _null_reading(_head_reading(p, b, k, by_k, rows, name, ""), kind)
                    for name, (kind, p) in policies.items()}
    if claim.get("rank_heads"):
        out["ordering"] = _ordering(chosen, claim.get("method", "head"), rows, by_k, head.index)
        out["text"] += f"; {out['ordering']['text']}"
    gap = claim.get("min_oracle_gap")   # a computed gate: can any stopping rule beat the best fixed depth here?
    if gap is not None and oracle_acc is not None and oracle_acc - float(b.mean()) < gap:
        _gate(out, f"the oracle (the first right loop of every row) reads {oracle_acc:.3f} against the best fixed "
                   f"depth's {float(b.mean()):.3f} on these rows, less than {100 * gap:g} points above it: no stopping "
                   "rule can beat the best fixed depth by more here, so the setting fixes the verdict")
    _prompt_gate(out, chosen, policies)
    return _stage1_gate(out, claim)


def _null_reading(r: dict, kind: str) -> dict:
    """A stopping policy's `_head_reading` as a null: its kind, and its text cut to what the rule compares."""
    p, (d, lo, hi), (e, elo, ehi) = r["compared"], r["diff"], r["envelope_diff"]
    return {**r, "kind": kind,
            "text": f"{p['a_correct']}/{p['n']} at {r['head_loops']:.2f} loops (it alone right on {p['b_hurt']}, "
                    f"fixed k = {r['best_k']} alone on {p['b_helped']}); − fixed {100 * d:+.1f} points [{100 * lo:+.1f}, "
                    f"{100 * hi:+.1f}]; − the constant-depth envelope {100 * e:+.1f} [{100 * elo:+.1f}, {100 * ehi:+.1f}]"}


def _ordering(chosen: pd.DataFrame, method: str, rows: pd.DataFrame, by_k: dict, index: pd.Index) -> dict:
    """Every learned head read as the row's method is (the same floor) against the constant-depth envelope at its own
    mean loops, row by row with a 95% interval, best first, and where the row's method ranks among them."""
    base = method.split("+")[0]
    suffix = method[len(base):]
    heads = [h + suffix for h in _table_heads(chosen) if (chosen["method"] == h + suffix).any()]
    ranked = []
    for m in heads:
        g = _pick(chosen, m).loc[index]
        _, _, mix = envelope_mix(by_k, float(g["loops"].mean()))
        ranked.append((m, _envelope_interval(g["correct"].astype(bool), rows, mix)))
    ranked.sort(key=lambda x: (-x[1][0], x[0]))
    above = [f"{m} {100 * d:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}]" for m, (d, lo, hi) in ranked if lo > 0]
    below = [m for m, (_, _, hi) in ranked if hi < 0]
    rank = next((i + 1 for i, (m, _) in enumerate(ranked) if m == method), None)
    d, lo, hi = dict(ranked).get(method, (float("nan"),) * 3)
    return {"heads": len(ranked), "above": len(above), "below": len(below), "rank": rank,
            "text": f"{len(ranked)} heads compared against the constant-depth envelope at each one's mean loops: "
                    f"{len(above)} above it with intervals clear of 0 ({', '.join(above) or 'none'}), {len(below)} "
                    f"below it; {method} ranks {rank} of {len(ranked)} ({100 * d:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}])"}


def _table_heads(chosen: pd.DataFrame) -> list[str]:
    """The learned heads of a halting table, in its order: every method but the fixed depths, the oracle, the
    untrained confidence exit and the floored copies."""
    return [m for m in dict.fromkeys(chosen["method"]) if "+" not in m and m not in ("fixed_k", "oracle", "confidence")]


def _head_reading(head: pd.DataFrame, b: pd.Series, k: int, by_k: dict, rows: pd.DataFrame, name: str,
                  ceiling: str) -> dict:
    """The readings `head_beats_fixed` and `head_matches_fixed_with_fewer_loops` test, for one stopping policy."""
    a, loops = head["correct"].astype(bool), float(head["loops"].mean())
    c = paired_counts(a, b)
    p, helped, hurt = _paired(c), c.helped, c.hurt
    diff = paired_difference(hurt, helped, c.both, c.neither)
    envelope, policy, mix = envelope_mix(by_k, loops)
    track = _depth_tracking(head)
    return {"compared": p, "head_loops": loops, "best_k": k, "rows": len(a),
            "head_acc": float(a.mean()), "diff": diff, "envelope": envelope, "envelope_policy": policy,
            "envelope_diff": _envelope_interval(a, rows, mix), "tracking": track,
            "text": f"{name} {p['a_correct']}/{p['n']} at {loops:.2f} loops vs "
                    f"fixed k = {k} {p['b_correct']}/{p['n']} (head alone right on {hurt}, fixed alone on {helped}); "
                    f"head − fixed {100 * diff[0]:+.1f} points [{100 * diff[1]:+.1f}, {100 * diff[2]:+.1f}]; best "
                    f"constant-depth policy at {loops:.2f} loops ({policy}) {envelope:.3f} vs the head's {a.mean():.3f}; "
                    f"{track['text']}" + ceiling}


@measure
def halting_collapse(specimen: Path, claim: dict) -> dict:
    """Each indirect head (`claim["methods"]`) at its chosen threshold: mean loops, the share stopping at loop 1, and
    the modal stopping loop with its share (a collapse to one global depth that is not loop 1 shows there).

    Null: the untrained confidence exit of the same table (`claim["null"]`, default "confidence"), read the same
    way: where it collapses too, collapse says nothing of the heads' objectives. Gate: where `claim["runs"]` names
    a head's Stage 2 run, its gradient norm over the last steps against its first (`gradients_alive`)."""
    _, chosen = _halting(specimen, claim)
    per = {m: _collapse_reading(_pick(chosen, m)) for m in claim["methods"]}
    null = claim.get("null", "confidence")
    out = {"methods": per, "rows": max(v["n"] for v in per.values()), "text": _collapse_text(per)}
    nper = {null: _collapse_reading(_pick(chosen, null))}
    out["nulls"] = {f"the untrained {null} exit": {"kind": UNTRAINED, "methods": nper, "text": _collapse_text(nper)}}
    share = claim.get("share", 0.9)
    if nper[null]["at_one"] >= share:   # the row's own comparable_when, computed
        _gate(out, f"the untrained {null} exit collapses too ({nper[null]['at_one']:.0%} of rows at loop 1): a collapse "
                   "an exit rule with no objective shows says nothing of ACT's or PonderNet's objectives")
    floor = claim.get("min_loop1")
    if floor is not None:      # the paper's regime: its explanation of collapse needs most rows solved at loop 1
        first = _pick(chosen, claim["methods"][0])
        at1 = _per_row_fixed(specimen, claim, first.index)[1].astype(bool)
        if at1.mean() < floor:
            _gate(out, f"only {int(at1.sum())}/{len(at1)} rows are right at loop 1, where the paper's account of "
                       f"collapse (the loss is already low after one loop for most items) needs at least {floor:.0%}: "
                       "the objective's pull to loop 1 is absent by design here")
    dead, still = [], []
    for m, run in claim.get("runs", {}).items():
        alive, how = gradients_alive(claim.get("_root", ROOT) / run)
        out["methods"][m]["gradients"] = how
        if not alive:
            dead.append(f"{m} ({how})")
            continue
        moved, how_far = head_moved(claim.get("_root", ROOT) / run)
        out["methods"][m]["moved"] = how_far
        if not moved:
            still.append(f"{m} ({how_far})")
    if dead:
        _gate(out, f"the gradients of {', '.join(dead)} vanished: a saturated head stops where it saturated, so its "
                   "stopping loop is not a choice its objective made")
    if still:
        _gate(out, f"{', '.join(still)} barely moved from its initialisation, so where it stops is where it started, "
                   "not what its objective chose")
    return _stage1_gate(out, claim)


def _collapse_reading(g: pd.DataFrame) -> dict:
    modal = g["loops"].value_counts()
    return {"mean_loops": float(g["loops"].mean()), "at_one": float((g["loops"] == 1).mean()),
            "modal_loop": int(modal.index[0]), "modal_share": float(modal.iloc[0] / len(g)),
            "accuracy": float(g["correct"].mean()), "threshold": float(g["threshold"].iloc[0]), "n": len(g)}


def _collapse_text(per: dict) -> str:
    return "; ".join(f"{m} (threshold {v['threshold']:g}) {v['mean_loops']:.2f} loops, {v['at_one']:.0%} of rows at "
                     f"loop 1, {round(v['modal_share'] * v['n'])}/{v['n']} at its modal loop {v['modal_loop']}, "
                     f"accuracy {v['accuracy']:.3f}" for m, v in per.items())


@measure
def early_exit_saving(specimen: Path, claim: dict) -> dict:
    """The head run through real early exit (`halting__adaptive`: rows leave the batch) against the fixed budget, in
    the same run: row-loops and wall-clock seconds, and each as a ratio to the fixed budget's."""
    f = _table(specimen, "halting__adaptive", claim.get("results", "halting")).set_index("policy")
    fixed = f"fixed_{int(f.loc['head', 'budget'])}" if "head" in f.index else None
    if fixed not in f.index:
        raise Missing("halting__adaptive holds no head and fixed-budget rows")
    h, x = f.loc["head"], f.loc[fixed]
    loops, wall = h["row_loops"] / x["row_loops"], h["wall_s"] / x["wall_s"]
    _, chosen = _halting(specimen, claim)
    head = _pick(chosen, "head")
    out = {"loop_ratio": float(loops), "wall_ratio": float(wall), "agree": float(h["agree"]), "rows": int(h["rows"]),
           "accuracy": float(h["accuracy"]), "budget_accuracy": float(x["accuracy"]),
           "stops": tuple(int(v) for v in head["loops"]),
           "text": f"head (tau = {h['tau']:g}) {int(h['row_loops'])} row-loops in {h['wall_s']:.1f} s vs {fixed} "
                   f"{int(x['row_loops'])} in {x['wall_s']:.1f} s: {loops:.2f}x the loops, {wall:.2f}x the wall-clock "
                   f"at accuracy {h['accuracy']:.3f} vs {x['accuracy']:.3f} ({h['agree']:.0%} of rows stop where the "
                   "one-pass reading says; one timing, shared CPU)"}
    # its nulls: the stopping policies of every halting rule, each timed in the same run where it was (a fixed depth
    # with no head), else costed at the budget's measured seconds per row-loop
    rows = _per_row_fixed(specimen, claim, head.index)
    per_loop = x["wall_s"] / x["row_loops"]
    policies = _stop_nulls(specimen, claim, chosen, head, rows, comparator=int(x["budget"]))
    out["nulls"] = {}
    for name, (kind, p) in policies.items():
        row_loops = int(p["loops"].sum())
        timed = f"fixed_{int(p['loops'].iloc[0])}" if kind == FIXED else None
        wall_s = float(f.loc[timed, "wall_s"]) if timed in f.index else row_loops * per_loop
        out["nulls"][name] = {
            "kind": kind, "loop_ratio": row_loops / x["row_loops"], "wall_ratio": wall_s / x["wall_s"],
            "accuracy": float(p["correct"].mean()), "budget_accuracy": float(x["accuracy"]),
            "stops": tuple(int(v) for v in p["loops"]),
            "text": f"{row_loops} row-loops, {wall_s:.1f} s ({'timed' if timed in f.index else 'at the budget rate'}), "
                    f"accuracy {p['correct'].mean():.3f}"}
    _prompt_gate(out, chosen, policies)
    return out


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


@measure
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
    frames = [_table(s, "loop_accuracy", results) for s in (specimen, root / claim["against"])]
    out = _memory_reading(specimen, claim, *frames)
    # its null: the majority answer (each depth's most frequent answer, from the manifest) in the memory arm's place
    answers = pd.Series({i: r["answer"] for i, r in _manifest_rows(specimen, results, root).items()})
    mem = frames[0][frames[0]["loop"] == frames[0]["depth"]]
    target = answers.reindex(mem["row_id"]).to_numpy()
    if pd.isna(target).any():
        raise Missing(f"{specimen.name}/{results} reads rows its manifest does not hold")
    mem = mem.assign(target=target)
    mem = mem.assign(correct=mem["target"] == mem.groupby("depth")["target"].transform(_top))
    out["nulls"] = {f"{MAJORITY} in place of the memory arm": _memory_reading(specimen, claim, mem, frames[1])}
    return out


def _memory_reading(specimen: Path, claim: dict, *frames: pd.DataFrame) -> dict:
    """`memory_vs_plain` on the two arms' loop_accuracy frames (memory, plain)."""
    results, root = claim.get("results", "loops"), claim.get("_root", ROOT)
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


# ----------------------------------------------------------------------------- tests
@verdict_test
def falls_after_peak(claim: dict, ours: dict) -> tuple[str, str]:
    """The part of "best fixed depth T = 2" a model decides: accuracy at the budget is below the best fixed depth's
    (chosen on calibration rows) on the reported rows, paired, exact McNemar p < 0.05. A model whose accuracy rises
    and stays flat (one that parks) fails it; so does a curve that never rises."""
    f = ours["fall"]
    ok = f["b_hurt"] > f["b_helped"] and f["p_mcnemar"] < ALPHA and ours["best"] < ours["budget"]
    return ("reproduced" if ok else "not reproduced"), \
        (f"best fixed depth k = {ours['best']} {f['a_correct']}/{f['n']} against the budget k = {ours['budget']} "
         f"{f['b_correct']}/{f['n']} (k = {ours['best']} alone right on {f['b_hurt']}, the budget alone on "
         f"{f['b_helped']}, exact McNemar p = {f['p_mcnemar']:.3g}): "
         + ("falls after its peak" if ok else "does not fall after its peak"))


def _beats_constant(ours: dict) -> tuple[bool, str]:
    """Whether the head is above every constant-depth policy at its own mean loops (`constant_envelope`), by a
    noise margin: the 95% interval of the row-by-row difference head − that policy lies above 0."""
    d, lo, hi = ours["envelope_diff"]
    ok = ours["head_acc"] > ours["envelope"] + 1e-12 and lo > 0
    return ok, (f"{'above' if ok else 'not above'} the best constant-depth policy at its {ours['head_loops']:.2f} "
                f"mean loops ({ours['envelope_policy']}: {ours['envelope']:.3f} vs {ours['head_acc']:.3f}), "
                f"row by row {100 * d:+.1f} points [{100 * lo:+.1f}, {100 * hi:+.1f}]")


@verdict_test
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


@verdict_test
def head_matches_fixed_with_fewer_loops(claim: dict, ours: dict) -> tuple[str, str]:
    """Non-inferiority: the paired difference head − best fixed depth has its 95% lower bound (Newcombe) above
    −`margin`, the head spends fewer mean loops than k, and it is above every constant-depth policy at its own mean
    loops (so stopping every row at one loop cannot pass)."""
    margin = claim["margin"]
    d, lo, hi = ours["diff"]
    above, how_c = _beats_constant(ours)
    fewer = ours["head_loops"] < ours["best_k"]
    ok = lo > -margin and fewer and above
    parity = _parity_low(ours["compared"])
    # "not shown": the interval clause fails, but a head exactly at parity with this discordance would fail it too,
    # and no other clause refutes the head (fewer loops, not below the envelope): these rows cannot decide the rule
    undecided = not ok and lo <= -margin and parity <= -margin and fewer and ours["envelope_diff"][2] > 0
    return ("reproduced" if ok else "not shown" if undecided else "not reproduced"), \
        (f"head − fixed k = {ours['best_k']}: {100 * d:+.1f} points, 95% CI [{100 * lo:+.1f}, {100 * hi:+.1f}] "
         f"(Newcombe, paired) against the margin −{100 * margin:g}: "
         f"{'non-inferior' if lo > -margin else 'not shown non-inferior'} (a head at parity with these "
         f"{ours['compared']['b_hurt'] + ours['compared']['b_helped']} discordant rows would read a lower bound of "
         f"{100 * parity:+.1f})"
         f"; mean loops {ours['head_loops']:.2f} vs {ours['best_k']} ({1 - ours['head_loops'] / ours['best_k']:.0%} fewer)"
         f"; {how_c}; {ours['tracking']['text']}")


def _parity_low(p: dict) -> float:
    """The lower bound of head − fixed (Newcombe, paired) for a head exactly at parity with the fixed depth with the
    same discordant rows split evenly: what the interval reads at its best with this discordance (-1 where the fixed
    depth is right on too few rows for that split)."""
    half = (p["b_hurt"] + p["b_helped"]) / 2
    both = p["b_correct"] - half          # the fixed depth keeps its rows: half of them discordant
    if both < 0 or p["n"] - both - 2 * half < 0:
        return -1.0
    return paired_difference(half, half, both, p["n"] - both - 2 * half)[1]


@verdict_test
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


@verdict_test
def wall_below_fixed(claim: dict, ours: dict) -> tuple[str, str]:
    """Real early exit saves wall-clock time: below `bar` times the fixed budget's (the loop ratio beside it), by an
    exit that is one: rows leave at more than one loop (under `max_modal`, default 0.9, at the modal stopping loop)
    and the exit's accuracy is not below the budget's, so a fixed shallower depth (no head) does not pass."""
    cmax = claim.get("max_modal", 0.9)
    fast = ours["wall_ratio"] < claim["bar"]
    modal = modal_share(ours["stops"])       # read from the stops, never written in
    spread = modal < cmax
    kept = ours["accuracy"] >= ours["budget_accuracy"]
    return ("reproduced" if fast and spread and kept else "not reproduced"), \
        (f"wall-clock {ours['wall_ratio']:.2f}x the fixed budget's at {ours['loop_ratio']:.2f}x its loops (bar: "
         f"below {claim['bar']:g}x); {modal:.0%} of rows at the modal stopping loop (under {cmax:.0%} "
         f"needed: an exit per row); accuracy {ours['accuracy']:.3f} against the budget's {ours['budget_accuracy']:.3f}"
         + ("" if kept else " (below it)"))


@verdict_test
def a_not_ahead(claim: dict, ours: dict) -> tuple[str, str]:
    """A (the specimen) not ahead of B: the negation of `a_leads` (level, or B ahead)."""
    ahead, how = _a_ahead(ours["compared"])
    return ("not reproduced" if ahead else "reproduced"), how
