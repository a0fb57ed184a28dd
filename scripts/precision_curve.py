"""Does the default recipe trained in bf16 follow the fp32 run's curve? (issue 13, item 4)

    python scripts/precision_curve.py FP32_METRICS BF16_METRICS [--until 350] [--out DIR] [--png]

Both runs use the same recipe and seed, so they see the same batches in the same order and differ only in
arithmetic. Compared: the per-loop training CE in windows of 25 steps, the step at which loop 2 installs (its
CE, averaged over 10 steps, first below 0.1), and every held-out evaluation both runs reached, cell by cell
(64 rows per depth; the difference is judged against a two-proportion 95% interval). Writes COMPARISON.md (and
curve.png with --png, through kaleido and the system Chromium) into --out.
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

WINDOW = 25
INSTALL_CE = 0.1
INSTALL_SMOOTH = 10


def load(path: Path, until: int) -> tuple[list[dict], list[dict]]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    train = [r for r in rows if r.get("kind") == "train" and r["step"] <= until]
    evals = [r for r in rows if r.get("kind") == "eval" and r["step"] <= until]
    return train, evals


def loop_ce(train: list[dict], loop: int) -> dict[int, float]:
    """step -> CE of loop `loop` (1-based) on steps whose batch ran that deep."""
    return {r["step"]: r["loop_ce"][loop - 1] for r in train if len(r["loop_ce"]) >= loop}


def windows(series: dict[int, float], until: int) -> list[tuple[int, int, float | None, int]]:
    out = []
    for lo in range(0, until, WINDOW):
        hi = min(lo + WINDOW, until)
        vals = [v for s, v in series.items() if lo < s <= hi]
        out.append((lo + 1, hi, sum(vals) / len(vals) if vals else None, len(vals)))
    return out


def install_step(series: dict[int, float]) -> int | None:
    steps = sorted(series)
    for i in range(INSTALL_SMOOTH - 1, len(steps)):
        win = [series[s] for s in steps[i - INSTALL_SMOOTH + 1:i + 1]]
        if sum(win) / len(win) < INSTALL_CE:
            return steps[i]
    return None


def diff_interval(p1: float, p2: float, n: int) -> float:
    """Half-width of the 95% normal interval of p1 - p2 for two proportions of n rows each (0.5 floor on counts)."""
    q1 = (p1 * n + 0.5) / (n + 1)
    q2 = (p2 * n + 0.5) / (n + 1)
    return 1.96 * math.sqrt(q1 * (1 - q1) / n + q2 * (1 - q2) / n)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("fp32", type=Path)
    ap.add_argument("bf16", type=Path)
    ap.add_argument("--until", type=int, default=350)
    ap.add_argument("--per-depth", type=int, default=64)
    ap.add_argument("--out", type=Path, default=Path("training/attempts/bf16-vs-fp32"))
    ap.add_argument("--png", action="store_true")
    a = ap.parse_args(argv)

    f_train, f_eval = load(a.fp32, a.until)
    b_train, b_eval = load(a.bf16, a.until)
    reached = min(f_train[-1]["step"], b_train[-1]["step"])
    lines = [f"# bf16 vs fp32: the default recipe's first {reached} steps", "",
             f"Same recipe, same seed, same batches; `{a.fp32}` (fp32) against `{a.bf16}` (bf16). "
             f"Regenerate: `python scripts/precision_curve.py {a.fp32} {a.bf16} --until {a.until}"
             f"{' --png' if a.png else ''}`.", ""]
    max_loop = max(len(r["loop_ce"]) for r in f_train + b_train)
    lines += ["## Training CE per loop, mean over windows of 25 steps", "",
              "| steps | " + " | ".join(f"loop {t} fp32 | loop {t} bf16" for t in range(1, max_loop + 1)) + " |",
              "|---|" + "---|---|" * max_loop]
    series = {(p, t): loop_ce(tr, t) for p, tr in (("fp32", f_train), ("bf16", b_train))
              for t in range(1, max_loop + 1)}
    wins = {k: windows(v, reached) for k, v in series.items()}
    for i, (lo, hi, _, _) in enumerate(wins[("fp32", 1)]):
        cells = []
        for t in range(1, max_loop + 1):
            for p in ("fp32", "bf16"):
                m = wins[(p, t)][i][2]
                cells.append("-" if m is None else f"{m:.3f}")
        lines.append(f"| {lo}-{hi} | " + " | ".join(cells) + " |")
    # The largest per-window gap in loop-1 CE, relative to the windows' own step-to-step spread.
    lines += ["", "## Where loop 2 installs", ""]
    inst = {p: install_step(series[(p, 2)]) if max_loop >= 2 else None for p in ("fp32", "bf16")}
    for p in ("fp32", "bf16"):
        lines.append(f"- {p}: loop-2 CE (mean of {INSTALL_SMOOTH} consecutive depth-2 steps) first below "
                     f"{INSTALL_CE} at step {inst[p] if inst[p] is not None else 'never (within the window)'}")
    lines += ["", "## Held-out evaluations both runs reached (accuracy of the active label)", ""]
    verdict_cells = []
    for fe in f_eval:
        be = next((e for e in b_eval if e["step"] == fe["step"]), None)
        if be is None:
            continue
        lines += [f"### step {fe['step']}", "", "| depth | loop | fp32 | bf16 | difference | 95% half-width | within |",
                  "|---|---|---|---|---|---|---|"]
        for d, per_loop in fe["acc"].items():
            for t, p1 in per_loop.items():
                p2 = be["acc"][d][t]
                hw = diff_interval(p1, p2, a.per_depth)
                ok = abs(p1 - p2) <= hw
                verdict_cells.append(ok)
                lines.append(f"| {d} | {t} | {p1 * a.per_depth:.0f}/{a.per_depth} | {p2 * a.per_depth:.0f}/"
                             f"{a.per_depth} | {p2 - p1:+.3f} | {hw:.3f} | {'yes' if ok else 'NO'} |")
        lines.append("")
    lines += ["## Verdict", "",
              f"- held-out cells within the 95% two-proportion interval: {sum(verdict_cells)}/{len(verdict_cells)}",
              f"- loop 2 installs at step {inst['fp32']} (fp32) and {inst['bf16']} (bf16)", ""]
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "COMPARISON.md").write_text("\n".join(lines))
    print("\n".join(lines))
    if a.png:
        import plotly.graph_objects as go

        from workbench.plots.browser import Browser
        from workbench.plots.theme import COLORWAY, apply_theme

        fig = go.Figure()
        for (p, t), s in series.items():
            if not s:
                continue
            xs = sorted(s)
            # A 10-step running mean over the steps that ran that deep.
            ys = [sum(s[x] for x in xs[max(0, i - 9):i + 1]) / len(xs[max(0, i - 9):i + 1]) for i in range(len(xs))]
            fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name=f"loop {t} {p}",
                                     line=dict(color=COLORWAY[t - 1], dash="solid" if p == "fp32" else "dash",
                                               width=1.5)))
        fig.update_yaxes(type="log", title="training CE (10-step running mean)")
        fig.update_xaxes(title="step")
        fig.update_layout(title=f"Same recipe, same batches: fp32 (solid) vs bf16 (dashed); loop 2 installs at "
                                f"{inst['fp32']} / {inst['bf16']}", width=900, height=420)
        with Browser():
            apply_theme(fig).write_image(a.out / "curve.png", scale=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
