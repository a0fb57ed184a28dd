"""Runs every benchmark, one process each, then rebuilds the results table.

    .venv/bin/python benchmarks/run_all.py [--model M] [--quick] [--threads N] [--only a,b]

Options other than `--only` are passed to every benchmark. Each benchmark runs in its own
process so that one's memory high-water mark or allocator state cannot leak into the next
(the readout-memory benchmark reads the process's peak RSS).
"""

from __future__ import annotations

import argparse
import subprocess
import sys

import common
import table

BENCHMARKS = table.ORDER


def main(argv: list[str] | None = None) -> int:
    """Runs the benchmarks in order; returns the number that failed."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default=",".join(BENCHMARKS), help="comma-separated benchmark names")
    p.add_argument("--out", default=None, help="results directory (default benchmarks/results)")
    args, rest = p.parse_known_args(argv)
    if args.out:
        rest += ["--out", args.out]
    names = [n for n in args.only.split(",") if n]
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        p.error(f"--only {args.only!r}: unknown {', '.join(unknown)}; accepted: {', '.join(BENCHMARKS)}")
    failed = 0
    for name in names:
        print(f"== {name}", flush=True)
        done = subprocess.run([sys.executable, str(common.BENCH_DIR / f"{name}.py"), *rest])
        failed += done.returncode != 0
    table.main([args.out] if args.out else [])
    return failed


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
