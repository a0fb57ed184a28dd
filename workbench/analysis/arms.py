"""Paired comparisons between trained arms on the same frozen rows (retrofit paper Sec. 6, 8.1, 9.4).

An *arm* is a run directory plus a battery results directory that holds `depth_matrix.parquet` (every row of one
frozen manifest read at loops 1..max depth; `probes/arms.toml` writes exactly that) or `final.parquet` (one final
answer per row, any arm, dense controls included: `scripts/final_answers.py`, which also writes per-depth latency)
and, where the battery ran the identity probe, `identity__guardrail.parquet`. `compare_arms(a, b)` pairs the two
arms' final answers (loop = depth)
by row id and returns per-depth counts with one-sided Fisher p-values in both directions and the exact McNemar p,
the frontier of each arm at the registered bar 0.71 and its 0.60 / 0.80 sensitivity, the interpolated depth at
which the arms' accuracy curves cross (if they do), and each arm's guardrail reading. Nothing here draws: the
figures are made by `workbench.plots.arms` from the frames returned here.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import tomllib

from workbench.analysis.results import read_table
from workbench.analysis.stats import fisher, frontier, paired_counts
from workbench.errors import WorkbenchError

BARS = (0.60, 0.71, 0.80)


@dataclass
class Arm:
    """One trained arm's reading: final answers per row, its trained support and its guardrail counts."""

    name: str
    run_dir: Path
    results_dir: Path
    final: pd.DataFrame                 # row_id, depth, correct (loop = depth)
    support: int                        # the deepest depth any training stage supervised
    manifest_sha256: str
    guardrail: dict | None = None       # {"base": int, "checkpoint": int, "total": int} from the identity probe
    recipe: dict = field(default_factory=dict)
    latency: pd.DataFrame | None = None     # depth, median_s, ... (scripts/final_answers.py), when measured

    def accuracy(self) -> pd.Series:
        return self.final.groupby("depth")["correct"].mean()


def trained_support(recipe: dict) -> int:
    """The deepest depth any stage of a recipe trained on."""
    depths = [d for s in recipe.get("stages", []) for d in s.get("depths", [])]
    if not depths:
        raise WorkbenchError("the recipe has no stage with depths; its trained support is unknown")
    return int(max(depths))


def load_arm(run_dir: str | Path, results: str | Path | None = None, name: str | None = None) -> Arm:
    """Reads an arm: `run_dir` (recipe.toml) and its battery results (default `run_dir/arms`)."""
    run_dir = Path(run_dir)
    results = Path(results) if results is not None else run_dir / "arms"
    recipe_path = run_dir / "recipe.toml"
    if not recipe_path.is_file():
        raise WorkbenchError(f"'{run_dir}' is not a run directory (no recipe.toml)")
    dm, fa = results / "depth_matrix.parquet", results / "final.parquet"
    recipe = tomllib.loads(recipe_path.read_text())
    latency = read_table(results / "latency.parquet") if (results / "latency.parquet").is_file() else None
    if dm.is_file():
        frame = read_table(dm)
        final = frame[frame["loop"] == frame["depth"]][["row_id", "depth", "correct"]].astype({"correct": bool})
        if final["row_id"].nunique() != frame["row_id"].nunique():
            raise WorkbenchError(f"'{dm}' lacks loop = depth for some rows")
        summary_path = results / "summary.json"
        summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
        manifests = summary.get("manifests", {})
        sha = ",".join(sorted(m.get("rows_sha256", "") for m in manifests.values()))
    elif fa.is_file():   # a dense control (or any arm) read by scripts/final_answers.py
        final = read_table(fa)[["row_id", "depth", "correct"]].astype({"correct": bool})
        sha = json.loads((results / "final.json").read_text())["rows_sha256"]
    else:
        raise WorkbenchError(f"'{results}' has neither depth_matrix.parquet nor final.parquet; run "
                             f"`workbench probe --checkpoint {run_dir} --battery probes/arms.toml --out {results}` "
                             f"(a looped arm) or `python scripts/final_answers.py {run_dir} --out {results}`")
    guard = None
    gpath = results / "identity__guardrail.parquet"
    if gpath.is_file():
        g = read_table(gpath)
        guard = {"base": int(g["base_correct"].sum()), "checkpoint": int(g["checkpoint_correct"].sum()),
                 "total": len(g)}
    return Arm(name or recipe.get("name", run_dir.name), run_dir, results, final.reset_index(drop=True),
               trained_support(recipe), sha, guard, recipe, latency)


def crossover(acc_a: pd.Series, acc_b: pd.Series) -> float | None:
    """The first depth at which the sign of acc_a - acc_b changes, linearly interpolated (None if it never does).

    Depths where the arms tie are skipped: a crossing is a strict change of the leading arm.
    """
    diff = (acc_a - acc_b).dropna().sort_index()
    lead = [(int(d), float(v)) for d, v in diff.items() if v != 0]
    for (d0, v0), (d1, v1) in zip(lead, lead[1:]):
        if (v0 > 0) != (v1 > 0):
            return d0 + v0 / (v0 - v1) * (d1 - d0)
    return None


def compare_arms(a: Arm, b: Arm) -> dict:
    """Returns {"depths": per-depth frame, "frontier": per-arm frontier frame, "crossover": float|None,
    "guardrail": per-arm dict, "pooled": dict}. Rows are paired by row id; both arms must hold the same rows."""
    paired = a.final.merge(b.final, on=["row_id", "depth"], suffixes=("_a", "_b"), validate="one_to_one")
    if len(paired) != len(a.final) or len(paired) != len(b.final):
        raise WorkbenchError(f"arms '{a.name}' and '{b.name}' do not hold the same rows "
                             f"({len(a.final)} and {len(b.final)} rows, {len(paired)} in common)")
    if a.manifest_sha256 and b.manifest_sha256 and a.manifest_sha256 != b.manifest_sha256:
        raise WorkbenchError(f"arms '{a.name}' and '{b.name}' were read on different manifests")

    def counts(depth, g):
        c = paired_counts(g["correct_a"], g["correct_b"])
        ca, cb, n = c.a_correct, c.b_correct, c.n
        return {"depth": depth, "n": n, "a_correct": ca, "b_correct": cb,
                "a_acc": ca / n, "b_acc": cb / n,
                "p_fisher_a_greater": fisher(ca, n, cb, n, "greater"),
                "p_fisher_b_greater": fisher(cb, n, ca, n, "greater"),
                "b_helped": c.helped, "b_hurt": c.hurt, "p_mcnemar": c.p_mcnemar}

    per_depth = pd.DataFrame([counts(int(d), g) for d, g in paired.groupby("depth")])
    support = max(a.support, b.support)
    groups = {"all": paired, "inside_support": paired[paired["depth"] <= support],
              "beyond_support": paired[paired["depth"] > support]}
    pooled = {k: counts(k, g) for k, g in groups.items() if len(g)}
    fr = []
    for arm in (a, b):
        acc = arm.accuracy()
        for bar in BARS:
            f = frontier(acc, bar)
            fr.append({"arm": arm.name, "bar": bar, "frontier": f, "support": arm.support,
                       "frontier_over_support": f / arm.support if not math.isnan(f) else math.nan,
                       "censored": bool(f == acc.index.max() and acc.iloc[-1] >= bar)})
    return {"arms": (a.name, b.name), "depths": per_depth, "frontier": pd.DataFrame(fr),
            "crossover": crossover(a.accuracy(), b.accuracy()),
            "guardrail": {a.name: a.guardrail, b.name: b.guardrail}, "pooled": pooled}
