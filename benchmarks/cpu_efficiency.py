"""CPU efficiency: achieved FLOP/s of the forced read and a training step vs this machine's matmul rate.

    .venv/bin/python benchmarks/cpu_efficiency.py [--model smollm2-135m-instruct] [--quick]

In the same rounds, side by side: dense fp32 `torch.matmul` at two shapes (1024 x 1024 x
1024, and tokens x 576 x 1536, the model's MLP shape at the read's token count), the forced
read (`looped.read(..., loops=T, candidates=C)`) and the trainer's step
(`training_step.step` with `chain_loss`). Achieved FLOP/s = analytic FLOPs / measured time,
with FLOPs from `flops.py` (2 x parameters touched x tokens for every matmul, plus
4 x rows x seq^2 x heads x head_dim per layer for attention; backward as documented there).
The fraction is taken against the faster matmul shape's rate in each round, both per wall
second and per CPU second of this process (the latter is steadier on a loaded machine).
"""

from __future__ import annotations

import sys
import time

import common
import flops
import torch
import training_step

NAME = "cpu_efficiency"
FULL = dict(rows=2, loops=14, batch=4, depth=4, alphabet=8, reps=3, warmup=1)
QUICK = dict(rows=2, loops=4, batch=2, depth=2, alphabet=8, reps=2, warmup=1)


def matmul_case(m: int, k: int, n: int, min_flops: float = 1e10):
    """Returns (case, FLOPs per call): repeated fp32 matmuls of [m, k] @ [k, n], >= min_flops a call."""
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(m, k, generator=g), torch.randn(k, n, generator=g)
    repeat = max(1, int(min_flops // (2 * m * k * n)))

    def case():
        for _ in range(repeat):
            torch.matmul(x, w)
    return case, 2.0 * m * k * n * repeat


def run(looped, tok, rows_ids, mask, cand, loops: int, batch_size: int, depth: int, alphabet: int, seed: int,
        reps: int, warmup: int, progress: bool = True) -> dict:
    """Times matmuls, the forced read and a training step in the same rounds; returns rates and fractions."""
    split = flops.split_of(looped)
    rows, seq = rows_ids.shape
    mm_square, f_square = matmul_case(1024, 1024, 1024)
    mm_mlp, f_mlp = matmul_case(rows * seq, split.d, split.d_ff)
    batch, opt, params, clip = training_step.setup(looped, tok, batch_size, depth, alphabet, seed)
    b, s = batch["input_ids"].shape
    T_train = batch["targets"].shape[1]
    work = {"matmul_1024": f_square, "matmul_mlp": f_mlp,
            "read": flops.one_pass_read_flops(split, rows, seq, loops, len(cand)),
            "train_step": flops.train_step_flops(split, b, s, T_train, batch["candidates"].shape[1])}

    def read():
        with torch.no_grad():
            looped.read(rows_ids, mask, loops=loops, candidates=cand)

    def train():
        looped.train()
        training_step.step(training_step.trainer_loss, looped, batch, opt, params, clip)
        looped.eval()

    cases = {"matmul_1024": mm_square, "matmul_mlp": mm_mlp, "read": read, "train_step": train}
    times = common.interleave(cases, reps, warmup, progress, desc=NAME)
    out = {"read": {"rows": rows, "seq": seq, "loops": loops, "candidates": len(cand)},
           "train": {"batch": b, "seq": s, "loops": T_train},
           "flops": work, "times": {k: times.summary(k) for k in cases}}
    # per wall second (what the machine delivered) and per CPU second of this process (the work's own rate)
    for clock, seconds in (("wall", times.wall), ("cpu", times.cpu)):
        rates = {k: [work[k] / t for t in v] for k, v in seconds.items()}
        peak = [max(x, y) for x, y in zip(rates["matmul_1024"], rates["matmul_mlp"])]
        out["gflops" if clock == "wall" else "gflops_cpu"] = {
            k: common.summary([r / 1e9 for r in v]) for k, v in rates.items()}
        out["fraction" if clock == "wall" else "fraction_cpu"] = {
            k: common.summary([r / p for r, p in zip(rates[k], peak)]) for k in ("read", "train_step")}
    return out


def report(r: dict, model: str, block: str) -> None:
    """Prints achieved GFLOP/s and the fractions of the matmul rate."""
    rd, tr = r["read"], r["train"]
    print(f"CPU efficiency: {model} block {block}; read {rd['rows']} rows x {rd['seq']} tokens, T = {rd['loops']}; "
          f"train step batch {tr['batch']} x {tr['seq']}, T = {tr['loops']}; {r['times']['read']['wall']['n']} rounds")
    for name, g in r["gflops"].items():
        print(f"  {name:<12} {r['flops'][name] / 1e9:9.1f} GFLOP in {r['times'][name]['wall']['median']:7.3f} s: "
              f"{g['median']:7.1f} GFLOP/s ({g['min']:.1f}-{g['max']:.1f})")
    for name, f in r["fraction"].items():
        c = r["fraction_cpu"][name]
        print(f"  {name:<12} achieves {f['median']:.0%} of the matmul rate ({f['min']:.0%}-{f['max']:.0%}) per wall "
              f"second, {c['median']:.0%} ({c['min']:.0%}-{c['max']:.0%}) per CPU second")


def main(argv: list[str] | None = None) -> dict:
    """Runs the benchmark from command-line arguments; prints, writes and returns the record."""
    started = time.perf_counter()
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--rows", type=int)
    p.add_argument("--loops", type=int)
    p.add_argument("--batch", type=int)
    p.add_argument("--depth", type=int)
    p.add_argument("--alphabet", type=int)
    args = common.parse(p, argv, FULL, QUICK)
    looped, tok = common.load_looped(args.model, args.block, max_loops=max(16, args.loops, args.depth))
    ids, mask, cand = common.chase_inputs(tok, args.rows, args.alphabet, args.seed)
    results = run(looped, tok, ids, mask, cand, args.loops, args.batch, args.depth, args.alphabet, args.seed,
                  args.reps, args.warmup, not args.no_progress)
    return common.finish(NAME, args, argv, results, started, report)


if __name__ == "__main__":
    main(sys.argv[1:])
