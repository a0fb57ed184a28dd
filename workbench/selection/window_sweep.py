"""The window sweep (RecurTrace App. B's second stage of block selection): candidate windows, one short run each.

Stage 1 (`workbench.selection.stage1`) finds the loopable span from the angular-distance curve and
ranks windows in it by the damage an *untrained* loop 2 does. That ranking says which window is
least disturbed by looping, not which window learns to loop. RecurTrace's second stage "compares
compact three-layer windows inside or near the span by downstream behavior": every candidate is
trained for the same short budget and ranked by held-out likelihood and accuracy. This module is
that sweep:

- `candidates`: windows of Stage 1's size spread evenly over the span (Stage 1's recommendation
  among them), a late control (the last layers of the model, past the span when it ends early)
  and any windows the user names (the window a specimen was trained at, say).
- `sweep_recipe`: one short recipe for all of them: the first `steps` steps of a curriculum
  (default the keeper's, `smollm2_lora_chase`: 60 steps at depth 1, then depths 1-2), guardrail
  and preservation as that recipe says, the window as the only difference.
- `read_candidate`: each finished run read on fresh held-out rows (disjoint from the run's own
  evaluation rows): per-row cross-entropy over the symbols at every loop t <= d, and accuracy.
- the ranking (`workbench.selection.ranking`): the rule, fixed before any run reads it; the top two get a second
  seed. Candidates are ordered by held-out CE, a candidate the guardrail stopped last (with `--rank-cells iterate`,
  on the cells that need iterating only: rows of depth >= 2, loops 2 <= t <= d, so a window that learns the single
  lookup quickest but not to iterate cannot lead on the primitive's cells). The recommendation is the first; its
  margin over the second is the paired per-row CE difference with a bootstrap interval, each row's CE averaged over
  the seeds both were trained with, and it is *separated* when that interval excludes 0 and every seed pair orders
  the two the same way; otherwise the sweep says the two are not separated at this budget and reports both.

This module is the orchestration: the candidates, the short recipe, the runs, the readings and the files.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from workbench import runs
from workbench.analysis.stats import paired_bootstrap
from workbench.defaults import SWEEP_TABLE
from workbench.errors import WorkbenchError
from workbench.io import sha256_bytes, write_json_atomic
from workbench.models.bases import load_base
from workbench.places import SWEEP, holds_sweep  # noqa: F401  (importers keep taking them from here)
from workbench.readers import read_json, read_toml
from workbench.selection.ranking import agreement, cells_key, margin, order, summarize
from workbench.selection.stage1 import split_texts, task_rows, window_ablation
from workbench.tasks import build_rows
from workbench.train.build import task_options
from workbench.train.losses import make_batch
from workbench.train.recipe import Recipe, apply_overrides, dumps
from workbench.train.trainer import STOPPED_BY_GUARDRAIL, Trainer

DEFAULT_RECIPE = "smollm2_lora_chase"   # the keeper's curriculum: its first stages are the short recipe
DEFAULT_STEPS = 200
DEFAULT_CANDIDATES = 4                  # windows inside the span (the late control and --include come on top)
SEEDS = 2                               # the top two are trained with this many seeds
RANK_PER_DEPTH = 128                    # fresh held-out rows per depth for the ranking read
RANK_FIRST_INDEX = 10_000               # their row indices: disjoint from the runs' own evaluation rows (0..per_depth)
# SWEEP (sweep.json, the sweep's plan: what a --resume must match) and `holds_sweep` are declared in `workbench.places`,
# and the sweep's output kind (`SWEEP_OUTPUT`) in `workbench.guard.in_place`, which every output guard asks to recognise
# its own before any output whatever the writer.
TABLE = SWEEP_TABLE                     # the table, the ranking and the recommendation (a sweep made before the
                                        # name holds it as stage2.json: `defaults.OLD_SWEEP_TABLE`, read)
RUNS = "runs"                           # one run directory per (window, seed)
READINGS = "readings"                   # one ranking read per finished run (a resumed sweep does not re-read)
DAMAGE = "damage.json"                  # Stage 1's untrained loop-2 damage of every candidate, for the agreement


@dataclass(frozen=True)
class Candidate:
    """A window to train: layers a..b-1 looped, and why it is in the sweep."""

    a: int
    b: int
    role: str   # "span" (Stage 1's evenly spread windows), "late control", "given"

    @property
    def name(self) -> str:
        return f"{self.a}:{self.b}"

    def run_name(self, seed_index: int) -> str:
        return f"{self.a}-{self.b}-seed{seed_index + 1}"


# ------------------------------------------------------------------ the candidates
def parse_window(text: str, n_layers: int) -> tuple[int, int]:
    """Returns (a, b) from "A:B", checked against the model's layers (one-line errors)."""
    parts = str(text).split(":")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise WorkbenchError(f"window '{text}' is not of the form A:B with integers (e.g. 12:24)")
    a, b = (int(p) for p in parts)
    if not 0 <= a < b <= n_layers:
        raise WorkbenchError(f"window {a}:{b} lies outside the model ({n_layers} layers); need 0 <= A < B <= {n_layers}")
    return a, b


