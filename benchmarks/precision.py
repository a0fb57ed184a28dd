"""bf16 mixed precision against fp32: the default recipe's training step, the forced read, and the matmul rate.

    .venv/bin/python benchmarks/precision.py [--quick] [--threads 2] [--profile]

Two copies of the default recipe's model (`training/smollm2_lora_chase.toml`: the embedded
SmolLM2, block 12:24, split bridge, rank-16 LoRA on every block projection) are built with
the same LoRA draw. The `bf16` copy goes through `workbench.precision.apply_precision`
exactly as the trainer does (frozen weights stored in bf16 once, LoRA and bridge fp32,
forward under autocast, losses in fp32). Timed side by side, interleaved round by round:

- `train_fp32` / `train_bf16`: one trainer step (`chain_loss` on a batch of chase rows at
  depths 1..4, backward, clip, AdamW step with the trainer's own optimizer groups);
- `read_fp32` / `read_bf16`: the forced one-pass read `looped.read(loops=T, candidates=C)`;
- `mm_fp32` / `mm_bf16` at each of the model's projection shapes ([tokens, 576] x [576, 576 /
  192 / 1536], [tokens, 1536] x [1536, 576]): the matmul rate in GFLOP/s.

Targets (issue 13): the bf16 step at least 2x faster than fp32 on a CPU with bf16 units, and
at least 40% of the measured bf16 matmul rate (step FLOPs / step time against the token-
weighted mean of the shape rates). `--profile` adds a per-phase breakdown (the operators of
one step of each, grouped: matmuls, attention, norms and element-wise, dtype casts,
optimizer), which says where the time goes when a target is missed. `--compile` also times a
bf16 step with every decoder layer under `torch.compile` (kept in the product only if it helps).
Before timing, both copies' losses at the same weights and their argmax reads are compared.
"""

from __future__ import annotations

import copy
import sys
import time

import common
import flops
import torch

NAME = "precision"
FULL = dict(batch=8, depth=4, alphabet=8, reps=3, warmup=1, read_rows=16, read_loops=8, mm_reps=20)
QUICK = dict(batch=2, depth=2, alphabet=8, reps=2, warmup=1, read_rows=4, read_loops=3, mm_reps=5)
BLOCK = "12:24"
TARGET_SPEEDUP = 2.0
TARGET_SHARE = 0.40


def build(model: str, block: str, precision: str, max_loops: int):
    """The default recipe's architecture (LoRA r16 on block projections, bridge) at a precision."""
    from workbench.loop.config import Block, RetrofitConfig
    from workbench.loop.surgery import attach_lora, retrofit
    from workbench.models import load_base
    from workbench.precision import apply_precision

    base, tok = load_base(model)
    looped = retrofit(base, RetrofitConfig(Block.parse(block, "--block"), max_loops=max_loops))
    torch.manual_seed(0)  # the same LoRA A draw in both copies
    attach_lora(looped, r=16, alpha=32)
    with torch.no_grad():  # non-zero B, as after training, so the LoRA path does real work
        gen = torch.Generator().manual_seed(1)
        for name, p in looped.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 1e-3)
    for p in looped.parameters():
        p.requires_grad_(False)
    for name, p in looped.named_parameters():
        p.requires_grad_("lora_" in name or name.startswith("reentry."))
    apply_precision(looped, precision)
    for p in looped.parameters():
        p.requires_grad_(False)
    return looped, tok


def optimizer(looped):
    from workbench.train.optim import make_optimizer
    from workbench.train.recipe import OptimTable

    cfg = OptimTable(lr=2e-4)
    opt, _ = make_optimizer(looped, ["lora", "reentry"], cfg)
    return opt, [p for g in opt.param_groups for p in g["params"]]


def train_step(looped, batch, opt, params) -> float:
    from workbench.train.losses import chain_loss

    opt.zero_grad(set_to_none=True)
    loss = chain_loss(looped, batch)[0]
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    return float(loss.detach())


def lora_step_flops(split: flops.Split, rows: int, seq: int, T: int, C: int, r: int = 16) -> float:
    """Forward + backward FLOPs of a LoRA step: the frozen block needs input gradients only (x1), the
    LoRA factors both (x2, tiny), the bridge both; the Prelude no backward."""
    layer, attn = flops.layer_flops(split, rows, seq), flops.attention_flops(split, rows, seq)
    forward = flops.pass_flops(split, rows, seq, T, T, rows, C)
    frozen_bwd = (layer - attn) + 2 * attn
    d, f = split.d, split.d_ff
    lora_fwd = 2 * rows * seq * r * (4 * (d + d) + 3 * (d + f))  # 7 projections (k, v narrower: an upper bound)
    backward = (T * (split.k + split.coda) * frozen_bwd + T * split.k * 3 * lora_fwd
                + (T - 1) * 2 * flops.bridge_flops(split, rows, seq) + T * flops.head_flops(split, rows, C))
    return forward + T * split.k * lora_fwd + backward


