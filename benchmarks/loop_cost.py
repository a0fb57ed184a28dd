"""Loop cost: time(T) / time(1) for T = 1..16 against the layer-count model.

    .venv/bin/python benchmarks/loop_cost.py [--model smollm2-135m-instruct] [--quick]

The layer-count model: a pass to loop T runs a + T k + (L - a - k) layers, so
time(T) / time(1) = (a + T k + (L - a - k)) / L (the retrofit paper's 6/12/6 split of 24
layers gives (1 + T) / 2). Two passes are timed at every T, all T of a round side by side:

- `forward`: the public `looped(ids, mask, loops=T)`, which also computes full-vocabulary
  logits at every position once (a fixed cost the layer model leaves out; for SmolLM2 the
  576 x 49,152 unembedding is about 8 layers' worth of matmul);
- `last_loop`: the pass to loop T reading only the candidates at the answer position, the
  object the layer-count model describes.

Beside the layer model the FLOP model of `flops.py` (attention, bridge and readout included)
is printed.
"""

from __future__ import annotations

import sys
import time

import common
import flops
import torch

NAME = "loop_cost"
FULL = dict(rows=2, max_t=16, alphabet=8, reps=2, warmup=0)
QUICK = dict(rows=2, max_t=6, alphabet=8, reps=2, warmup=0)


def run(looped, ids, mask, cand, max_t: int, reps: int, warmup: int, progress: bool = True) -> dict:
    """Times both passes at T = 1..max_t in every round; returns per-T ratios and predictions."""
    cases = {}
    for T in range(1, max_t + 1):
        cases[f"forward@{T}"] = lambda T=T: looped(ids, mask, loops=T)
        cases[f"last_loop@{T}"] = lambda T=T: looped.read_final(ids, mask, loops=T, candidates=cand)
    common.prime(looped, ids, mask)
    with torch.no_grad():
        times = common.interleave(cases, reps, warmup, progress, desc=NAME)
    s = flops.split_of(looped)
    rows, seq = ids.shape
    per_t = []
    for T in range(1, max_t + 1):
        layer_model = flops.layers_last_loop(s, T) / s.n_layers
        entry = {"T": T, "layers": layer_model,
                 "flops_forward": flops.forward_flops(s, rows, seq, T) / flops.forward_flops(s, rows, seq, 1),
                 "flops_last_loop": (flops.last_loop_flops(s, rows, seq, T, len(cand))
                                     / flops.last_loop_flops(s, rows, seq, 1, len(cand)))}
        for kind in ("forward", "last_loop"):
            ratio = times.ratio(f"{kind}@{T}", f"{kind}@1")
            entry[kind] = ratio
            entry[f"{kind}_vs_layers"] = {c: ratio[c]["median"] / layer_model - 1 for c in ("wall", "cpu")}
            entry[f"{kind}_vs_flops"] = {c: ratio[c]["median"] / entry[f"flops_{kind}"] - 1 for c in ("wall", "cpu")}
        per_t.append(entry)
    worst = {model: {c: max(abs(e[f"last_loop_vs_{model}"][c]) for e in per_t) for c in ("wall", "cpu")}
             for model in ("layers", "flops")}
    return {"rows": rows, "seq": seq, "split": [s.a, s.k, s.coda], "per_T": per_t,
            "time_T1": {k: times.summary(f"{k}@1") for k in ("forward", "last_loop")},
            "worst_last_loop_vs": worst}


def report(r: dict, model: str, block: str) -> None:
    """Prints the measured and predicted cost curve."""
    a, k, c = r["split"]
    print(f"loop cost: {model} block {block} (a={a}, k={k}, coda={c}), {r['rows']} rows x {r['seq']} tokens; "
          f"time(1) wall: forward {r['time_T1']['forward']['wall']['median']:.3f} s, "
          f"last-loop {r['time_T1']['last_loop']['wall']['median']:.3f} s")
    print(f"  {'T':>2}  {'layers':>6}  {'last_loop wall':>20} {'cpu':>20} {'FLOPs':>6}  "
          f"{'forward wall':>20} {'cpu':>20} {'FLOPs':>6}")
    for e in r["per_T"]:
        ll, fw = e["last_loop"], e["forward"]
        cells = [common.fmt_ratio(x) for x in (ll["wall"], ll["cpu"], fw["wall"], fw["cpu"])]
        print(f"  {e['T']:>2}  {e['layers']:6.2f}  {cells[0]:>20} {cells[1]:>20} {e['flops_last_loop']:6.2f}  "
              f"{cells[2]:>20} {cells[3]:>20} {e['flops_forward']:6.2f}")
    for model, w in r["worst_last_loop_vs"].items():
        print(f"  worst |last_loop / {model} model - 1| over T: wall {w['wall']:.1%}, cpu {w['cpu']:.1%}")


def main(argv: list[str] | None = None) -> dict:
    """Runs the benchmark from command-line arguments; prints, writes and returns the record."""
    started = time.perf_counter()
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--rows", type=int)
    p.add_argument("--max-t", type=int)
    p.add_argument("--alphabet", type=int)
    args = common.parse(p, argv, FULL, QUICK)
    looped, tok = common.load_looped(args.model, args.block, max_loops=max(16, args.max_t))
    ids, mask, cand = common.chase_inputs(tok, args.rows, args.alphabet, args.seed)
    results = run(looped, ids, mask, cand, args.max_t, args.reps, args.warmup, not args.no_progress)
    return common.finish(NAME, args, argv, results, started, report)


if __name__ == "__main__":
    main(sys.argv[1:])
