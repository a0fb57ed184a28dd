"""Early exit: wall time of adaptive inference when rows stop early, against the fixed-depth run, one process.

    .venv/bin/python benchmarks/early_exit.py [--model smollm2-135m-instruct] [--quick]

`LoopedLM.adaptive_read` drops rows that stopped from the batch, so later loops, their memory
and the Coda run only on the rows still going. Cases, each on the same batch of chase rows with
a budget of T loops (an inject + memory + halting retrofit; the head's probabilities are set by
hooks on the halting head (`hook_name("halt", t)`), so who stops is fixed, not learned):

- `fixed`: tau = 0, every row runs T loops (what a fixed-depth run computes);
- `half_at_1`: half the rows stop after loop 1, the other half run T loops;
- `all_at_1`: every row stops after loop 1.

The layer-count model: a row costs a + t k + c layers (Prelude, t loops of the k-layer block, the
Coda once), so a case's predicted time ratio to `fixed` is sum_rows (a + t_r k + c) / (rows (a + T k + c)).
"""

from __future__ import annotations

import sys
import time

import common
import torch

from workbench.loop.halting import HaltPolicy
from workbench.loop.hooks import hook_name

NAME = "early_exit"
FULL = dict(rows=8, loops=8, alphabet=8, reps=5, warmup=1)
QUICK = dict(rows=4, loops=4, alphabet=8, reps=2, warmup=1)


def run(looped, ids, mask, cand, loops: int, reps: int, warmup: int, progress: bool = True) -> dict:
    """Times the three cases side by side; returns work counts, wall / CPU ratios and the layer-model prediction."""
    rows = ids.shape[0]
    stop_first = {"fixed": [], "half_at_1": list(range(rows // 2)), "all_at_1": list(range(rows))}

    def case(name: str):
        def fn():
            def probs(p, hook):                     # 0 (stop) for the chosen rows at loop 1, 1 (go on) for the rest
                out = torch.ones_like(p)
                out[stop_first[name]] = 0.0
                return out
            policy = HaltPolicy(tau=0.0 if name == "fixed" else 0.5, max_loops=loops)
            go_on = [(hook_name("halt", t), lambda p, hook: torch.ones_like(p)) for t in range(2, loops + 1)]
            with looped.hooks(fwd_hooks=[(hook_name("halt", 1), probs), *go_on]):
                return looped.adaptive_read(ids, mask, policy=policy, candidates=cand)
        return fn

    cases = {name: case(name) for name in stop_first}
    with torch.no_grad():
        work = {name: fn().row_loops for name, fn in cases.items()}
        times = common.interleave(cases, reps, warmup, progress, desc=NAME)
    a, k = looped.a, looped.b - looped.a
    c = looped.n_layers - looped.b
    layers = {name: sum(a + (1 if r in stop else loops) * k + c for r in range(rows))
              for name, stop in stop_first.items()}
    return {"rows": rows, "seq": ids.shape[1], "loops": loops, "split": [a, k, c], "row_loops": work,
            "ratio_to_fixed": {n: times.ratio(n, "fixed") for n in cases if n != "fixed"},
            "predicted_layers": {n: layers[n] / layers["fixed"] for n in cases if n != "fixed"},
            "time_fixed": times.summary("fixed")}


def report(r: dict, model: str, block: str) -> None:
    """Prints the work done and the measured time ratios beside the layer-count prediction."""
    print(f"early exit: {model} block {block}, {r['rows']} rows x {r['seq']} tokens, budget {r['loops']} loops; "
          f"fixed: {common.fmt_time(r['time_fixed'])}")
    for name, ratio in r["ratio_to_fixed"].items():
        print(f"  {name:>10}: row-loops {r['row_loops'][name]} of {r['row_loops']['fixed']}; time / fixed "
              f"{common.fmt_ratio(ratio)}; layer model {r['predicted_layers'][name]:.2f}x")


def main(argv: list[str] | None = None) -> dict:
    """Runs the benchmark from command-line arguments; prints, writes and returns the record."""
    started = time.perf_counter()
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--rows", type=int)
    p.add_argument("--loops", type=int)
    p.add_argument("--alphabet", type=int)
    args = common.parse(p, argv, FULL, QUICK)
    looped, tok = common.load_looped(args.model, args.block, max_loops=args.loops, reentry="inject", memory=True,
                                     halting=True)
    ids, mask, cand = common.chase_inputs(tok, args.rows, args.alphabet, args.seed)
    results = run(looped, ids, mask, cand, args.loops, args.reps, args.warmup, not args.no_progress)
    return common.finish(NAME, args, argv, results, started, report)


if __name__ == "__main__":
    main(sys.argv[1:])