def candidates(selection: dict, n: int = DEFAULT_CANDIDATES, include=(), late: bool = True) -> list[Candidate]:
    """Returns the sweep's windows for a Stage 1 record (block_selection.json's keys).

    `n` windows of `selection["window"]` layers with starts spread evenly over the span, the start
    nearest Stage 1's recommendation replaced by it (so the untrained ranking's choice is always
    trained); then the late control, the model's last k layers (left out when it is already one of
    them); then each window in `include` ("A:B", any size), in order, duplicates dropped.
    """
    if not isinstance(n, int) or n < 1:
        raise WorkbenchError(f"--candidates {n!r} is not accepted; give an integer >= 1")
    lo, hi, k, n_layers = selection["prelude_end"], selection["coda_start"], selection["window"], selection["n_layers"]
    if hi - lo < k:
        raise WorkbenchError(f"the span {lo}:{hi} ({hi - lo} layers) is too narrow for windows of {k} layers")
    last = hi - k
    starts = sorted({round(lo + i * (last - lo) / (n - 1)) for i in range(n)} if n > 1 else {lo})
    if len(starts) < n and last - lo + 1 < n:
        raise WorkbenchError(f"--candidates {n}: the span {lo}:{hi} holds only {last - lo + 1} windows of {k} layers")
    rec = tuple(selection["recommended"])
    if rec[1] - rec[0] == k and rec[0] not in starts:
        nearest = min(starts, key=lambda s: (abs(s - rec[0]), s))
        starts = sorted({*(s for s in starts if s != nearest), rec[0]})
    out = [Candidate(s, s + k, "span") for s in starts]
    if late and all((c.a, c.b) != (n_layers - k, n_layers) for c in out):
        out.append(Candidate(n_layers - k, n_layers, "late control"))
    for text in include:
        a, b = parse_window(text, n_layers)
        if all((c.a, c.b) != (a, b) for c in out):
            out.append(Candidate(a, b, "given"))
    return out


# ------------------------------------------------------------------ the short recipe
def sweep_recipe(base_raw: dict, model: str, window: Candidate, steps: int, seed_index: int) -> Recipe:
    """Returns the short recipe for one candidate: `base_raw`'s first `steps` steps at `window`.

    Only the name, the base model, the block, the seed (the recipe's + seed_index) and the stages
    (cut after `steps` steps; depths past the last kept stage leave the evaluation) change; the
    optimizer's schedule then spans the short run, and guardrail, preservation, LoRA and task are
    the recipe's own.
    """
    if not isinstance(steps, int) or steps < 1:
        raise WorkbenchError(f"--steps {steps!r} is not accepted; give a training budget >= 1 step")
    raw = apply_overrides(base_raw, {})
    kept, left = [], steps
    for stage in raw.get("stages", []):
        if left <= 0:
            break
        take = min(int(stage.get("steps", 100)), left)
        kept.append({**stage, "steps": take})
        left -= take
    if left > 0:
        raise WorkbenchError(f"--steps {steps}: the recipe has only {steps - left} steps of stages")
    depths = sorted({d for s in kept for d in s.get("depths", [1])})
    # the runs keep the name the sweep's runs had before it was the window sweep: a partial run resumes only under
    # the recipe it was trained from, and the committed sweep's runs were named so
    raw.update(name=f"stage2-{window.run_name(seed_index)}", seed=int(raw.get("seed", 0)) + seed_index,
               init_from="", stages=kept)
    raw.setdefault("model", {}).update(base=model, block=window.name)
    ev = raw.setdefault("eval", {})
    ev.update(depths=[d for d in ev.get("depths", depths) if d in depths] or depths, every=steps)
    return Recipe.from_dict(raw)


