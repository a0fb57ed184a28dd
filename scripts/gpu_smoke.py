"""The GPU smoke run (scripts/gpu_smoke.sh): every device path once, one table at the end.

    python scripts/gpu_smoke.py --device cuda --out results/gpu_smoke          # the real run (< 8 min on one GPU)
    python scripts/gpu_smoke.py --device cpu --quick --out /tmp/smoke           # the same code on a CPU, small counts

Checks, in order (each row of the table: what ran, its numbers, seconds):
1. loop-1 identity on the device: fresh retrofits of SmolLM2-135M at the keeper's block against the HF model
   on the same device and kernels (max |Δlogit|, must be 0.0 in fp32).
2. the default recipe (smollm2_lora_chase) in bf16 for --steps steps (50), its losses beside the CPU run's:
   the shipped keeper training/keepers/smollm2-chase is that recipe's CPU bf16 run (same seed, same rows, same
   schedule: the run stops after --steps steps of its 1,100), so its metrics.jsonl holds the CPU losses.
3. the demo battery on the default keeper.
4. the adaptive read on the oracle halting keeper, with rows leaving the batch: each row's scores against the
   forced read at the loop where it stopped.
5. each halting objective (oracle, ACT, PonderNet) for --halting-steps steps (5) on the chase keeper, online.
6. the ddp preset with 2 processes, when 2 GPUs exist (--cpu-ddp runs it over gloo on the CPU instead).
7. the families written here on the device (issue 54): the tiny Raven and Ouro fixtures (tests/fixtures/) in fp32
   and bf16 against the reference's committed fp32 logits (Raven at 1, 2, 4, 8 and 32 steps from the committed s_0,
   Ouro at 1-4 steps), and one 32-step Raven read with every step's state cached in one forward.

Writes OUT/gpu_smoke.md (the table, the device's name, torch and CUDA versions) and OUT/gpu_smoke.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from workbench.defaults import DEFAULT_KEEPER, DEFAULT_RECIPE, DEMO_BATTERY, resolve, resolve_run  # noqa: E402
from workbench.devices import device_name, resolve_device  # noqa: E402

KEEPER_ORACLE = ROOT / "training" / "halting" / "keeper-oracle"
HALTING_RECIPE = ROOT / "training" / "halting" / "keeper_oracle.toml"


def _losses(run: Path) -> dict[int, float]:
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return {r["step"]: r["loss"] for r in lines if r.get("kind") == "train"}


def check_identity(device, args) -> str:
    from workbench.defaults import EMBEDDED_DEFAULT
    from workbench.loop.identity import identity_report
    from workbench.models import load_base
    from workbench.runs import read_retrofit

    block = read_retrofit(resolve_run(DEFAULT_KEEPER))[1].block
    base, tok = load_base(EMBEDDED_DEFAULT)
    rows = identity_report(base.to(device), tok, block, loops=1 if args.quick else 3)
    worst = max(r["max_abs_diff"] for r in rows)
    if worst != 0.0:
        raise AssertionError(f"max |Δlogit| = {worst} (must be 0.0)")
    return f"block {block[0]}:{block[1]}, {len(rows)} retrofits, max |Δlogit| = {worst}"


def check_training(device, args) -> str:
    from workbench.train.trainer import train

    out = args.out / "train_bf16"
    overrides = ["train.precision=bf16"] + (["eval.per_depth=4", "guardrail.enabled=false"] if args.quick else [])
    summary = train(DEFAULT_RECIPE, out=out, overrides=overrides, stop_after=args.steps, progress=False, device=device)
    mine, cpu = _losses(out), _losses(resolve_run(DEFAULT_KEEPER))
    steps = sorted(s for s in mine if s in cpu and s <= args.steps)
    if len(steps) != args.steps:
        raise AssertionError(f"logged {len(steps)} of {args.steps} steps")
    diffs = [abs(mine[s] - cpu[s]) for s in steps]
    shown = sorted(set(steps[:3] + steps[-2:]))
    pairs = ", ".join(f"{s}: {mine[s]:.4f} / {cpu[s]:.4f}" for s in shown)
    from workbench.precision import resolve_precision

    used = resolve_precision("bf16", device, warn=lambda m: None)[0]   # fp32 on a CPU without bf16 units
    (args.out / "train_losses.json").write_text(json.dumps({"steps": steps, "device": [mine[s] for s in steps],
                                                            "cpu_keeper": [cpu[s] for s in steps]}, indent=1))
    return (f"{args.steps} steps in {summary['wall_s']} s ({used}); loss (this device / CPU keeper, bf16) at step {pairs}; "
            f"max |Δloss| {max(diffs):.4f}, mean {sum(diffs) / len(diffs):.4f}")


def check_demo(device, args) -> str:
    from workbench.probes.battery import run_battery

    only, rows = None, None
    if args.quick:   # two probes on 2 rows per depth of the battery's own manifest
        from workbench.tasks.manifest import read_manifest, write_manifest

        only, rows = ["identity", "depth_matrix"], args.out / "demo_rows.jsonl"
        write_manifest([r for r in read_manifest(ROOT / "probes" / "chase_n8_d1-7.jsonl").rows if r["index"] < 2], rows)
    summary = run_battery(str(resolve_run(DEFAULT_KEEPER)), resolve("battery", DEMO_BATTERY), args.out / "demo",
                          rows=None if rows is None else str(rows), only=only, progress=False, device=device,
                          overwrite=True)
    ran = [n for n, p in summary["probes"].items() if p.get("status") != "not_applicable"]
    return f"{len(ran)} probes ({', '.join(ran)}) in {summary['wall_s']} s"


def check_adaptive(device, args) -> str:
    from workbench.loop.halting import HaltPolicy
    from workbench.runs import load_run
    from workbench.tasks.manifest import read_manifest
    from workbench.tasks.reader import encode_prompts, row_candidates

    looped, tok, _ = load_run(KEEPER_ORACLE)
    looped.to(device)
    per_depth = 2 if args.quick else 10   # depths 1-7 of the frozen manifest
    rows = [r for r in read_manifest(ROOT / "probes" / "chase_n8_d1-7.jsonl").rows if r["index"] < per_depth]
    enc = {k: v.to(device) for k, v in encode_prompts(tok, [r["prompt"] for r in rows]).items()}
    cands = row_candidates(tok, rows).to(device)
    budget = looped.max_loops
    with torch.no_grad():
        forced = looped.read(enc["input_ids"], enc["attention_mask"], loops=budget, candidates=cands)
        out = looped.adaptive_read(enc["input_ids"], enc["attention_mask"], policy=HaltPolicy(tau=0.5),
                                   candidates=cands)
    used = out.loops_used.tolist()
    diff = max(float((out.scores[i] - forced.scores[i, t - 1]).abs().max()) for i, t in enumerate(used))
    if len(set(used)) < 2:
        raise AssertionError(f"every row stopped at loop {used[0]}: no row left the batch early")
    counts = {t: used.count(t) for t in sorted(set(used))}
    return (f"{len(rows)} rows, tau 0.5: stopped at loops {counts}; {out.row_loops} of {len(rows) * budget} "
            f"row-loops; max |Δscore| vs the forced read at each row's loop {diff:.2e}")


def check_halting(device, args) -> str:
    from workbench.train.trainer import train

    parts = []
    for objective in ("oracle", "act", "pondernet"):
        overrides = [f"halting.objective={objective}", f"stages.0.steps={args.halting_steps}", "halting.sweep=0",
                     "checkpoint.every=1000"]
        if args.quick:
            overrides += ["optim.batch_size=4", "eval.per_depth=2", "guardrail.enabled=false"]
        t0 = time.perf_counter()
        train(str(HALTING_RECIPE), out=args.out / f"halting_{objective}", overrides=overrides, progress=False,
              device=device)
        losses = _losses(args.out / f"halting_{objective}")
        parts.append(f"{objective} {losses[1]:.4f} -> {losses[max(losses)]:.4f} ({time.perf_counter() - t0:.0f} s)")
    return f"{args.halting_steps} steps each, loss first -> last: " + "; ".join(parts)


def check_ddp(device, args) -> str:
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus < 2 and not args.cpu_ddp:
        return f"skipped: {gpus} GPU(s) (needs 2)"
    per_stage = 1 if args.quick else 2          # each of the recipe's three stages
    steps = 3 * per_stage
    cmd = [sys.executable, "-m", "workbench", "launch", DEFAULT_RECIPE, "--preset", "ddp", "--processes", "2",
           "--out", str(args.out / "ddp"), "--set", "eval.per_depth=4", "--set", "guardrail.enabled=false"]
    for i in range(3):
        cmd += ["--set", f"stages.{i}.steps={per_stage}"]
    if args.cpu_ddp:
        cmd.append("--cpu")
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if done.returncode != 0:
        raise AssertionError(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}")
    prov = json.loads((args.out / "ddp" / "provenance.json").read_text())
    losses = _losses(args.out / "ddp")
    return (f"{prov['processes']} processes ({prov['engine']['engine']}), {steps} steps, loss "
            f"{losses[1]:.4f} -> {losses[max(losses)]:.4f}, wall {prov['wall_s']} s")


NATIVE_FP32 = 1e-4   # the fixtures' fp32 logits on a device against the reference's CPU fp32 (1e-5 on the CPU)
NATIVE_BF16 = 0.1    # bf16 against the same fp32 reference: the bound tests/test_native_{raven,ouro}.py state


def check_native(device, args) -> str:
    from safetensors.torch import load_file

    from workbench.loop.hooks import hook_name
    from workbench.models import load_looped

    fixtures = ROOT / "tests" / "fixtures"
    cases = {"raven": (fixtures / "raven" / "checkpoint", (1, 2, 4, 8, 32),
                       lambda ref, k: ((ref["a.ids"],), {"init_state": ref["a.s0"]}, ref[f"a.logits.{k}"])),
             "ouro": (fixtures / "ouro" / "tiny-ouro", (1, 2, 3, 4),
                      lambda ref, k: ((ref["input_ids"],), {}, ref[f"logits_step{k}"]))}
    parts, worst = [], {}
    for family, (path, steps, inputs) in cases.items():
        ref = load_file(str(path.parent / "reference.safetensors"))
        for dtype, bound in ((torch.float32, NATIVE_FP32), (torch.bfloat16, NATIVE_BF16)):
            looped, _ = load_looped(path, dtype=dtype)
            looped.to(device)
            gap = 0.0
            with torch.no_grad():
                for k in steps:
                    a, kw, want = inputs(ref, k)
                    got = looped(*(x.to(device) for x in a), loops=k, **{n: v.to(device) for n, v in kw.items()})
                    gap = max(gap, float((got.logits.float().cpu() - want.float()).abs().max()))
            worst[(family, str(dtype))] = gap
            parts.append(f"{family} {str(dtype).removeprefix('torch.')} max |Δlogit| {gap:.2g} (bound {bound})")
            if gap > bound:
                raise AssertionError(f"{family} in {dtype} on {device}: max |Δlogit| {gap} > {bound}")
    looped, _ = load_looped(cases["raven"][0])
    looped.to(device)
    ref = load_file(str(cases["raven"][0].parent / "reference.safetensors"))
    names = [hook_name("state", t) for t in range(1, 33)]
    t0 = time.perf_counter()
    with torch.no_grad():
        _, cache = looped.run_with_cache(ref["a.ids"].to(device), loops=32, init_state=ref["a.s0"].to(device),
                                         names_filter=names)
    if sorted(cache.keys()) != sorted(names):
        raise AssertionError(f"the 32-step read cached {len(cache)} of 32 states")
    parts.append(f"32 Raven steps read in one forward, {len(cache)} states cached, "
                 f"{time.perf_counter() - t0:.2f} s")
    return "; ".join(parts)


CHECKS = [("loop-1 identity", check_identity), ("default recipe, bf16", check_training),
          ("demo battery", check_demo), ("adaptive read", check_adaptive),
          ("halting objectives", check_halting), ("ddp preset, 2 processes", check_ddp),
          ("native families, fp32 and bf16", check_native)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (the dry run)")
    p.add_argument("--out", type=Path, default=Path("results/gpu_smoke"))
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--halting-steps", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="small row counts (the CPU dry run)")
    p.add_argument("--cpu-ddp", action="store_true", help="run the ddp check over gloo on the CPU")
    p.add_argument("--only", default=None, help="comma list of check numbers (1-7)")
    args = p.parse_args(argv)
    device = resolve_device(args.device)
    args.out.mkdir(parents=True, exist_ok=True)
    wanted = {int(x) for x in args.only.split(",")} if args.only else set(range(1, len(CHECKS) + 1))
    name = device_name(device)
    rows, start = [], time.perf_counter()
    for i, (label, fn) in enumerate(CHECKS, 1):
        if i not in wanted:
            continue
        t0 = time.perf_counter()
        try:
            result, ok = fn(device, args), True
        except Exception as err:   # a failed check is a row of the table, the others still run
            result, ok = f"FAILED: {type(err).__name__}: {str(err).splitlines()[0][:300] if str(err) else ''}", False
            traceback.print_exc()
        rows.append({"check": f"{i}. {label}", "ok": ok, "result": result, "seconds": round(time.perf_counter() - t0, 1)})
        print(f"[{'ok' if ok else 'FAIL'}] {rows[-1]['check']} ({rows[-1]['seconds']} s): {result}", flush=True)
    total = round(time.perf_counter() - start, 1)
    head = (f"GPU smoke on {device} ({name}); torch {torch.__version__}, CUDA {torch.version.cuda}; "
            f"{'quick (dry) counts' if args.quick else 'full counts'}; total {total} s")
    table = ["| check | ok | result | s |", "|---|---|---|---|"]
    table += [f"| {r['check']} | {'yes' if r['ok'] else 'NO'} | {r['result'].replace('|', chr(92) + '|')} | "
              f"{r['seconds']} |" for r in rows]
    text = head + "\n\n" + "\n".join(table) + "\n"
    (args.out / "gpu_smoke.md").write_text(text)
    (args.out / "gpu_smoke.json").write_text(json.dumps({"device": str(device), "name": name, "total_s": total,
                                                          "rows": rows}, indent=1))
    print("\n" + text)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
