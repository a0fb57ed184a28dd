"""Frontier against trained support over the shipped specimens of one recipe family (issue 15, item 3).

    .venv/bin/python scripts/support_scaling.py [SPECIMEN ...] [--results arms] [--png]

Each specimen holds recipe.toml and a results folder with depth_matrix.parquet. The frontier is recomputed here from
the rows (`workbench.analysis.stats.frontier` at 0.60, 0.71, 0.80) so that every specimen is judged by the same code; a
frontier equal to the deepest depth read while that depth is still above the bar is *censored* (the task has no
deeper rows: with an alphabet of 8 the chase ends at depth 7). Writes training/support/SCALING.md and, with --png,
training/support/scaling.png.
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path

import pandas as pd

from workbench.analysis.arms import BARS, load_arm
from workbench.analysis.stats import frontier
from workbench.plots.arms import PAPER_BAND, frontier_support_figure

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ["training/keepers/smollm2-chase-s2", "training/keepers/smollm2-chase-s2-seed2", "training/keepers/smollm2-chase-s3",
           "training/keepers/smollm2-chase", "training/keepers/smollm2-chase-s6"]
OUT = ROOT / "training" / "support"


def table(specimens: list[Path], results: str) -> pd.DataFrame:
    out = []
    for spec in specimens:
        arm = load_arm(spec, spec / results)
        acc = arm.accuracy()
        n = int(arm.final.groupby("depth").size().min())
        for bar in BARS:
            f = frontier(acc, bar)
            out.append({"run": arm.name, "support": arm.support, "seed": arm.recipe.get("seed"), "bar": bar,
                        "frontier": f, "ratio": f / arm.support if not math.isnan(f) else math.nan,
                        "censored": bool(f == acc.index.max() and acc.iloc[-1] >= bar), "rows_per_depth": n,
                        "accuracy": ", ".join(f"{a:.2f}" for a in acc.to_numpy())})
    return pd.DataFrame(out)


def markdown(t: pd.DataFrame, argv_line: str) -> str:
    lines = ["# Frontier vs support", "", f"Regenerate: `{argv_line}`. Paper (retrofit Sec. 8.1): frontier / support "
             f"{PAPER_BAND[0]}-{PAPER_BAND[1]} at supports 4, 6, 8, 12.", "",
             "| run | support | seed | frontier at 0.71 | / support | at 0.60 | at 0.80 | rows per depth | final-answer "
             "accuracy, depths 1.. |", "|---|---|---|---|---|---|---|---|---|"]
    for run, g in t.groupby("run", sort=False):
        g = g.set_index("bar")
        r = g.loc[0.71]
        cens = " (censored)" if r["censored"] else ""
        lines.append(f"| {run} | {r['support']} | {r['seed']} | {r['frontier']:.2f}{cens} | {r['ratio']:.2f} | "
                     f"{g.loc[0.6, 'frontier']:.2f} ({g.loc[0.6, 'ratio']:.2f}) | {g.loc[0.8, 'frontier']:.2f} "
                     f"({g.loc[0.8, 'ratio']:.2f}) | {r['rows_per_depth']} | {r['accuracy']} |")
    main = t[t["bar"] == 0.71]
    read, cens = main[~main["censored"]], main[main["censored"]]
    lines += ["", f"At 0.71 the ratio spans {read['ratio'].min():.2f}-{read['ratio'].max():.2f} over supports "
              f"{', '.join(str(s) for s in sorted(read['support'].unique()))}."]
    if len(cens):
        lines[-1] += (" Censored (the deepest depth read is still above the bar, so the ratio is a lower bound): "
                      + "; ".join(f"{r.run} (support {r.support}) >= {r.ratio:.2f}" for r in cens.itertuples()) + ".")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("specimens", nargs="*", default=DEFAULT)
    ap.add_argument("--results", default="arms")
    ap.add_argument("--png", action="store_true")
    a = ap.parse_args(argv)
    specs = [ROOT / s if not Path(s).is_absolute() else Path(s) for s in a.specimens]
    t = table(specs, a.results)
    line = ("python scripts/support_scaling.py " + " ".join(a.specimens)
            + (f" --results {a.results}" if a.results != "arms" else "") + (" --png" if a.png else ""))
    text = markdown(t, line)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "SCALING.md").write_text(text)
    if a.png:
        from workbench.plots.browser import Browser

        with Browser():
            frontier_support_figure(t).write_image(OUT / "scaling.png", scale=1, width=700, height=440)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
