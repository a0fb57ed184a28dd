"""Readout memory: the candidate-restricted answer-position read against the full logit stack.

    .venv/bin/python benchmarks/readout_memory.py [--model smollm2-135m-instruct] [--quick]

Both read the same rows through loops 1..T. The workbench's read scores only the task's
candidate tokens at the answer position: scores [rows, T, 1, C]. The reference
implementation kept full-vocabulary logits at every position of every loop: [rows, T, seq,
vocab], produced here by the same `looped.read` with every position and no candidates.

Three measures for each, all under `torch.no_grad()`:
- the output tensor's bytes (exact);
- the CPU allocator's peak live bytes during the call (torch profiler memory events; the
  kept output included, the model's weights not);
- the process's peak RSS rise during the call (VmHWM after resetting it, minus RSS before).
The full stack is measured at `--rows` rows and its output size also computed for the
issue's 64 rows (it grows linearly in rows; the restricted read's scores do too).
"""

from __future__ import annotations

import gc
import sys
import time

import common
import torch

NAME = "readout_memory"
FULL = dict(rows=4, loops=14, alphabet=8, reps=1, warmup=0, extrapolate_rows=64)
QUICK = dict(rows=2, loops=6, alphabet=8, reps=1, warmup=0, extrapolate_rows=64)
TARGET = 100.0


def measure(fn) -> dict:
    """Output bytes, allocator peak and RSS peak rise of one call of `fn` (returns a tensor)."""
    gc.collect()
    reset = common.reset_peak_rss()
    before = common.rss_bytes()
    start = time.perf_counter()
    out, alloc_peak = common.allocator_peak(fn)
    seconds = time.perf_counter() - start
    rss_rise = common.peak_rss_bytes() - before if reset else None
    result = {"shape": list(out.shape), "output_bytes": out.numel() * out.element_size(),
              "allocator_peak_bytes": alloc_peak, "rss_peak_rise_bytes": rss_rise, "seconds": seconds}
    del out
    gc.collect()
    return result


def run(looped, ids, mask, cand, loops: int, extrapolate_rows: int) -> dict:
    """Measures both readouts on the same rows; returns sizes and ratios (full / restricted)."""
    rows, seq = ids.shape
    every = torch.arange(seq).unsqueeze(0).expand(rows, -1)

    def restricted():
        return looped.read(ids, mask, loops=loops, candidates=cand).scores

    def full():
        return looped.read(ids, mask, loops=loops, positions=every).scores

    with torch.no_grad():
        common.allocator_peak(restricted)  # warm-up: first-call and profiler start-up costs land here
        small = measure(restricted)
        big = measure(full)
    ratios = {k: (big[k] / small[k] if big[k] and small[k] else None)
              for k in ("output_bytes", "allocator_peak_bytes", "rss_peak_rise_bytes")}
    vocab = looped.base.lm_head.weight.shape[0]
    scale = extrapolate_rows * 4  # float32
    return {"rows": rows, "seq": seq, "loops": loops, "candidates": len(cand), "vocab": vocab,
            "restricted": small, "full_stack": big, "ratios": ratios,
            "extrapolated": {"rows": extrapolate_rows,
                             "restricted_output_bytes": scale * loops * len(cand),
                             "full_stack_output_bytes": scale * loops * seq * vocab},
            "target_met": ratios["allocator_peak_bytes"] is not None and ratios["allocator_peak_bytes"] >= TARGET}


def _mb(n) -> str:
    if n is None:
        return "n/a"
    return f"{n / 2 ** 20:,.1f} MiB" if n >= 2 ** 20 else f"{n / 2 ** 10:,.1f} KiB"


def report(r: dict, model: str, block: str) -> None:
    """Prints both readouts' sizes and the ratios."""
    print(f"readout memory: {model} block {block}, {r['rows']} rows x {r['seq']} tokens, T = {r['loops']}, "
          f"C = {r['candidates']}, vocab {r['vocab']:,}")
    for name in ("restricted", "full_stack"):
        m = r[name]
        print(f"  {name:<11} scores {m['shape']}: output {_mb(m['output_bytes'])}, allocator peak "
              f"{_mb(m['allocator_peak_bytes'])}, RSS peak rise {_mb(m['rss_peak_rise_bytes'])} ({m['seconds']:.1f} s)")
    q = r["ratios"]
    fmt = lambda x: "n/a" if x is None else f"{x:,.0f}x"  # noqa: E731
    print(f"  full / restricted: output {fmt(q['output_bytes'])}, allocator peak {fmt(q['allocator_peak_bytes'])}, "
          f"RSS peak rise {fmt(q['rss_peak_rise_bytes'])}")
    e = r["extrapolated"]
    print(f"  at {e['rows']} rows the outputs would be {_mb(e['restricted_output_bytes'])} vs "
          f"{_mb(e['full_stack_output_bytes'])}")
    print(f"  target (allocator peak >= {TARGET:.0f}x smaller): {'met' if r['target_met'] else 'MISSED'}")


def main(argv: list[str] | None = None) -> dict:
    """Runs the benchmark from command-line arguments; prints, writes and returns the record."""
    started = time.perf_counter()
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--rows", type=int)
    p.add_argument("--loops", type=int)
    p.add_argument("--alphabet", type=int)
    p.add_argument("--extrapolate-rows", type=int)
    args = common.parse(p, argv, FULL, QUICK)
    looped, tok = common.load_looped(args.model, args.block, max_loops=max(16, args.loops))
    ids, mask, cand = common.chase_inputs(tok, args.rows, args.alphabet, args.seed)
    results = run(looped, ids, mask, cand, args.loops, args.extrapolate_rows)
    return common.finish(NAME, args, argv, results, started, report)


if __name__ == "__main__":
    main(sys.argv[1:])
