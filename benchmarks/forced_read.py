"""Forced read vs per-depth reruns: one pass reading loops 1..T against T separate passes.

    .venv/bin/python benchmarks/forced_read.py [--model smollm2-135m-instruct] [--quick]

The one-pass read (`looped.read(ids, mask, loops=T, candidates=C)`) runs the Prelude once,
the block T times and the Coda at every loop. A per-depth rerun at depth t runs the Prelude,
the block t times and the Coda once, reading only loop t; T of them cost
sum_t (a + t k + coda) layers. The ratio of the two is what the layer counts predict; the
measured time ratio is printed beside it (target: within 10%).

Two more ways a user might rerun can be timed beside it (`--styles`): `forward` (the public
`looped(ids, mask, loops=t)`, full-vocabulary logits at every position of loop t, then the
candidates at the answer position) and `read` (the public `looped.read(..., loops=t)`, which
reads every loop up to t, so the T reruns run the Coda sum_t t times).
"""

from __future__ import annotations

import sys
import time

import common
import flops
import torch

NAME = "forced_read"
FULL = dict(rows=2, loops=14, alphabet=8, reps=3, warmup=0, styles="last_loop,forward")
QUICK = dict(rows=2, loops=6, alphabet=8, reps=2, warmup=0, styles="last_loop")
STYLES = ("last_loop", "forward", "read")
TARGET = 0.10  # |measured / predicted - 1|


def rerun(style: str, looped, ids, mask, t: int, cand: torch.Tensor) -> torch.Tensor:
    """Candidate scores [batch, C] at loop t from one pass of the given rerun style."""
    if style == "last_loop":
        return looped.read_final(ids, mask, loops=t, candidates=cand)[:, 0]
    if style == "forward":
        return looped(ids, mask, loops=t).logits[:, -1, cand]
    return looped.read(ids, mask, loops=t, candidates=cand).scores[:, -1, 0]


def predictions(split: flops.Split, style: str, rows: int, seq: int, T: int, C: int) -> dict:
    """Predicted reruns / one-pass cost ratio for a style, by layer counts and by FLOPs."""
    one_layers = flops.layers_one_pass_read(split, T)
    one_flops = flops.one_pass_read_flops(split, rows, seq, T, C)
    if style == "read":
        layers = sum(flops.layers_one_pass_read(split, t) for t in range(1, T + 1))
        fl = sum(flops.one_pass_read_flops(split, rows, seq, t, C) for t in range(1, T + 1))
    else:
        layers = flops.layers_reruns(split, T)
        per = flops.last_loop_flops if style == "last_loop" else (lambda s, r, q, t, c: flops.forward_flops(s, r, q, t))
        fl = sum(per(split, rows, seq, t, C) for t in range(1, T + 1))
    return {"layers": layers / one_layers, "flops": fl / one_flops,
            "layers_one_pass": one_layers, "layers_reruns": layers}


def run(looped, ids, mask, cand, loops: int, styles: list[str], reps: int, warmup: int, progress: bool = True) -> dict:
    """Times the one-pass read against each rerun style, interleaved; returns the results dict."""
    outputs: dict[str, torch.Tensor] = {}

    def one_pass():
        outputs["one_pass"] = looped.read(ids, mask, loops=loops, candidates=cand).scores[:, :, 0]

    def reruns(style):
        def go():
            outputs[style] = torch.stack([rerun(style, looped, ids, mask, t, cand) for t in range(1, loops + 1)], 1)
        return go

    cases = {"one_pass": one_pass, **{f"reruns_{s}": reruns(s) for s in styles}}
    common.prime(looped, ids, mask)
    with torch.no_grad():
        times = common.interleave(cases, reps, warmup, progress, desc=NAME)
    split = flops.split_of(looped)
    rows, seq = ids.shape
    results = {"rows": rows, "seq": seq, "loops": loops, "candidates": len(cand),
               "times": {k: times.summary(k) for k in cases}, "styles": {}}
    for s in styles:
        ratio = times.ratio(f"reruns_{s}", "one_pass")
        pred = predictions(split, s, rows, seq, loops, len(cand))
        results["styles"][s] = {
            "ratio": ratio, "predicted": pred,
            "vs_layers": {c: ratio[c]["median"] / pred["layers"] - 1 for c in ("wall", "cpu")},
            "vs_flops": {c: ratio[c]["median"] / pred["flops"] - 1 for c in ("wall", "cpu")},
            "max_abs_diff": float((outputs[s] - outputs["one_pass"]).abs().max()),
        }
    head = results["styles"].get("last_loop")
    results["target_met"] = None if head is None else common.verdicts(head["vs_layers"], lambda x: abs(x) <= TARGET)
    return results


def report(results: dict, model: str, block: str) -> None:
    """Prints the measured and predicted ratios."""
    r = results
    print(f"forced read vs reruns: {model} block {block}, {r['rows']} rows x {r['seq']} tokens, T = {r['loops']}, "
          f"{r['times']['one_pass']['wall']['n']} rounds")
    for name, t in r["times"].items():
        print(f"  {name:<18} {common.fmt_time(t)}")
    for s, v in r["styles"].items():
        p = v["predicted"]
        print(f"  reruns[{s}] / one-pass: {common.fmt_ratio(v['ratio'])}")
        print(f"      predicted {p['layers']:.2f}x by layer counts ({p['layers_reruns']} / {p['layers_one_pass']} "
              f"layers), {p['flops']:.2f}x by FLOPs; measured / layer prediction - 1: "
              f"wall {v['vs_layers']['wall']:+.1%}, cpu {v['vs_layers']['cpu']:+.1%}; "
              f"max|Δscore| vs one pass {v['max_abs_diff']:.1e}")
    if r["target_met"] is not None:
        print(f"  target (last-loop reruns within {TARGET:.0%} of the layer-count prediction): "
              f"{common.fmt_verdicts(r['target_met'])}")


def main(argv: list[str] | None = None) -> dict:
    """Runs the benchmark from command-line arguments; prints, writes and returns the record."""
    started = time.perf_counter()
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--rows", type=int)
    p.add_argument("--loops", type=int)
    p.add_argument("--alphabet", type=int)
    p.add_argument("--styles", help=f"comma-separated rerun styles from {', '.join(STYLES)}")
    args = common.parse(p, argv, FULL, QUICK)
    styles = [s for s in args.styles.split(",") if s]
    if not styles or any(s not in STYLES for s in styles):
        p.error(f"--styles {args.styles!r}: accepted are comma-separated {', '.join(STYLES)}")
    looped, tok = common.load_looped(args.model, args.block, max_loops=max(16, args.loops))
    ids, mask, cand = common.chase_inputs(tok, args.rows, args.alphabet, args.seed)
    results = run(looped, ids, mask, cand, args.loops, styles, args.reps, args.warmup, not args.no_progress)
    return common.finish(NAME, args, argv, results, started, report)


if __name__ == "__main__":
    main(sys.argv[1:])
