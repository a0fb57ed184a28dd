"""A whole training run, eager against `[train] compile = true`: the time a user waits and whether the run is the same.

    .venv/bin/python benchmarks/compile_whole_run.py [--recipe R] [--rounds 2] [--threads N]

Each case is one whole `workbench train` process on the same recipe (default: the anneal keeper's,
`training/smollm2_lora_chase_anneal.toml`, the shortest whole specimen run), in its own run directory,
so start-up, the step-0 and final held-out evaluation and guardrail, checkpoints and every
recompilation for a new shape are inside the time. Rounds alternate their order (eager, compiled, then
compiled, eager: ABBA over two rounds), so a slow drift in machine load falls on both cases alike; the
speed-up is eager / compiled taken within each round, summarised by its median and min-max.

The rule is fixed here, before the run it reads (`verdict`). Compilation becomes the default only if all
three hold:

1. **time**: the median within-round ratio of whole-process wall seconds, eager / compiled, is >= 1.15;
2. **loss curve**: in every window of `WINDOW` consecutive training steps, the compiled run's mean loss
   lies within the two-sample 95% interval of the eager run's of the same round
   (|mean_c - mean_e| <= 1.96 * sqrt(sd_e^2 / n + sd_c^2 / n));
3. **held-out cells**: at the final evaluation every depth x loop cell of the compiled run lies inside
   the Wilson 95% interval of the eager run's cell (same rows, `eval.per_depth` each), and so does
   the final guardrail count.

"Always adopt" fails rule 1 whenever compilation is not 15% faster; a compiled run that trains
differently fails 2 or 3. Recompilations are counted from torch's own `TORCH_LOGS=recompiles` lines. Every
run gets an empty compilation cache of its own (`TORCHINDUCTOR_CACHE_DIR`), so the compiled time is a first
run's: with a warm cache a later run of the same shapes compiles faster than this measures.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common

from workbench.analysis.stats import wilson

NAME = "compile_whole_run"
ROOT = common.BENCH_DIR.parent
DEFAULT_RECIPE = ROOT / "training" / "smollm2_lora_chase_anneal.toml"
MIN_SPEEDUP = 1.15
WINDOW = 20
Z = 1.96


# ----------------------------------------------------------------------------- the rule
def loss_windows(eager: list[float], compiled: list[float], window: int = WINDOW) -> list[dict]:
    """Per window of `window` steps: both means, the two-sample 95% half-width, and whether they match."""
    if len(eager) != len(compiled):
        raise ValueError(f"the runs logged {len(eager)} and {len(compiled)} training steps")
    out = []
    for start in range(0, len(eager), window):
        e, c = eager[start:start + window], compiled[start:start + window]
        n = len(e)
        sd_e = statistics.stdev(e) if n > 1 else 0.0
        sd_c = statistics.stdev(c) if n > 1 else 0.0
        half = Z * math.sqrt(sd_e ** 2 / n + sd_c ** 2 / n)
        diff = statistics.fmean(c) - statistics.fmean(e)
        out.append({"steps": [start + 1, start + n], "eager": statistics.fmean(e), "compiled": statistics.fmean(c),
                    "diff": diff, "half_width": half, "match": abs(diff) <= half})
    return out


def cells_match(eager: dict, compiled: dict, per_depth: int) -> list[dict]:
    """Every depth x loop cell of the final evaluation: the compiled count inside the eager cell's Wilson interval."""
    out = []
    for depth, loops in eager.items():
        for loop, acc in loops.items():
            lo, hi = wilson(round(acc * per_depth), per_depth)
            other = compiled[depth][loop]
            out.append({"depth": int(depth), "loop": int(loop), "eager": acc, "compiled": other,
                        "interval": [lo, hi], "match": lo - 1e-12 <= other <= hi + 1e-12})
    return out


def verdict(rounds: list[dict], per_depth: int) -> dict:
    """The rule of the module docstring over finished rounds ({"eager": run, "compiled": run} each)."""
    ratios = [r["eager"]["wall_s"] / r["compiled"]["wall_s"] for r in rounds]
    windows, cells, guard = [], [], []
    for r in rounds:
        e, c = r["eager"], r["compiled"]
        windows += loss_windows(e["losses"], c["losses"])
        cells += cells_match(e["final_eval"], c["final_eval"], per_depth)
        if e["guardrail"] is not None:
            lo, hi = wilson(e["guardrail"]["correct"], e["guardrail"]["total"])
            p = c["guardrail"]["correct"] / c["guardrail"]["total"]
            guard.append({"eager": e["guardrail"]["correct"], "compiled": c["guardrail"]["correct"],
                          "total": e["guardrail"]["total"], "match": lo - 1e-12 <= p <= hi + 1e-12})
    speedup = statistics.median(ratios)
    checks = {
        "time": speedup >= MIN_SPEEDUP,
        "loss_curve": all(w["match"] for w in windows),
        "held_out": all(x["match"] for x in cells) and all(g["match"] for g in guard),
    }
    return {"rule": f"eager/compiled whole-run wall >= {MIN_SPEEDUP} (median of rounds), loss means in "
                    f"{WINDOW}-step windows within the two-sample 95% interval, final held-out cells and "
                    "guardrail inside the eager run's Wilson 95% intervals",
            "speedup": common.summary(ratios), "checks": checks, "adopt": all(checks.values()),
            "windows_matched": [sum(w["match"] for w in windows), len(windows)],
            "cells_matched": [sum(x["match"] for x in cells), len(cells)],
            "guardrail": guard, "max_abs_loss_diff_window": max(abs(w["diff"]) for w in windows)}


