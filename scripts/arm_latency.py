"""Batch-1 latency of several arms measured side by side on the same rows (issue 15, the paper's Sec. 9.5).

    .venv/bin/python scripts/arm_latency.py RUN [RUN ...] [--results final] [--manifest probes/chase_n8_d1-7.jsonl]
        [--rows 8] [--repeats 5]

Loads every arm (fp32) and, per depth, row and pass, lets each arm answer the same row in turn (order reversed
on odd passes): `workbench.dense.interleaved_latency`. On a shared or virtualised CPU the time of one call drifts
by tens of percent over minutes, so arms timed in separate processes are not comparable; interleaved, the drift hits
all arms alike. Writes each arm's RUN/RESULTS/latency.parquet (replacing the one scripts/final_answers.py wrote,
which `workbench.analysis.arms.load_arm` and the claims read) and prints the medians and the within-pass ratios to the first
arm. Run it after final_answers.py (the results folder must exist).
"""
from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

import torch

from workbench.dense import interleaved_latency, latency_call
from workbench.io import write_bytes_atomic
from workbench.precision import detect_hardware
from workbench.runs import load_run
from workbench.tasks.manifest import read_manifest

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", type=Path, nargs="+")
    ap.add_argument("--results", default="final")
    ap.add_argument("--manifest", type=Path, default=ROOT / "probes" / "chase_n8_d1-7.jsonl")
    ap.add_argument("--rows", type=int, default=8, help="rows per depth")
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args(argv)
    calls, folders = {}, {}
    for run in a.runs:
        folder = run / a.results
        record = json.loads((folder / "final.json").read_text())   # written by scripts/final_answers.py
        looped, tok, info = load_run(run)
        name = info["recipe"].get("name", run.name)
        calls[name], folders[name] = latency_call(looped, tok, record["kind"]), folder
    rows = read_manifest(a.manifest).rows
    frame = interleaved_latency(calls, rows, per_depth=a.rows, repeats=a.repeats)
    machine = {"cpu": detect_hardware("cpu").name, "machine": platform.machine(), "threads": torch.get_num_threads(),
               "interleaved_with": list(calls), "rows_per_depth": a.rows, "repeats": a.repeats}
    for name, folder in folders.items():
        mine = frame[frame["arm"] == name].drop(columns=["arm"]).reset_index(drop=True)
        mine.to_parquet(folder / "latency.parquet", index=False)
        record = json.loads((folder / "final.json").read_text())
        record["median_latency_s"] = dict(zip(map(str, mine["depth"]), mine["median_s"]))
        record["latency"] = machine
        write_bytes_atomic(folder / "final.json", (json.dumps(record, indent=1, sort_keys=True) + "\n").encode())
    table = frame.pivot(index="depth", columns="arm", values="median_s") * 1e3
    ratio = frame.pivot(index="depth", columns="arm", values="ratio_to_first")
    print(f"median ms per row, batch 1, interleaved ({machine['cpu']}, {machine['threads']} threads):")
    print(table[list(calls)].round(0).to_string())
    print(f"\nwithin-pass ratio to {list(calls)[0]} (median over rows and passes):")
    print(ratio[list(calls)].round(3).to_string())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