def base_recipe(path: Path) -> dict:
    """The raw TOML of the curriculum the sweep cuts short (validated as a recipe here)."""
    raw = read_toml(path, "recipe")
    Recipe.from_dict(raw)
    return raw


# ------------------------------------------------------------------ the ranking read
def ranking_rows(recipe: Recipe, tokenizer) -> list[dict]:
    """Fresh held-out rows for the ranking: the run's task at its trained depths, indices past its own eval rows."""
    depths = sorted({d for s in recipe.stages for d in s.depths})
    return build_rows(recipe.task.name, depths, RANK_PER_DEPTH, recipe.eval.seed, split="test",
                      first_index=RANK_FIRST_INDEX, **task_options(recipe.task, tokenizer))


def read_candidate(looped, tokenizer, rows: list[dict], batch_size: int = 32) -> dict:
    """Per-row held-out CE and correctness at every loop t <= d, read once to each row's depth.

    Returns {"row_ce": [R] mean CE over the row's loops 1..d, "row_ce_iterate": [R_2] the same over loops 2..d for
    the rows of depth >= 2, "ce": {depth: {loop: mean CE}},
    "acc": {depth: {loop: accuracy}}, "correct": {depth: {loop: [R_d] 0/1}}, "rows": R}.
    """
    looped.eval()
    row_ce, row_ce_iterate, ce, acc, correct = [], [], {}, {}, {}
    with torch.no_grad():
        for depth in sorted({r["depth"] for r in rows}):
            subset = [r for r in rows if r["depth"] == depth]
            per_loop_ce, per_loop_ok = [], []
            for i in range(0, len(subset), batch_size):
                batch = make_batch(subset[i:i + batch_size], tokenizer, device=next(looped.parameters()).device)
                r = looped.read(batch["input_ids"], attention_mask=batch["attention_mask"], loops=depth,
                                candidates=batch["candidates"])
                logp = r.scores[:, :, -1, :].float().log_softmax(-1)                  # [B, T, N]
                targets = batch["targets"][:, :depth]
                per_loop_ce.append(-logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1))
                per_loop_ok.append((logp.argmax(-1) == targets).float())
            nll, ok = torch.cat(per_loop_ce).double(), torch.cat(per_loop_ok)
            row_ce += nll.mean(1).tolist()
            if depth >= 2:
                row_ce_iterate += nll[:, 1:].mean(1).tolist()
            key = str(depth)
            ce[key] = {str(t + 1): round(float(nll[:, t].mean()), 6) for t in range(depth)}
            acc[key] = {str(t + 1): round(float(ok[:, t].mean()), 6) for t in range(depth)}
            correct[key] = {str(t + 1): ok[:, t].int().tolist() for t in range(depth)}
    return {"row_ce": row_ce, "row_ce_iterate": row_ce_iterate, "ce": ce, "acc": acc, "correct": correct, "rows": len(row_ce)}


# ------------------------------------------------------------------ files
def plan(selection_sha: str, model: str, recipe_path: str, recipe_sha: str, steps: int, cands: list[Candidate],
         seeds: int, cells: str = "all") -> dict:
    """sweep.json: what the sweep trains and how it ranks; a --resume must ask for the same. A sweep ranked on every
    cell (the default, and every sweep made before `cells` existed) records no `cells` key."""
    cells_key(cells)
    over = ("the rows' loops t <= d" if cells == "all" else
            "the rows of depth >= 2, their loops 2 <= t <= d (the cells that need iterating)")
    # the format keeps the name it had before the window sweep had its own: committed plans say it, and resume
    record = {"format": "workbench-stage2-v1", "model": model, "block_selection_sha256": selection_sha,
              "recipe": recipe_path, "recipe_sha256": recipe_sha, "steps": steps, "seeds": seeds,
              "candidates": [{"window": c.name, "role": c.role} for c in cands],
              "rule": f"held-out CE over {over}, lower first; stopped runs last; top two get "
                      f"{seeds} seeds; separated when the paired interval excludes 0 and every seed pair agrees"}
    if cells != "all":
        record["cells"] = cells
    return record


