"""Two trained arms side by side on the same frozen rows (issue 15: LoRA vs full block).

    .venv/bin/python scripts/compare_arms.py RUN_A RUN_B --out DIR [--results arms] [--png]

Each RUN holds recipe.toml and a results folder (default `arms/`, written by
`workbench probe --checkpoint RUN --battery probes/arms.toml --out RUN/arms`). Writes DIR/COMPARISON.md (per-depth
counts with one-sided Fisher both ways and the exact McNemar p, pooled inside / beyond the support, the frontier of
each arm at 0.71 with its 0.60 / 0.80 sensitivity, the crossover depth, the guardrail readings), comparison.json
and, with --png, arms.png (kaleido + the system Chromium).
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from workbench.analysis.arms import compare_arms, load_arm
from workbench.io import write_bytes_atomic
from workbench.plots.arms import arms_accuracy_figure


def _fmt_p(p: float) -> str:
    return f"{p:.3g}"


def render(out: dict, a, b, argv_line: str) -> str:
    na, nb = out["arms"]
    lines = [f"# {na} vs {nb}", "", f"Regenerate: `{argv_line}`. Rows paired by id on the frozen manifest; A = {na} "
             f"(support {a.support}), B = {nb} (support {b.support}).", "",
             "| depth | rows | A correct | B correct | B helped | B hurt | McNemar p | Fisher p (A > B) | "
             "Fisher p (B > A) |", "|---|---|---|---|---|---|---|---|---|"]
    for r in out["depths"].itertuples():
        lines.append(f"| {r.depth} | {r.n} | {r.a_correct} ({r.a_acc:.3f}) | {r.b_correct} ({r.b_acc:.3f}) | "
                     f"{r.b_helped} | {r.b_hurt} | {_fmt_p(r.p_mcnemar)} | {_fmt_p(r.p_fisher_a_greater)} | "
                     f"{_fmt_p(r.p_fisher_b_greater)} |")
    lines += ["", "| pooled | rows | A correct | B correct | B helped | B hurt | McNemar p |", "|---|---|---|---|---|---|---|"]
    for k, r in out["pooled"].items():
        lines.append(f"| {k.replace('_', ' ')} | {r['n']} | {r['a_correct']} | {r['b_correct']} | {r['b_helped']} | "
                     f"{r['b_hurt']} | {_fmt_p(r['p_mcnemar'])} |")
    lines += ["", "| arm | bar | frontier | support | frontier / support | censored by the deepest depth |",
              "|---|---|---|---|---|---|"]
    for r in out["frontier"].itertuples():
        lines.append(f"| {r.arm} | {r.bar:.2f} | {r.frontier:.2f} | {r.support} | {r.frontier_over_support:.2f} | "
                     f"{'yes' if r.censored else 'no'} |")
    cross = out["crossover"]
    lines += ["", f"Crossover: {'depth ' + format(cross, '.2f') if cross is not None else 'the arms do not cross'} "
              "(first strict change of the leading arm, linearly interpolated).", "", "Guardrail (Tier-1 arithmetic "
              "at loop 1, fp32):"]
    for name, g in out["guardrail"].items():
        lines.append(f"- {name}: " + (f"base {g['base']}/{g['total']} -> {g['checkpoint']}/{g['total']}" if g else
                                      "not read"))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_a", type=Path)
    ap.add_argument("run_b", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--results", default="arms")
    ap.add_argument("--png", action="store_true")
    args = ap.parse_args(argv)
    a = load_arm(args.run_a, args.run_a / args.results)
    b = load_arm(args.run_b, args.run_b / args.results)
    out = compare_arms(a, b)
    line = (f"python scripts/compare_arms.py {args.run_a} {args.run_b} --out {args.out}"
            + (f" --results {args.results}" if args.results != "arms" else "") + (" --png" if args.png else ""))
    text = render(out, a, b, line)
    args.out.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(args.out / "COMPARISON.md", text.encode())
    record = {"arms": list(out["arms"]), "supports": [a.support, b.support], "crossover": out["crossover"],
              "depths": out["depths"].to_dict("records"), "frontier": out["frontier"].to_dict("records"),
              "pooled": out["pooled"], "guardrail": out["guardrail"]}
    clean = json.loads(json.dumps(record, default=float), parse_constant=lambda c: None)
    write_bytes_atomic(args.out / "comparison.json", (json.dumps(clean, indent=1, sort_keys=True) + "\n").encode())
    fig = arms_accuracy_figure(out["depths"], out["arms"], (a.support, b.support),
                               None if out["crossover"] is None or math.isnan(out["crossover"]) else out["crossover"])
    if args.png:
        from workbench.plots.browser import Browser

        with Browser():
            fig.write_image(args.out / "arms.png", scale=1, width=900, height=420)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