def matmul_rates(tokens: int, d: int, d_ff: int, kv: int, reps: int, progress: bool) -> dict:
    """GFLOP/s of [tokens, K] x [K, N] at the model's projection shapes, fp32 and bf16 interleaved."""
    shapes = {"qo": (d, d), "kv": (d, kv), "up": (d, d_ff), "down": (d_ff, d)}
    out = {}
    for name, (K, N) in shapes.items():
        mats = {dt: (torch.randn(tokens, K, dtype=dt), torch.randn(K, N, dtype=dt))
                for dt in (torch.float32, torch.bfloat16)}
        cases = {f"{tag}": (lambda a=a, b=b: [a @ b for _ in range(reps)])
                 for tag, (a, b) in (("fp32", mats[torch.float32]), ("bf16", mats[torch.bfloat16]))}
        t = common.interleave(cases, 3, 1, progress, desc=f"matmul {name}")
        work = 2 * tokens * K * N * reps
        out[name] = {"shape": [tokens, K, N],
                     "gflops": {k: work / common.summary(v)["median"] / 1e9 for k, v in t.wall.items()},
                     "weight": K * N}
    total = sum(v["weight"] for v in out.values())
    for dt in ("fp32", "bf16"):  # mean rate weighted by each shape's share of the layer's FLOPs (K*N)
        out.setdefault("weighted", {})[dt] = sum(v["gflops"][dt] * v["weight"] for k, v in out.items()
                                                 if k != "weighted") / total
    return out