def check_plan(path: Path, wanted: dict) -> None:
    """Refuses a --resume whose plan differs from the one on disk (one line naming the first difference)."""
    have = read_json(path, "window sweep plan")
    for key in ("model", "block_selection_sha256", "recipe_sha256", "steps", "seeds", "candidates", "cells"):
        default = "all" if key == "cells" else None   # a plan without `cells` ranks on every cell
        if have.get(key, default) != wanted.get(key, default):
            raise WorkbenchError(f"{path}: the sweep there has {key} = {have.get(key, default)!r}, this command asks "
                                 f"for {wanted.get(key, default)!r}; resume with the same options or choose another --out")


def save_reading(path: Path, reading: dict) -> None:
    write_json_atomic(path, reading, indent=None)


# ------------------------------------------------------------------ the sweep
def run_status(run_dir: Path) -> str | None:
    """'finished', 'stopped_by_guardrail', 'partial' (a run there, resumable) or None (no run yet)."""
    prov = run_dir / runs.PROVENANCE
    if prov.is_file():
        status = read_json(prov, "run provenance").get("status")
        if status in ("finished", STOPPED_BY_GUARDRAIL):
            return status
    return "partial" if (run_dir / runs.RECIPE).is_file() else None


def _train_one(recipe: Recipe, run_dir: Path, recipe_path: Path, progress: bool, device) -> str:
    status = run_status(run_dir)
    if status in ("finished", STOPPED_BY_GUARDRAIL):
        return status
    if status == "partial" and (run_dir / runs.RECIPE).read_text() != dumps(recipe):
        raise WorkbenchError(f"{run_dir}: the run there was trained from another recipe; choose another --out")
    summary = Trainer(recipe, run_dir, resume=status == "partial", progress=progress,
                      recipe_dir=recipe_path.resolve().parent, inputs=[recipe_path], device=device).run()
    return "finished" if summary["finished"] else summary["status"]


def _reading(run_dir: Path, recipe: Recipe, cache: Path, device) -> dict:
    if cache.is_file():
        return read_json(cache, "window sweep reading")
    looped, tok, _ = runs.load_run(run_dir, precision="recorded")
    looped.to(device)
    reading = read_candidate(looped, tok, ranking_rows(recipe, tok))
    save_reading(cache, reading)
    return reading


def _run_record(run_dir: Path, status: str) -> dict:
    prov = read_json(run_dir / runs.PROVENANCE, "run provenance")
    guard = prov.get("guardrail") or {}
    return {"dir": str(Path(RUNS) / run_dir.name), "status": status, "wall_s": prov.get("wall_s"),
            "guardrail": {k: guard.get(k) for k in ("base", "final", "max_drop")} if guard else None}


