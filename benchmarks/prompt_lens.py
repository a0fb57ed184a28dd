"""`wb.lens` on one prompt: one forward reading every loop, against T separate forwards (one per loop count).

    .venv/bin/python benchmarks/prompt_lens.py [--model smollm2-135m-instruct] [--quick]

The lens (`workbench.lenses.lens`) reads loops 1..T from one pass: the Prelude once, the block T times and the
Coda at every loop, then the raw lens and the tables. The way a user would do it without the workbench's read
is T forwards, `looped(ids, loops=t).logits[:, -1]` for t = 1..T, each running the Prelude, t blocks and the
Coda. Both are timed side by side, after the model is loaded; the target is the issue's: the lens on one prompt
of the embedded model at 8 loops answers in under 3 s (the median wall of a whole `lens` call, tables included).
The coda lens at loop T is checked against the T-loop forward (max |Δp| printed).
"""

from __future__ import annotations

import sys
import time

import common
import torch

NAME = "prompt_lens"
FULL = dict(loops=8, reps=5, warmup=1)
QUICK = dict(loops=4, reps=2, warmup=0)
PROMPT = "Function table:\nA -> C\nB -> A\nC -> B\nStart at A and apply the table 2 times.\nAnswer:"
TARGET_S = 3.0


def run(looped, tok, loops: int, reps: int, warmup: int, progress: bool = True) -> dict:
    from workbench.lenses import lens

    enc = tok([PROMPT], return_tensors="pt")
    out: dict = {}

    def one_forward():
        out["lens"] = lens(looped, tok, PROMPT, loops=loops, top_k=5)

    def per_loop():
        out["per_loop"] = [looped(enc.input_ids, enc.attention_mask, loops=t).logits[:, -1] for t in range(1, loops + 1)]

    common.prime(looped, enc.input_ids, enc.attention_mask)
    with torch.no_grad():
        times = common.interleave({"lens_one_forward": one_forward, "forwards_per_loop": per_loop}, reps, warmup,
                                  progress, desc=NAME)
    frame = out["lens"]
    last = frame[(frame.loop == loops) & (frame.lens == "coda") & (frame.kind == "top")]
    p = out["per_loop"][-1][0].double().softmax(-1)
    diff = float((p[torch.tensor(last.token_id.values)] - torch.tensor(last.prob.values)).abs().max())
    lens_s = times.summary("lens_one_forward")
    return {"loops": loops, "seq": int(enc.input_ids.shape[1]), "times": {k: times.summary(k) for k in times.wall},
            "ratio_per_loop_to_lens": times.ratio("forwards_per_loop", "lens_one_forward"),
            "max_abs_diff_last_loop": diff, "target_s": TARGET_S,
            "target_met": common.verdicts({c: lens_s[c]["median"] for c in ("wall", "cpu")}, lambda x: x < TARGET_S)}


def report(results: dict, model: str, block: str) -> None:
    r = results
    print(f"lens on one prompt: {model} block {block}, {r['seq']} tokens, T = {r['loops']}, "
          f"{r['times']['lens_one_forward']['wall']['n']} rounds")
    for name, t in r["times"].items():
        print(f"  {name:<18} {common.fmt_time(t)}")
    print(f"  T forwards / lens: {common.fmt_ratio(r['ratio_per_loop_to_lens'])}; coda lens at loop T vs the "
          f"T-loop forward: max|Δp| {r['max_abs_diff_last_loop']:.1e}")
    print(f"  target (lens under {r['target_s']:.0f} s): {common.fmt_verdicts(r['target_met'])}")


def main(argv: list[str] | None = None) -> dict:
    started = time.perf_counter()
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--loops", type=int)
    args = common.parse(p, argv, FULL, QUICK)
    looped, tok = common.load_looped(args.model, args.block, max_loops=max(16, args.loops))
    results = run(looped, tok, args.loops, args.reps, args.warmup, not args.no_progress)
    return common.finish(NAME, args, argv, results, started, report)


if __name__ == "__main__":
    main(sys.argv[1:])
