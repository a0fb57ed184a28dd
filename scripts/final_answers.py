"""Final answers and per-depth latency of any arm on a frozen manifest: looped, direct or scratchpad (issue 15).

    .venv/bin/python scripts/final_answers.py RUN --out RUN/arms [--manifest probes/chase_n8_d1-7.jsonl]
        [--latency-rows 4] [--repeats 3]

The arm's kind comes from its recipe (a looped run, or a dense control whose stages are all `direct` or
`scratchpad`). Every manifest row is read in fp32: the looped arm at loop = depth (the forced read), the direct arm at
loop 1, the scratchpad by greedy decoding of d symbols (workbench.dense). Latency is one row at a time (batch 1, the
paper's interactive setting), `--latency-rows` rows per depth, median of `--repeats` passes after a warm-up call:
the looped arm's forced-depth call (`read_final(loops=d)`: d loops, the Coda once), the direct arm's one pass,
the scratchpad's prompt pass plus d - 1 cached decode steps. Writes OUT/final.parquet (row_id, depth, target,
predicted, correct), OUT/latency.parquet and OUT/final.json (kind, support, manifest digest, CPU and threads,
the fp32 guardrail at loop 1 against the base, also as OUT/identity__guardrail.parquet),
which `workbench.analysis.arms.load_arm` reads beside (or instead of) a depth matrix.
"""
from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

import pandas as pd
import torch

from workbench.analysis.arms import trained_support
from workbench.dense import KINDS, latency_by_depth, latency_call, read_direct, read_scratchpad
from workbench.io import write_bytes_atomic
from workbench.models import load_base
from workbench.precision import detect_hardware
from workbench.probes.identity import guardrail_table
from workbench.runs import load_run
from workbench.tasks.manifest import read_manifest, rows_sha256
from workbench.tasks.reader import read_rows

ROOT = Path(__file__).resolve().parents[1]


def arm_kind(recipe: dict) -> str:
    kinds = {s["kind"] for s in recipe["stages"]}
    dense = kinds & set(KINDS)
    return dense.pop() if dense else "looped"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--manifest", type=Path, default=ROOT / "probes" / "chase_n8_d1-7.jsonl")
    ap.add_argument("--latency-rows", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=16)
    a = ap.parse_args(argv)
    looped, tok, info = load_run(a.run)        # fp32: the numbers a paper would quote
    kind = arm_kind(info["recipe"])
    rows = read_manifest(a.manifest).rows
    if kind == "looped":
        def answers(rs):
            frames = []
            for d in sorted({r["depth"] for r in rs}):
                sub = [r for r in rs if r["depth"] == d]
                f = read_rows(looped, tok, sub, loops=d, batch_size=a.batch_size).frame()
                frames.append(f[f["loop"] == f["depth"]])
            out = pd.concat(frames, ignore_index=True)[["row_id", "depth", "target", "predicted", "correct"]]
            return out.astype({"correct": bool})

        final = answers(rows)
    else:
        final = (read_direct if kind == "direct" else read_scratchpad)(looped, tok, rows, a.batch_size)
    with torch.no_grad():
        latency = latency_by_depth(latency_call(looped, tok, kind), rows, per_depth=a.latency_rows,
                                   repeats=a.repeats)
        base_spec = info["retrofit"]["base"]
        reference, _ = load_base(base_spec["spec"], dtype=getattr(torch, base_spec["dtype"]),
                                 attn_implementation=base_spec["attn_implementation"])
        guard = guardrail_table(looped, reference, tok, batch_size=a.batch_size)  # loop 1 vs the base, fp32
    a.out.mkdir(parents=True, exist_ok=True)
    guard.to_parquet(a.out / "identity__guardrail.parquet", index=False)
    final.drop(columns=[c for c in ("written", "chain") if c in final]).to_parquet(a.out / "final.parquet",
                                                                                     index=False)
    latency.to_parquet(a.out / "latency.parquet", index=False)
    record = {"kind": kind, "support": trained_support(info["recipe"]), "rows": len(final),
              "rows_sha256": rows_sha256(rows), "manifest": a.manifest.name,
              "cpu": detect_hardware("cpu").name, "machine": platform.machine(), "threads": torch.get_num_threads(),
              "accuracy_by_depth": {str(d): float(g["correct"].mean()) for d, g in final.groupby("depth")},
              "median_latency_s": dict(zip(map(str, latency["depth"]), latency["median_s"])),
              "guardrail": {"base": int(guard["base_correct"].sum()), "checkpoint": int(guard["checkpoint_correct"].sum()),
                            "total": len(guard)}}
    write_bytes_atomic(a.out / "final.json", (json.dumps(record, indent=1, sort_keys=True) + "\n").encode())
    print(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