def sweep(out: Path, selection: dict, model: str, recipe_path: Path, steps: int = DEFAULT_STEPS,
          n_candidates: int = DEFAULT_CANDIDATES, include=(), seeds: int = SEEDS, progress: bool = True,
          device=None, say=None, texts: list[str] | None = None, cells: str = "all", base=None) -> dict:
    """Trains every candidate for `steps` steps, the top two with `seeds` seeds; returns the table's record (`TABLE`).

    `out` is the sweep directory (its block_selection.json is `selection`); each (window, seed) is a
    run directory under out/runs, resumed where a previous sweep stopped, and read once into
    out/readings. `say` (default: nowhere) receives one line per candidate as it starts (which window is training). With `texts`
    (Stage 1's corpus) the candidates' untrained damage is measured once into out/damage.json, on `base` (the
    caller's loaded `(model, tokenizer)`, on `device`) or on `model` loaded for it.
    """
    if not isinstance(seeds, int) or seeds < 1:
        raise WorkbenchError(f"--seeds {seeds!r} is not accepted; give an integer >= 1")
    say = say or (lambda line: None)   # a library call prints nothing unless given somewhere to say it
    raw = base_recipe(recipe_path)
    cands = candidates(selection, n_candidates, include)
    recipes = {(c, 0): sweep_recipe(raw, model, c, steps, 0) for c in cands}   # every bad input before any run
    sel_sha = sha256_bytes(json_bytes(selection))
    wanted = plan(sel_sha, model, Path(recipe_path).name, sha256_bytes(recipe_path.read_bytes()), steps, cands, seeds,
                  cells)
    if (out / SWEEP).is_file():
        check_plan(out / SWEEP, wanted)
    else:
        write_json_atomic(out / SWEEP, wanted)
    (out / RUNS).mkdir(exist_ok=True)
    (out / READINGS).mkdir(exist_ok=True)

    def train_read(c: Candidate, seed_index: int, position: str) -> tuple[dict | None, dict]:
        recipe = recipes.get((c, seed_index)) or sweep_recipe(raw, model, c, steps, seed_index)
        run_dir = out / RUNS / c.run_name(seed_index)
        say(f"window sweep {position}: training {c.name} ({c.role}), seed {seed_index + 1}, {steps} steps -> {run_dir}")
        status = _train_one(recipe, run_dir, recipe_path, progress, device)
        reading = (_reading(run_dir, recipe, out / READINGS / f"{c.run_name(seed_index)}.json", device)
                   if status == "finished" else None)
        return reading, _run_record(run_dir, status)

    total = len(cands) + (seeds - 1) * min(2, len(cands))
    first = {}
    for i, c in enumerate(tqdm(cands, desc="window sweep", unit="window", disable=not progress)):
        first[c] = train_read(c, 0, f"{i + 1}/{total}")
    table = order([summarize(c.name, c.role, [first[c][0]], [first[c][1]], cells) for c in cands])
    top = [next(c for c in cands if c.name == row["window"]) for row in table[:2] if row.get("heldout_ce")]
    extra = {c: [] for c in cands}
    position = len(cands)
    for c in top:
        for s in range(1, seeds):
            position += 1
            extra[c].append(train_read(c, s, f"{position}/{total}"))
    if not (out / DAMAGE).is_file() and texts is not None:
        say(f"window sweep: the untrained loop-2 damage of the {len(cands)} candidates (Stage 1's measure, for the agreement)")
        if base is None:
            base = load_base(model)
            base[0].to(device or "cpu")
        write_json_atomic(out / DAMAGE, {"windows": untrained_damage(*base, [(c.a, c.b) for c in cands], texts,
                                                                      progress)})
    return rebuild(out)


def untrained_damage(base, tok, windows: list[tuple[int, int]], texts: list[str], progress: bool = True) -> list[dict]:
    """Stage 1's window ablation (`block_selection.window_ablation`: the same held-out texts and task rows) over
    the given windows, whatever their size: what the untrained ranking says about exactly the trained windows."""
    _, heldout = split_texts(texts)
    return window_ablation(base, tok, windows, heldout, task_rows(tok), progress=progress)


