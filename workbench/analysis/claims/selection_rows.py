"""Both papers' block-selection rows: `select-block`'s recommended window against the windows that were trained
(did the recommendation install?), and RecurTrace App. B's short-training ablation (the window sweep,
`select-block --window-sweep`): the trained ranking, its margin and the windows outside the angular span. Each
reading carries its nulls (the candidate ranked last named instead; a trainer that tells no window apart; a window
outside the span named the winner). Registered where written (`@measure`, `@verdict_test`), as `retrofit`'s and
`recurtrace`'s; the recorded recipe (`recorded_recipe`) is read here as data."""

from __future__ import annotations

import json
from pathlib import Path

from workbench.analysis.claims.ledger import ROOT, Missing, _gate, measure, verdict_test
from workbench.defaults import MAX_DROP_POINTS, OLD_SWEEP_TABLE, REHEARSAL_SOURCES, SWEEP_TABLE
from workbench.readers import read_json, read_toml, under_old_name


# ----------------------------------------------------------------------------- measures
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
# (`workbench.train.recipe`) fills in for it, the setting such a run trained with (read from `workbench.defaults`
# where that states it); tests/test_claims.py holds every committed recipe.toml, filled so, to the training recipe's
# own reading of it.
RECORDED_LATER = {
    "init_from": "",
    "model": {"loop_codes": False},
    "train": {"precision": "fp32", "compile": False},
    "guardrail": {"enabled": True, "max_drop": MAX_DROP_POINTS, "every": 0},
    "preserve": {"kl_weight": 0.0, "rows": 8, "positions": 8, "sources": list(REHEARSAL_SOURCES)},
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


@measure
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
    # its null: the candidate the selection ranks last, named in its place (the angular ranking turned over)
    last = max(sel["windows"], key=lambda w: w["rank"])["block"]
    null_runs = [{**r, "shared": max(0, min(int(r["block"].split(":")[1]), last[1])
                                     - max(int(r["block"].split(":")[0]), last[0]))} for r in runs]
    ours = {"nulls": {f"the candidate ranked last ({last[0]}:{last[1]}) in its place": {
                "runs": null_runs, "text": "; ".join(f"{r['block']}: {r['shared']} layers shared" for r in null_runs)}},
            "recommended": f"{lo}:{hi}", "runs": runs, "rows": len(runs),
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


@measure
def window_sweep_ablation(specimen: Path, claim: dict) -> dict:
    """The window sweep (its table and block_selection.json under `results`): the trained ranking, the
    recommendation's margin over the runner-up, and each window outside the angular span against it (a claims file
    naming this measure `stage2_ablation`, its old name, reads: `ledger.OLD_MEASURES`)."""
    folder = specimen / claim.get("results", ".")
    path = under_old_name(folder, SWEEP_TABLE, OLD_SWEEP_TABLE)
    if not path.is_file():
        raise Missing(f"no {path.relative_to(specimen.parent)} (workbench select-block --window-sweep --out ...)")
    record = read_json(path, "window sweep table")
    sel = read_json(folder / "block_selection.json", "block selection")
    lo, hi = sel["prelude_end"], sel["coda_start"]
    table = record["table"]
    outside = [{"window": r["window"], "role": r["role"], "vs": r.get("vs_recommended")}
               for r in table if not _inside(r["window"], lo, hi)]
    m = record.get("margin") or {}
    diff = m.get("ce_difference") or {}
    # its nulls: a trainer that tells no window apart (every window at the winner's CE: nothing separated, nothing
    # behind) and each window outside the span named the winner (a sweep whose ranking is its late control)
    flat = [{**o, "vs": {"value": 0.0, "low": 0.0, "high": 0.0}} for o in outside]
    nulls = {"a trainer that tells no window apart": {
        "recommended": record.get("recommended"), "span": f"{lo}:{hi}",
        "recommended_in_span": record.get("recommended") is not None and _inside(record["recommended"], lo, hi),
        "separated": False, "margin_why": "every window at the same CE", "outside": flat,
        "text": "every window's held-out CE equal"}}
    for o in outside:
        nulls[f"{o['window']} ({o['role']}) named the winner"] = {
            "recommended": o["window"], "span": f"{lo}:{hi}", "recommended_in_span": False,
            "separated": bool(m.get("separated")), "margin_why": m.get("why", ""), "outside": outside,
            "text": f"{o['window']} first"}
    return {"nulls": nulls, "recommended": record.get("recommended"), "span": f"{lo}:{hi}",
            "recommended_in_span": record.get("recommended") is not None and _inside(record["recommended"], lo, hi),
            "separated": bool(m.get("separated")), "margin_why": m.get("why", ""), "outside": outside,
            "rows": sum(r.get("heldout_ce", {}).get("rows", 0) for r in table[:1]),
            "text": f"{record['budget']}; " + ", ".join(
                f"{r['rank']}. {r['window']} ({r['role']}) CE {r['heldout_ce']['value']:.3f}"
                for r in table if r.get("heldout_ce")) + (
                f"; margin over the runner-up {diff['value']:+.3f} nats [{diff['low']:+.3f}, {diff['high']:+.3f}]"
                if diff else "")}


# ----------------------------------------------------------------------------- tests
@verdict_test
def recommendation_installs(claim: dict, ours: dict) -> tuple[str, str]:
    """The recommended window shares more layers with every trained window that installed than with any that did
    not; not comparable (gate, in the claim) while fewer than one installing and one failing window share a recipe."""
    good = [r["shared"] for r in ours["runs"] if r["installed"]]
    bad = [r["shared"] for r in ours["runs"] if not r["installed"]]
    ok = bool(good) and (not bad or min(good) > max(bad))
    return ("reproduced" if ok else "not reproduced"), \
        (f"layers shared with the recommendation: installed {good or 'none'}, not installed {bad or 'none'}")


@verdict_test
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