def profile_step(fn) -> dict:
    """Seconds per operator group in one call of `fn` (torch.profiler, self CPU time)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    groups = {"matmul (linear, LoRA, head)": ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear",
                                              "mkldnn", "aten::_mkl"),
              "attention (softmax, masks)": ("softmax", "aten::_softmax", "masked_fill", "aten::where"),
              "dtype casts / copies": ("aten::to", "aten::_to_copy", "aten::copy_", "aten::clone", "aten::contiguous"),
              "optimizer (AdamW)": ("aten::addcdiv", "aten::addcmul", "aten::lerp", "aten::sqrt", "aten::_foreach",
                                    "Optimizer")}
    out = {g: 0.0 for g in groups}
    out["element-wise and other"] = 0.0
    for e in prof.key_averages():
        secs = e.self_cpu_time_total / 1e6
        for g, keys in groups.items():
            if any(k in e.key for k in keys):
                out[g] += secs
                break
        else:
            out["element-wise and other"] += secs
    return {k: round(v, 4) for k, v in out.items()}


def run(args) -> dict:
    from workbench.precision import detect_hardware
    from workbench.train.losses import make_batch

    hw = detect_hardware("cpu")
    models = {p: build(args.model, args.block, p, max(8, args.read_loops)) for p in ("fp32", "bf16")}
    tok = models["fp32"][1]
    rows = common.chase_rows(tok, args.batch, args.alphabet, args.seed, depths=range(1, args.depth + 1))
    batch = make_batch(rows, tok)
    state = {p: (m, *optimizer(m)) for p, (m, _) in models.items()}
    for m, _, _ in state.values():
        m.train()
    from workbench.train.losses import chain_loss

    with torch.no_grad():
        check = {p: float(chain_loss(m, batch)[0]) for p, (m, _, _) in state.items()}
    ids, mask, cand = common.chase_inputs(tok, args.read_rows, args.alphabet, args.seed)
    with torch.no_grad():
        reads = {p: m.read(ids, mask, loops=args.read_loops, candidates=cand).scores for p, (m, _) in models.items()}
    agree = float((reads["fp32"].argmax(-1) == reads["bf16"].argmax(-1)).float().mean())
    cases = {f"train_{p}": (lambda p=p: train_step(*state[p][:1], batch, *state[p][1:])) for p in ("fp32", "bf16")}
    compiled = None
    if args.compile:
        compiled = copy.deepcopy(state["bf16"][0])
        for i, layer in enumerate(compiled.base.model.layers):
            compiled.base.model.layers[i] = torch.compile(layer, dynamic=False)
        c_opt, c_params = optimizer(compiled)
        t0 = time.perf_counter()
        train_step(compiled, batch, c_opt, c_params)
        compile_s = time.perf_counter() - t0
        cases["train_bf16_compiled"] = lambda: train_step(compiled, batch, c_opt, c_params)
    train_t = common.interleave(cases, args.reps, args.warmup, not args.no_progress, desc="train step")
    with torch.no_grad():
        read_cases = {f"read_{p}": (lambda m=m: m.read(ids, mask, loops=args.read_loops, candidates=cand))
                      for p, (m, _) in models.items()}
        read_t = common.interleave(read_cases, args.reps, args.warmup, not args.no_progress, desc="read")
    split = flops.split_of(models["fp32"][0])
    b, s = batch["input_ids"].shape
    T, C = batch["targets"].shape[1], batch["candidates"].shape[1]
    step_flops = lora_step_flops(split, b, s, T, C)
    cfg = models["fp32"][0].config
    kv = cfg.num_key_value_heads * (getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
    mm = matmul_rates(b * s, cfg.hidden_size, cfg.intermediate_size, kv, args.mm_reps, not args.no_progress)
    step_s = {k: common.summary(v)["median"] for k, v in train_t.wall.items()}
    achieved = {p: step_flops / step_s[f"train_{p}"] / 1e9 for p in ("fp32", "bf16")}
    share = {p: achieved[p] / mm["weighted"][p] for p in ("fp32", "bf16")}
    out = {"hardware": hw.to_dict(), "block": args.block, "batch": b, "seq": s, "loops": T, "step_flops": step_flops,
           "loss_check": check, "read_argmax_agreement": agree, "read_cells": int(reads["fp32"].numel() // C),
           "train": {k: train_t.summary(k) for k in cases}, "read": {k: read_t.summary(k) for k in read_cases},
           "train_speedup": train_t.ratio("train_fp32", "train_bf16"),
           "read_speedup": read_t.ratio("read_fp32", "read_bf16"),
           "matmul": mm, "achieved_gflops": achieved, "share_of_matmul_rate": share,
           "targets": {"speedup": TARGET_SPEEDUP, "share": TARGET_SHARE}}
    if compiled is not None:
        out["compile"] = {"first_step_s": compile_s, "ratio_bf16_over_compiled": train_t.ratio("train_bf16",
                                                                                               "train_bf16_compiled")}
    if args.profile:
        out["profile"] = {p: profile_step(lambda p=p: train_step(*state[p][:1], batch, *state[p][1:]))
                          for p in ("fp32", "bf16")}
    return out


def report(r: dict) -> None:
    hw = r["hardware"]
    print(f"precision: default recipe's model (block {r['block']}, LoRA r16, bridge), batch {r['batch']} x {r['seq']} "
          f"tokens, depths 1..{r['loops']}; CPU {hw['name']}, bf16 units: {', '.join(hw['bf16_units']) or 'none'}")
    print(f"  loss at the same weights: fp32 {r['loss_check']['fp32']:.5f}, bf16 {r['loss_check']['bf16']:.5f}; "
          f"read argmax agreement {r['read_argmax_agreement']:.4f} of {r['read_cells']} cells")
    for k, t in r["train"].items():
        print(f"  {k:<20} {common.fmt_time(t)}")
    sp = r["train_speedup"]
    print(f"  training step fp32 / bf16: {common.fmt_ratio(sp)}  (target >= {TARGET_SPEEDUP:.1f}x: "
          f"{common.fmt_verdicts(common.verdicts({c: sp[c]['median'] for c in sp}, lambda v: v >= TARGET_SPEEDUP))})")
    print(f"  forced read fp32 / bf16:   {common.fmt_ratio(r['read_speedup'])}")
    mm = r["matmul"]
    for name, v in mm.items():
        if name != "weighted":
            print(f"  matmul {name:<5} {v['shape']}: fp32 {v['gflops']['fp32']:6.1f}, bf16 {v['gflops']['bf16']:6.1f} "
                  f"GFLOP/s ({v['gflops']['bf16'] / v['gflops']['fp32']:.2f}x)")
    for p in ("fp32", "bf16"):
        print(f"  {p} step: {r['achieved_gflops'][p]:.1f} GFLOP/s = {r['share_of_matmul_rate'][p]:.0%} of the "
              f"{p} matmul rate ({mm['weighted'][p]:.1f}); target for bf16 >= {TARGET_SHARE:.0%}")
    if "compile" in r:
        c = r["compile"]
        print(f"  torch.compile (every decoder layer): first step {c['first_step_s']:.0f} s; bf16 / compiled "
              f"{common.fmt_ratio(c['ratio_bf16_over_compiled'])}")
    if "profile" in r:
        print("  per-phase self CPU seconds of one step:  " + "  ".join(f"{p}" for p in r["profile"]))
        for g in r["profile"]["fp32"]:
            print(f"    {g:<30} " + "  ".join(f"{r['profile'][p][g]:7.3f}" for p in r["profile"]))


def main(argv: list[str] | None = None) -> dict:
    started = time.perf_counter()
    p = common.parser(__doc__.splitlines()[0])
    p.set_defaults(block=BLOCK)  # the default recipe's block, not the other benchmarks' 10:16
    for name in ("batch", "depth", "alphabet", "read_rows", "read_loops", "mm_reps"):
        p.add_argument(f"--{name.replace('_', '-')}", dest=name, type=int)
    p.add_argument("--profile", action="store_true", help="per-phase breakdown of one step of each")
    p.add_argument("--compile", action="store_true", help="also time a bf16 step under torch.compile")
    args = common.parse(p, argv, FULL, QUICK)
    results = run(args)
    report(results)
    rec = common.record(NAME, args, argv, results, started)
    common.write_result(NAME, rec, args.out)
    return rec


if __name__ == "__main__":
    main(sys.argv[1:])
