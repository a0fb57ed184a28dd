"""Writes docs/results/patching.md from the committed patching batteries (issue 46); `--check` fails if it differs.

    .venv/bin/python scripts/patching_page.py            # regenerate the page
    .venv/bin/python scripts/patching_page.py --check    # exit 1 when the committed page is stale

Every number on the page is read here from a specimen's `battery-patching/` tables (written by
`workbench probe --checkpoint <specimen> --battery patching --out <specimen>/battery-patching`), so the page
cannot say what the tables do not.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from workbench.analysis.headlines import attribution as trust
from workbench.analysis.results import load_results
from workbench.probes.attribution import agreement, stored_check

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "results" / "patching.md"
SPECIMENS = [  # (label, results directory, what it is)
    ("chase keeper", "training/keepers/smollm2-chase/battery-patching",
     "SmolLM2-135M, block 12:24 looped, LoRA, trained on the chase to support 4 (chain-supervised: loop t reads x_t)"),
    ("chase keeper: the ledger's column on 16 pairs a step", "training/keepers/smollm2-chase/battery-patching-steps",
     "the same keeper, only the read-position state after the block's last layer (23) patched, for entry edits: "
     "what the claim block-applies-the-rule-patching reads"),
    ("annealed specimen", "training/keepers/smollm2-chase-anneal/battery-patching",
     "the keeper continued outcome-only (the retrofit paper's Sec. 5.2 anneal: the intermediate loops' labels "
     "ramped from 1 to 0 over 40 steps, then 160 steps grading only the final answer)"),
    ("park model", "training/keepers/smollm2-chase-park-count/battery-patching",
     "the keeper continued to park: the answer x_d graded at every loop d..8, with loop codes (smollm2-chase-park-count)"),
    ("tiny Inkling2Loop, random weights", "training/native/tiny-inkling2-loop/battery-patching",
     "transformers' Inkling2Loop built tiny (4 layers, layers 1-2 looped 3 times) with random weights: what runs, "
     "not what a trained model computes"),
]
COMMAND = "workbench probe --checkpoint {ckpt} --battery {battery} --out {out}"


def _f(x, digits: int = 2) -> str:
    return "n/a" if x is None or pd.isna(x) else f"{x:.{digits}f}"


def _iv(r) -> str:
    return f"{_f(r['recovered'])} [{_f(r['low'])}, {_f(r['high'])}]"


def section(label: str, folder: Path, about: str) -> list[str]:
    rel = folder.relative_to(ROOT)
    if not (folder / "summary.json").is_file():
        ckpt = str(rel.parent)
        return [f"## {label}", "", f"{about}.", "", f"Not run yet: no `{rel}/summary.json`. It is one command, about "
                "25 minutes on this 2-core CPU (the keeper's battery time above): `"
                + COMMAND.format(ckpt=ckpt, battery="patching", out=rel) + "`.", ""]
    summary = json.loads((folder / "summary.json").read_text())
    ckpt = summary["checkpoint"]["path"]
    out = [f"## {label}", "", f"{about}. Results: `{rel}/` "
           f"({COMMAND.format(ckpt=ckpt, battery=Path(summary['battery']).stem, out=rel)}; "
           f"{summary.get('wall_s', 'n/a')} s on {summary.get('device', {}).get('name', 'this machine')}).", ""]
    probes = summary["probes"]
    if "patching" in probes and "status" not in probes["patching"]:
        out += _patching(folder, probes["patching"])
    if "attribution" in probes and "status" not in probes["attribution"]:
        out += _attribution(folder, probes["attribution"], summary.get("seed", 0))
    if "paths" in probes and "status" not in probes["paths"]:
        out += _paths(folder, probes["paths"])
    for name in ("patching", "attribution", "paths"):
        if probes.get(name, {}).get("status") == "not_applicable":
            out += [f"`{name}`: not applicable ({probes[name]['reason']}).", ""]
    return out


def _patching(folder: Path, result: dict) -> list[str]:
    pairs = pd.read_parquet(folder / "patching__pairs.parquet")
    steps = pd.read_parquet(folder / "patching__steps.parquet")
    grid = pd.read_parquet(folder / "patching__grid.parquet")
    kinds = ", ".join(f"{n} {k}" for k, n in pairs["corruption"].value_counts().sort_index().items())
    sep = (pairs["ld_clean"] - pairs["ld_corrupted"])
    out = ["### The exact grid", "",
           f"{len(pairs)} pairs ({kinds} edits). The clean answer's margin over the corrupted one, LD_clean − "
           f"LD_corrupted: median {sep.median():.2f} (range {sep.min():.2f} to {sep.max():.2f}).", "",
           "**When an edited entry reaches the read position's state** (`patching__steps`: the read-position "
           "residual after the block's last layer patched at loop t, for an edit to the entry loop k reads; "
           "recovered share [95% row bootstrap]):", ""]
    loops = sorted(steps["loop"].unique())
    out += ["| step k | " + " | ".join(f"loop {t}" for t in loops) + " | pairs |",
            "|---|" + "---|" * len(loops) + "---|"]
    for k, g in steps.groupby("step"):
        by = g.set_index("loop")
        out.append(f"| {k} | " + " | ".join(_iv(by.loc[t]) if t in by.index else "" for t in loops)
                   + f" | {int(g['n'].max())} |")
    first = result.get("first_recovering_loop", {})
    out += ["", "First loop whose read-position state restores at least 0.5 of the margin: "
            + ", ".join(f"step {k}: {'loop ' + str(v) if v is not None else 'none'}" for k, v in first.items()) + ".",
            "", "**Where the attention and MLP outputs carry the edit** (the five cells of the grid that recover "
            "most, per corruption; the residual is left out, since it carries everything that came before):", ""]
    comp = grid[grid["component"] != "resid"]
    if comp.empty:
        out = out[:-3] + [""]
        out += [f"Headline: {result['headline']['sentence']}", ""]
        return out
    out += ["| corruption | component | loop | layer | positions | recovered [95%] | pairs |", "|---|---|---|---|---|---|---|"]
    for corruption, g in comp.groupby("corruption"):
        for r in g.sort_values("recovered", ascending=False).head(5).to_dict("records"):
            out.append(f"| {corruption} | {r['component']} | {r['loop']} | {r['layer']} | {r['position']} | {_iv(r)} | "
                       f"{r['n']} |")
    out += ["", "**By position class** (the largest share over loops and layers, per component):", "",
            "| corruption | position | resid | attn | mlp |", "|---|---|---|---|---|"]
    for (corruption, position), g in grid.groupby(["corruption", "position"], sort=False):
        cells = []
        for c in ("resid", "attn", "mlp"):
            part = g[g["component"] == c]
            if part.empty:
                cells.append("")
                continue
            r = part.sort_values("recovered", ascending=False).iloc[0]
            cells.append(f"{_f(r['recovered'])} (loop {r['loop']}, layer {r['layer']})")
        out.append(f"| {corruption} | {position} | " + " | ".join(cells) + " |")
    out += ["", f"Headline: {result['headline']['sentence']}", ""]
    return out


RULE = ("Trust rule (issue 58, fixed before any table was read; `workbench/analysis/headlines/attribution.py`): per "
        "corruption and component, a cell clears the noise floor when the exact grid's 95% row-bootstrap interval "
        f"across the check pairs excludes 0 and its |share| is at least {trust.FLOOR} of the table's largest; with fewer "
        f"than {trust.MIN_CELLS} such cells the table is not comparable (more pairs in the exact grid would make it so). "
        f"On the cleared cells the map is trusted when Spearman's ρ (average ranks) ≥ {trust.SPEARMAN_BAR} and its "
        f"one-sided permutation p ≤ {trust.P_BAR} ({trust.N_PERM:,} permutations of the gradient values, a generator "
        f"seeded {trust.PERM_SEED}); a map constant on them has no ranking. Sign agreement and the top-10 overlap are "
        "information only.")


def _attribution(folder: Path, result: dict, seed: int) -> list[str]:
    """The agreement re-read from the stored cells under the current trust rule (a run before issue 58 stored the
    replaced rule's verdicts in attribution__agreement: they are shown beside it)."""
    tables = load_results(folder)
    stored = tables["attribution__agreement"]
    tables["attribution__agreement"] = agree = agreement(stored_check(tables, seed))
    cost = tables["attribution__cost"].iloc[0]
    before = "verdict" not in stored.columns
    out = ["### The gradient map against the exact grid", "",
           f"{result['pairs']} pairs mapped by gradients; the exact grid also run on {int(cost['pairs'])} of them "
           f"({int(cost['cells'])} cells). {RULE}"
           + (" This run stored the rule it replaced (Spearman ≥ 0.8 over every cell and 7 of the exact grid's 10 "
              "largest cells among the gradient map's 10 largest; last column); the table re-reads the stored cells, "
              "the exact interval from the same run's per-pair `patching` values of the check pairs." if before else ""),
           "", "| corruption | component | cells | pairs | cleared | Spearman | p | signs agree | top-10 shared | "
           "verdict |" + (" issue 46 rule |" if before else ""), "|---|---|---|---|---|---|---|---|---|---|"
           + ("---|" if before else "")]
    was = stored.set_index(["corruption", "component"])["trusted"] if before else None
    for r in agree.to_dict("records"):
        reason = f" ({r['reason']})" if r["reason"] else ""
        out.append(f"| {r['corruption']} | {r['component']} | {r['cells']} | {r['pairs']} | {r['cleared']} | "
                   f"{_f(r['spearman'])} | {_f(r['p'], 4)} | {_f(r['sign_share'])} | {r['top10']} of {r['top_k']} | "
                   f"{r['verdict']}{reason} |"
                   + (f" {'trusted' if was[(r['corruption'], r['component'])] else 'not trusted'} |" if before else ""))
    if pd.notna(cost["ratio"]):
        out += ["", f"Cost on the same {int(cost['pairs'])} pairs, measured in the same run: exact "
                f"{cost['exact_s']:.0f} s ({cost['exact_s'] / cost['pairs']:.0f} s a pair), gradient "
                f"{cost['gradient_s']:.1f} s ({cost['ratio']:.0f}x)."]
    out += ["", f"Headline: {trust.headline(tables).sentence}", ""]
    return out


def _paths(folder: Path, result: dict) -> list[str]:
    routes = pd.read_parquet(folder / "paths__routes.parquet")
    out = ["### Paths: through the later loops, or straight into the readout", "",
           f"{result['pairs']} pairs. The clean state leaving loop t, read at the last loop (recovered share [95%]):", "",
           "| corruption | t | read at | through the later loops | read position only | straight into the readout | reading |",
           "|---|---|---|---|---|---|---|"]
    reading = result.get("reading", {})
    for (corruption, t), g in routes.groupby(["corruption", "source"]):
        u = g["read"].max()
        last = g[g["read"] == u].set_index("route")
        cell = [(_iv(last.loc[r]) if r in last.index else "") for r in ("loops", "loops_read", "readout")]
        out.append(f"| {corruption} | {t} | {u} | " + " | ".join(cell) + f" | {reading.get(f'{corruption}/t={t}', '')} |")
    out += ["", f"Headline: {result['headline']['sentence']}", ""]
    return out


def render() -> str:
    lines = ["# Where the answer is made: patching, its gradient estimate, and paths (issue 46)", "",
             "Generated by `scripts/patching_page.py` from the committed result tables; "
             "`tests/test_results_pages.py` fails when it is stale. Definitions: docs/analyses.md (patching, "
             "attribution, paths). Every pair is a depth-4 chase row (the keepers' trained support) and a twin with "
             "one chain entry or the start changed; the margin is read after 4 loops. CPU figures: 2-core AMD EPYC.",
             ""]
    for label, folder, about in SPECIMENS:
        lines += section(label, ROOT / folder, about)
    return "\n".join(lines).rstrip() + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed page differs")
    args = parser.parse_args()
    text = render()
    if args.check:
        if not PAGE.is_file() or PAGE.read_text() != text:
            sys.stderr.write(f"{PAGE.relative_to(ROOT)} is stale: run scripts/patching_page.py\n")
            return 1
        return 0
    PAGE.write_text(text)
    sys.stdout.write(f"wrote {PAGE.relative_to(ROOT)}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