# ----------------------------------------------------------------------------- one whole run
def read_run(run_dir: Path) -> dict:
    """The training losses, the final evaluation and guardrail, and the trainer's own seconds from a run directory."""
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    train = [r for r in records if r["kind"] == "train"]
    evals = [r for r in records if r["kind"] == "eval"]
    guards = [r for r in records if r["kind"] == "guardrail"]
    return {"losses": [r["loss"] for r in train], "steps": len(train),
            "first_step_s": train[0]["elapsed_s"] if train else None,
            "trainer_s": train[-1]["elapsed_s"] if train else None,
            "final_eval": evals[-1]["acc"] if evals else {},
            "guardrail": ({"correct": guards[-1]["correct"], "total": guards[-1]["total"]} if guards else None)}


def run_case(recipe: Path, out: Path, compiled: bool, sets: list[str], threads: int | None, device: str) -> dict:
    """One whole `workbench train` process; returns its wall and CPU seconds, recompilations and its record."""
    cmd = [sys.executable, "-m", "workbench", "train", str(recipe), "--out", str(out), "--quiet", "--device", device,
           "--set", f"train.compile={'true' if compiled else 'false'}"]
    for s in sets:
        cmd += ["--set", s]
    # A fresh compilation cache for every run: each compiled run pays what a user's first run pays, and the
    # second round is not sped up by the first one's cached kernels.
    env = {**os.environ, "TORCH_LOGS": "recompiles", "TORCHINDUCTOR_CACHE_DIR": str(out) + "-inductor-cache"}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
    log = proc.stderr.splitlines()
    return {"compiled": compiled, "wall_s": wall,
            "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
            "recompilations": sum("Recompiling function" in line for line in log),
            "recompile_limit_hit": sum("hit config.recompile_limit" in line for line in log),
            **read_run(out)}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--recipe", type=Path, default=DEFAULT_RECIPE, help="the recipe both cases train")
    p.add_argument("--model", default=None, help="base model for both cases (default: the recipe's)")
    p.add_argument("--block", default=None, help="looped block A:B (default: the recipe's)")
    p.add_argument("--set", dest="sets", action="append", default=[], help="recipe override key=value for both cases")
    p.add_argument("--rounds", type=int, default=2, help="rounds of one eager and one compiled run, order alternating")
    p.add_argument("--device", default="cpu", help="the runs' device, as `workbench train --device` (cpu, cuda, cuda:N)")
    p.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS of each run (default: torch's)")
    p.add_argument("--work", type=Path, default=None, help="directory for the runs (default: a temporary one)")
    p.add_argument("--out", type=Path, default=common.RESULTS_DIR, help="directory for compile_whole_run.json")
    args = p.parse_args(argv)
    args.sets = ([f"model.base={args.model}"] if args.model else []) + \
                ([f"model.block={args.block}"] if args.block else []) + args.sets
    if args.recipe.resolve().is_relative_to(ROOT):  # recorded as the repository's path; the runs start in ROOT
        args.recipe = args.recipe.resolve().relative_to(ROOT)
    from workbench.train.recipe import Recipe

    started = time.perf_counter()
    per_depth = Recipe.from_toml(ROOT / args.recipe, overrides=args.sets).eval.per_depth
    work = (args.work or Path(tempfile.mkdtemp(prefix="compile-whole-run-"))).resolve()
    print(f"runs in {work}", flush=True)
    rounds = []
    for i in range(args.rounds):
        order = (False, True) if i % 2 == 0 else (True, False)
        done = {}
        for compiled in order:
            name = "compiled" if compiled else "eager"
            print(f"round {i + 1}/{args.rounds}: {name} ...", flush=True)
            done[name] = run_case(args.recipe, work / f"r{i + 1}-{name}", compiled, args.sets, args.threads, args.device)
            print(f"  {done[name]['wall_s']:.1f} s wall, {done[name]['recompilations']} recompilations", flush=True)
        rounds.append({"order": ["compiled" if c else "eager" for c in order], **done})
    results = {"rounds": rounds, "verdict": verdict(rounds, per_depth)}
    result = common.record(NAME, args, argv, results, started)
    common.write_result(NAME, result, args.out)
    v = results["verdict"]
    s = v["speedup"]
    failed = ", ".join(k for k, ok in v["checks"].items() if not ok) or "all checks pass"
    print(f"whole run eager / compiled: {s['median']:.3f}x (rounds {s['min']:.3f}-{s['max']:.3f}); "
          f"loss windows matched {v['windows_matched'][0]}/{v['windows_matched'][1]}; "
          f"held-out cells matched {v['cells_matched'][0]}/{v['cells_matched'][1]}; "
          f"adopt as default: {'yes' if v['adopt'] else 'no'} ({failed})")
    return result


if __name__ == "__main__":
    main()
