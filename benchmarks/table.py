"""Builds the results table from `benchmarks/results/*.json`.

    .venv/bin/python benchmarks/table.py

Writes `benchmarks/results/TABLE.md` (the snippet for the main README) and refreshes the
block between the `results:start` / `results:end` markers of `benchmarks/README.md`.
A benchmark without a results file is listed as not run.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import common

from workbench.io import atomic_path

START, END = "<!-- results:start -->", "<!-- results:end -->"
ORDER = ("forced_read", "readout_memory", "hook_overhead", "loop_cost", "training_step", "cpu_efficiency", "precision",
         "early_exit", "prompt_lens")


def load(results_dir: Path) -> dict[str, dict]:
    """Returns {benchmark: record} for every results file present."""
    found = {}
    for name in ORDER:
        path = results_dir / f"{name}.json"
        if path.exists():
            found[name] = json.loads(path.read_text())
    return found


def _met(flag) -> str:
    if isinstance(flag, dict):  # judged on each clock
        return f"CPU time: {_met(flag['cpu'])}; wall: {_met(flag['wall'])}"
    return "n/a" if flag is None else ("yes" if flag else "**no**")


def _judge(values: dict, ok) -> dict:
    return {clock: ok(values[clock]) for clock in ("wall", "cpu")}


def _r(s: dict) -> str:
    if "wall" in s:
        return f"{_r(s['wall'])}; CPU time {_r(s['cpu'])}"
    return f"{s['median']:.2f}× ({s['min']:.2f}–{s['max']:.2f})"


def _pct(s: dict) -> str:
    return f"{s['median']:.0%} ({s['min']:.0%}–{s['max']:.0%})"


def rows_for(name: str, rec: dict) -> list[list[str]]:
    """Table rows (measure, target, measured, prediction, met) for one benchmark record."""
    r = rec["results"]
    if name == "forced_read":
        out = []
        for style in [s for s in ("last_loop", "forward", "read") if s in r["styles"]]:
            v = r["styles"][style]
            p = v["predicted"]
            label = {"last_loop": "reruns reading only loop t", "forward": "reruns via forward (full-vocab head)",
                     "read": "reruns via read(loops=t)"}[style]
            target = "within 10% of layer prediction" if style == "last_loop" else "(for reference)"
            out.append([f"Forced read, T={r['loops']}, {rec['args']['rows']} rows: {label} / one pass", target, _r(v["ratio"]),
                        f"{p['layers']:.2f}× layers, {p['flops']:.2f}× FLOPs",
                        _met(_judge(v["vs_layers"], lambda x: abs(x) <= 0.10)) if style == "last_loop" else "–"])
        return out
    if name == "readout_memory":
        q = r["ratios"]
        mib = {k: r[k]["allocator_peak_bytes"] / 2 ** 20 for k in ("restricted", "full_stack")}
        rss = q["rss_peak_rise_bytes"]
        rss = "n/a (the read's RSS did not rise)" if rss is None else f"{rss:,.0f}×"
        return [[f"Readout memory, T={r['loops']}, {r['rows']} rows: full stack / candidate read, allocator peak",
                 "≥ 100×", f"{q['allocator_peak_bytes']:,.0f}×",
                 f"{mib['full_stack']:,.0f} vs {mib['restricted']:.1f} MiB; output tensors "
                 f"{q['output_bytes']:,.0f}×; peak-RSS rise {rss}", _met(r["target_met"])]]
    if name == "hook_overhead":
        q = r["ratios"]
        return [[f"Hook overhead: read caching 4 sites × {r['loops']} loops / bare read", "≤ 1.10×",
                 _r(q["read_cached/read"]), "–",
                 _met(_judge({c: s["median"] for c, s in q["read_cached/read"].items()}, lambda x: x <= 1.10))],
                ["  nnsight trace of the same sites / bare forward", "(for reference)", _r(q["nnsight/forward"]),
                 "–", "–"],
                ["  TransformerLens run_with_cache, no filter / bare forward", "(for reference)",
                 _r(q["tl_all/forward"]), "–", "–"]]
    if name == "loop_cost":
        last = r["per_T"][-1]
        worst = {c: max(abs(e["last_loop"][c]["median"] / e["layers"] - 1) for e in r["per_T"])
                 for c in ("wall", "cpu")}
        return [[f"Loop cost time(T)/time(1) at T={last['T']}, last-loop read", "compare with layer model",
                 _r(last["last_loop"]),
                 f"{last['layers']:.2f}× layers, {last['flops_last_loop']:.2f}× FLOPs; worst T=1..{last['T']} off "
                 f"the layer model by {worst['cpu']:.0%} (CPU), {worst['wall']:.0%} (wall)", "–"],
                ["  same, public forward (full-vocab head at every position)", "(for reference)",
                 _r(last["forward"]), f"{last['layers']:.2f}× layers, {last['flops_forward']:.2f}× FLOPs", "–"]]
    if name == "training_step":
        t = r["tokens_per_s"]
        pred = r.get("predicted_speedup")
        return [[f"Training step, batch {r['batch']}, T={r['loops']}: trainer / full-vocab stack speed",
                 "faster", _r(r["speedup"]),
                 ("" if pred is None else f"{pred:.2f}× by FLOPs; ")
                 + f"{t['trainer']['median']:.1f} vs {t['full_vocab']['median']:.1f} tokens/s (wall)", "–"]]
    if name == "cpu_efficiency":
        f, g = r["fraction"], r["gflops"]
        peak = max(g["matmul_1024"]["median"], g["matmul_mlp"]["median"])
        fc = r["fraction_cpu"]
        return [[f"CPU efficiency: forced read (T={r['read']['loops']}) / matmul rate", "(report)",
                 f"{_pct(f['read'])}; per CPU second {_pct(fc['read'])}",
                 f"{g['read']['median']:.1f} of {peak:.1f} GFLOP/s per wall second", "–"],
                [f"CPU efficiency: training step (T={r['train']['loops']}) / matmul rate", "(report)",
                 f"{_pct(f['train_step'])}; per CPU second {_pct(fc['train_step'])}",
                 f"{g['train_step']['median']:.1f} of {peak:.1f} GFLOP/s per wall second", "–"]]
    if name == "precision":
        hw = r["hardware"]
        units = ", ".join(hw["bf16_units"]) or "no bf16 units"
        share = r["share_of_matmul_rate"]
        matmul = r["matmul"]["weighted"]["bf16"] / r["matmul"]["weighted"]["fp32"]
        return [[f"bf16 training step, default recipe's model (LoRA r16, block {r.get('block', '12:24')}), batch "
                 f"{r['batch']}, depths 1-{r['loops']}: fp32 / bf16 time", "≥ 2× (CPU with bf16 units)",
                 _r(r["train_speedup"]), f"{units}; matmuls alone {matmul:.2f}×",
                 _met(_judge({c: s["median"] for c, s in r["train_speedup"].items()}, lambda x: x >= 2.0))],
                ["  bf16 training step / bf16 matmul rate", "≥ 40%",
                 f"{share['bf16']:.0%} (fp32 step: {share['fp32']:.0%} of fp32)",
                 f"{r['achieved_gflops']['bf16']:.1f} of {r['matmul']['weighted']['bf16']:.1f} GFLOP/s",
                 _met(share["bf16"] >= 0.40)],
                [f"  forced read, T={r['read_loops'] if 'read_loops' in r else rec['args']['read_loops']}: fp32 / bf16 time",
                 "(for reference)", _r(r["read_speedup"]),
                 f"argmax agreement {r['read_argmax_agreement']:.4f} of {r['read_cells']} cells", "–"]]
    if name == "early_exit":
        a, k, c = r["split"]
        out = []
        for case, label in (("half_at_1", "half the rows stop after loop 1"), ("all_at_1", "every row stops after loop 1")):
            out.append([f"Early exit, {r['rows']} rows, budget {r['loops']} loops (inject + memory + halting): "
                        f"{label} / fixed depth", "≈ layer model",
                        _r(r["ratio_to_fixed"][case]),
                        f"{r['predicted_layers'][case]:.2f}× layers ({a} + t x {k} + {c}); row-loops "
                        f"{r['row_loops'][case]} of {r['row_loops']['fixed']} (the layer model leaves out the "
                        "memory attention, which runs from loop 2 on)", "–"])
        return out
    if name == "prompt_lens":
        lens = r["times"]["lens_one_forward"]["wall"]
        return [[f"`wb.lens` on one prompt ({r['seq']} tokens), T = {r['loops']}: one forward reading every loop",
                  f"< {r['target_s']:.0f} s", f"{lens['median']:.2f} s ({lens['min']:.2f}–{lens['max']:.2f})",
                  f"T forwards instead: {_r(r['ratio_per_loop_to_lens'])}; loop T vs the T-loop forward: "
                  f"max |Δp| {r['max_abs_diff_last_loop']:.0e}", _met(r["target_met"])]]
    raise KeyError(name)


def render(found: dict[str, dict]) -> str:
    """The markdown table, the machine it ran on and the commands that produced it."""
    lines = ["| Measure | Target | Measured: median (min–max over rounds); wall clock, then CPU time "
             "| Prediction / detail | Met |",
             "|---|---|---|---|---|"]
    for name in ORDER:
        if name in found:
            lines += ["| " + " | ".join(row) + " |" for row in rows_for(name, found[name])]
        else:
            lines.append(f"| {name} | | not run | | |")
    machines: dict[str, list[str]] = {}
    for n, rec in found.items():
        key = json.dumps({k: rec["machine"][k] for k in ("nproc", "cpu", "torch", "threads")}, sort_keys=True)
        machines.setdefault(key, []).append(n)
    lines.append("")
    for m, names in sorted(machines.items()):
        d = json.loads(m)
        which = "" if len(machines) == 1 else f" ({', '.join(names)})"
        lines.append(f"Machine{which}: {d['nproc']} cores, {d['cpu']}, torch {d['torch']}, "
                     f"{d['threads']} torch threads.")
    loads = [f"{n} {rec['machine']['loadavg'][0]}" for n, rec in found.items()]
    if loads:
        lines.append("1-minute load average at the end of each run: " + ", ".join(loads) + ".")
    lines += ["", "Commands:", ""]
    lines += [f"    {found[n]['command']}   # {found[n]['time']}, {found[n]['wall_s']} s" for n in ORDER if n in found]
    return "\n".join(lines) + "\n"


def _write(path: Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def main(argv: list[str] | None = None) -> str:
    """Writes TABLE.md and refreshes the README block; returns the table text."""
    results_dir = Path(argv[0]) if argv else common.RESULTS_DIR
    text = render(load(results_dir))
    results_dir.mkdir(parents=True, exist_ok=True)
    _write(results_dir / "TABLE.md", text)
    readme = common.BENCH_DIR / "README.md"
    if readme.exists() and not argv:
        doc = readme.read_text()
        if START in doc and END in doc:
            head, rest = doc.split(START, 1)
            _write(readme, head + START + "\n" + text + END + rest.split(END, 1)[1])
    print(text)
    return text


if __name__ == "__main__":
    main(sys.argv[1:])