def rebuild(out: Path) -> dict:
    """The table's record (`TABLE`) from what the sweep directory holds (sweep.json, block_selection.json, the runs'
    recipes and provenance, readings/): the sweep ends with it, and a committed sweep regenerates by it."""
    wanted = read_json(out / SWEEP, "window sweep plan")
    selection = read_json(out / "block_selection.json", "block selection")
    rows, stages = [], None
    for c in wanted["candidates"]:
        cand = Candidate(*(int(x) for x in c["window"].split(":")), c["role"])
        readings, records = [], []
        for s in range(wanted["seeds"]):
            run_dir = out / RUNS / cand.run_name(s)
            status = run_status(run_dir)
            if status in (None, "partial"):
                continue
            if stages is None:
                stages = read_toml(run_dir / runs.RECIPE, "recipe")["stages"]
            records.append(_run_record(run_dir, status))
            cache = out / READINGS / f"{cand.run_name(s)}.json"
            readings.append(read_json(cache, "window sweep reading") if status == "finished" else None)
        if records:
            rows.append(summarize(cand.name, cand.role, readings, records, wanted.get("cells", "all")))
    if not rows:
        raise WorkbenchError(f"{out}: no candidate of the sweep has finished; run it with --resume")
    table = order(rows)
    best = table[0]
    for row in table[1:]:   # every other candidate against the recommendation, paired over the same rows
        if best.get("row_ce") and row.get("row_ce"):
            diff = paired_bootstrap(best["row_ce"], row["row_ce"], n_boot=4000, seed=0)
            row["vs_recommended"] = {"value": diff.estimate, "low": diff.low, "high": diff.high}
    kept = ", ".join(f"{s['name']} {s['steps']}" for s in stages)
    return {
        **wanted, "budget": f"{wanted['steps']} steps of {Path(wanted['recipe']).name}'s first stages ({kept})",
        "rank_rows": {"per_depth": RANK_PER_DEPTH, "first_index": RANK_FIRST_INDEX,
                      "depths": sorted({d for s in stages for d in s["depths"]})},
        "table": [{k: v for k, v in row.items() if k != "row_ce"} for row in table],
        "recommended": best["window"] if best.get("heldout_ce") else None,
        "margin": margin(table[0], table[1]) if len(table) > 1 else None,
        "train_wall_s": round(sum(run.get("wall_s") or 0.0 for row in table for run in row["runs"]), 1),
        "agreement": agreement(selection, table,
                               read_json(out / DAMAGE, "untrained damage")["windows"] if (out / DAMAGE).is_file()
                               else None),
    }


def json_bytes(obj) -> bytes:
    """Canonical JSON bytes (sorted keys) of a record, for its hash."""
    return json.dumps(obj, sort_keys=True).encode()


def table_lines(record: dict) -> list[str]:
    """The window sweep's table for a person: rank, window, role, held-out CE with its interval, loop-2 accuracy at depth 2,
    the guardrail, then the recommendation with its margin and how Stage 1 agreed."""
    over = ("" if record.get("cells", "all") == "all" else
            " on the cells that need iterating (depth >= 2, loops 2 <= t <= d)")
    lines = [f"window sweep ({record['budget']}); held-out CE{over} over {record['rank_rows']['per_depth']} "
             "fresh rows per depth, lower first:"]
    for row in record["table"]:
        ce, acc = row.get("heldout_ce"), row.get("acc_d2_loop2")
        guard = [r.get("guardrail") or {} for r in row["runs"]]
        g = ", ".join(f"{x.get('final')}/{x.get('base')}" for x in guard if x) or "off"
        cell = (f"CE {ce['value']:.4f} [{ce['low']:.4f}, {ce['high']:.4f}]" if ce else "no reading")
        acc_cell = f"  d2@loop2 {acc['value']:.3f} [{acc['low']:.2f}, {acc['high']:.2f}]" if acc else ""
        flag = "  STOPPED by the guardrail" if row["stopped_by_guardrail"] else ""
        lines.append(f"  {row['rank']}. {row['window']:>5} {row['role']:<12} {cell}{acc_cell}  seeds {row['seeds']}  "
                     f"guardrail {g} (final/base){flag}")
    m, agree = record.get("margin") or {}, record["agreement"]
    if record.get("recommended"):
        diff = m.get("ce_difference")
        text = (f" by {diff['value']:.4f} nats [{diff['low']:.4f}, {diff['high']:.4f}] over the runner-up" if diff else "")
        lines.append(f"recommended window {record['recommended']}{text}: "
                     f"{'separated' if m.get('separated') else 'not separated'} ({m.get('why', '')})")
    rho = agree.get("spearman_damage_vs_ce")
    lines.append(f"Stage 1's untrained pick {agree['stage1_recommended']} ranks {agree['stage1_recommended_rank']} "
                 f"here; Spearman(untrained damage, trained CE) over {len(agree['windows_in_both'])} windows = "
                 f"{'n/a' if rho is None else f'{rho:+.2f}'}")
    return lines
