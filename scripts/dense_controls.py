"""The looped arm(s) and the dense controls on the same frozen rows: accuracy, paired tests and latency (issue 15).

    .venv/bin/python scripts/dense_controls.py training/keepers/smollm2-chase training/keepers/smollm2-chase-direct \
        training/keepers/smollm2-chase-scratchpad [more arms] --out training/dense/comparison [--results final] [--png]

The first arm is the reference (A): every other arm is paired with it row by row. Each arm's results folder (default
`final/`) is what `scripts/final_answers.py RUN --out RUN/final` writes: final answers, batch-1 latency per depth and
the fp32 guardrail. Writes OUT/CONTROLS.md (accuracy and median latency per depth for every arm; per pair the pooled
counts inside / beyond the support / overall with the exact McNemar p, and the per-depth counts; guardrail readings;
the CPU the latencies came from), OUT/controls.json and, with --png, OUT/controls.png (the paper's Fig. 4: accuracy by
depth, and accuracy against latency).
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pandas as pd

from workbench.analysis.arms import compare_arms, load_arm
from workbench.io import write_bytes_atomic
from workbench.plots.arms import controls_figure


def arm_table(arms) -> pd.DataFrame:
    """One row per (arm, depth): arm, kind, depth, correct, n, median_s."""
    out = []
    for arm in arms:
        kind = json.loads((arm.results_dir / "final.json").read_text()).get("kind", "looped")
        lat = arm.latency.set_index("depth")["median_s"] if arm.latency is not None else pd.Series(dtype=float)
        for d, g in arm.final.groupby("depth"):
            out.append({"arm": arm.name, "kind": kind, "depth": int(d), "correct": int(g["correct"].sum()),
                        "n": len(g), "median_s": float(lat.get(d, math.nan))})
    return pd.DataFrame(out)


def render(arms, table: pd.DataFrame, pairs: dict, line: str) -> str:
    ref = arms[0]
    depths = sorted(table["depth"].unique())
    cpus = {a.name: json.loads((a.results_dir / "final.json").read_text()) for a in arms}
    lines = [f"# {ref.name} and the dense controls", "", f"Regenerate: `{line}`. All arms read in fp32 on the same "
             f"frozen rows (manifest digest {ref.manifest_sha256[:12]}...), paired by row id.", "",
             "Accuracy by depth (correct / rows):", "",
             "| arm | kind | support | " + " | ".join(f"d{d}" for d in depths) + " |",
             "|---|---|---|" + "---|" * len(depths)]
    for a in arms:
        t = table[table["arm"] == a.name].set_index("depth")
        lines.append(f"| {a.name} | {t['kind'].iloc[0]} | {a.support} | "
                     + " | ".join(f"{t.loc[d, 'correct']}/{t.loc[d, 'n']}" for d in depths) + " |")
    how = cpus[ref.name].get("latency") or {}
    timing = (f"measured interleaved with {', '.join(how['interleaved_with'])} (scripts/arm_latency.py, "
              f"{how['rows_per_depth']} rows per depth x {how['repeats']} passes)" if how.get("interleaved_with")
              else "each arm in its own process (scripts/final_answers.py)")
    lines += ["", f"Median latency per row, batch 1, fp32 (ms; p10-p90 in controls.json), {timing}:", "",
              "| arm | CPU, threads | " + " | ".join(f"d{d}" for d in depths) + " |",
              "|---|---|" + "---|" * len(depths)]
    for a in arms:
        t = table[table["arm"] == a.name].set_index("depth")
        rec = cpus[a.name]
        lines.append(f"| {a.name} | {rec.get('cpu')}, {rec.get('threads')} | "
                     + " | ".join(f"{1e3 * t.loc[d, 'median_s']:.0f}" for d in depths) + " |")
    for name, out in pairs.items():
        lines += ["", f"## {ref.name} (A) vs {name} (B)", "",
                  "| rows | n | A correct | B correct | B helped | B hurt | exact McNemar p |",
                  "|---|---|---|---|---|---|---|"]
        for k, r in out["pooled"].items():
            lines.append(f"| {k.replace('_', ' ')} | {r['n']} | {r['a_correct']} | {r['b_correct']} | "
                         f"{r['b_helped']} | {r['b_hurt']} | {r['p_mcnemar']:.3g} |")
        lines += ["", "| depth | A | B | B helped | B hurt | McNemar p |", "|---|---|---|---|---|---|"]
        for r in out["depths"].itertuples():
            lines.append(f"| {r.depth} | {r.a_correct}/{r.n} | {r.b_correct}/{r.n} | {r.b_helped} | {r.b_hurt} | "
                         f"{r.p_mcnemar:.3g} |")
        cross = out["crossover"]
        lines.append("")
        lines.append(f"Crossover: {'depth ' + format(cross, '.2f') if cross is not None else 'none'}.")
    lines += ["", "Guardrail (Tier-1 arithmetic at loop 1, fp32, against a fresh base):", ""]
    for a in arms:
        g = a.guardrail
        lines.append(f"- {a.name}: " + (f"base {g['base']}/{g['total']} -> {g['checkpoint']}/{g['total']}"
                                        if g else "not read"))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", type=Path, nargs="+", help="the reference arm first, then the arms paired with it")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--results", default="final")
    ap.add_argument("--png", action="store_true")
    args = ap.parse_args(argv)
    if len(args.runs) < 2:
        ap.error("give at least two arms (the reference first)")
    arms = [load_arm(r, r / args.results) for r in args.runs]
    if len({a.name for a in arms}) < len(arms):  # recipes of one name: tell the arms apart by their directories
        arms = [load_arm(r, r / args.results, name=r.resolve().name) for r in args.runs]
    table = arm_table(arms)
    pairs = {b.name: compare_arms(arms[0], b) for b in arms[1:]}
    line = (f"python scripts/dense_controls.py {' '.join(map(str, args.runs))} --out {args.out}"
            + (f" --results {args.results}" if args.results != "final" else "") + (" --png" if args.png else ""))
    text = render(arms, table, pairs, line)
    args.out.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(args.out / "CONTROLS.md", text.encode())
    latency = {a.name: a.latency.to_dict("records") for a in arms if a.latency is not None}
    record = {"reference": arms[0].name, "arms": table.to_dict("records"), "latency": latency,
              "pairs": {k: {"pooled": v["pooled"], "depths": v["depths"].to_dict("records"),
                            "crossover": v["crossover"]} for k, v in pairs.items()},
              "guardrail": {a.name: a.guardrail for a in arms}, "supports": {a.name: a.support for a in arms}}
    clean = json.loads(json.dumps(record, default=float), parse_constant=lambda c: None)
    write_bytes_atomic(args.out / "controls.json", (json.dumps(clean, indent=1, sort_keys=True) + "\n").encode())
    if args.png:
        from workbench.plots.browser import Browser

        fig = controls_figure(table, support=max(a.support for a in arms))
        with Browser():
            fig.write_image(args.out / "controls.png", scale=1, width=1100, height=460)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
