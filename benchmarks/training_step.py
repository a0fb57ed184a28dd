"""Training step: the trainer's candidate-restricted step against a full-vocabulary, every-position step.

    .venv/bin/python benchmarks/training_step.py [--model smollm2-135m-instruct] [--quick]

Both steps train the same tensors (the looped block and the re-entry, the recipe default:
`workbench.runs.trained_groups(config, block_trainable=True)`) with the trainer's own
optimizer (`workbench.train.optim.make_optimizer`, AdamW, recipe defaults), clip the gradient
norm at the recipe default, and optimise the same loss: per-loop cross-entropy over the
task's candidate symbols at the answer position (`workbench.train.losses.chain_loss`).

- `trainer`: `chain_loss`, which reads loops 1..T at the answer position and scores only
  the candidates (`looped.read(..., candidates=...)`), then backward and the AdamW step;
- `full_vocab`: what the reference code did: full-vocabulary logits at every position of
  every loop ([B, T, seq, vocab]), from which the same loss is taken, then the same backward
  and step.

The batch is built once (`workbench.train.losses.make_batch`) and reused, so row generation and
tokenisation are outside both timings. Reported: tokens per second (real tokens of the
batch per step) for both, and their ratio. Before timing, both losses are computed at the
same weights and must agree.
"""

from __future__ import annotations

import sys
import time

import common
import flops
import torch

NAME = "training_step"
FULL = dict(batch=4, depth=4, alphabet=8, reps=3, warmup=1)
QUICK = dict(batch=2, depth=2, alphabet=8, reps=2, warmup=1)


def setup(looped, tok, batch_size: int, depth: int, alphabet: int, seed: int):
    """Returns (batch, optimizer, trained params, clip) as the trainer would build them."""
    from workbench.runs import trained_groups
    from workbench.train.losses import make_batch
    from workbench.train.optim import make_optimizer
    from workbench.train.recipe import OptimTable

    rows = common.chase_rows(tok, batch_size, alphabet, seed, depths=range(1, depth + 1))
    batch = make_batch(rows, tok)
    for p in looped.parameters():  # as the trainer: everything frozen, then the trained groups enabled
        p.requires_grad_(False)
    optim = OptimTable()
    opt, _ = make_optimizer(looped, trained_groups(looped.retrofit_config, True), optim)
    params = [p for g in opt.param_groups for p in g["params"]]
    return batch, opt, params, optim.grad_clip


def full_vocab_loss(looped, batch: dict) -> torch.Tensor:
    """The chain loss taken from the full [B, T, seq, vocab] logit stack (reference-style)."""
    ids, mask = batch["input_ids"], batch["attention_mask"]
    b, s = ids.shape
    loops = batch["targets"].shape[1]
    every = torch.arange(s).unsqueeze(0).expand(b, -1)
    logits = looped.read(ids, mask, loops=loops, positions=every).scores       # [B, T, S, V]
    answer = logits[:, :, -1, :]                                               # left padded: last position
    cand = answer.gather(-1, batch["candidates"].unsqueeze(1).expand(-1, loops, -1))  # [B, T, N]
    logp = cand.float().log_softmax(-1)
    targets = batch["targets"]
    nll = -logp.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1) * (targets >= 0)
    w = batch["weights"]
    return (nll * w).sum() / w.sum()


def trainer_loss(looped, batch: dict) -> torch.Tensor:
    """The trainer's loss (`workbench.train.losses.chain_loss`)."""
    from workbench.train.losses import chain_loss

    return chain_loss(looped, batch)[0]


def step(loss_fn, looped, batch, opt, params, clip: float) -> float:
    """One optimizer step on `batch` with `loss_fn`; returns the loss."""
    opt.zero_grad(set_to_none=True)
    loss = loss_fn(looped, batch)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, clip)
    opt.step()
    return float(loss.detach())


def run(looped, tok, batch_size: int, depth: int, alphabet: int, seed: int, reps: int, warmup: int,
        progress: bool = True) -> dict:
    """Times both steps side by side; returns tokens/s for each and the ratio."""
    batch, opt, params, clip = setup(looped, tok, batch_size, depth, alphabet, seed)
    looped.train()
    with torch.no_grad():
        check = {"trainer": float(trainer_loss(looped, batch)), "full_vocab": float(full_vocab_loss(looped, batch))}
    if abs(check["trainer"] - check["full_vocab"]) > 1e-4 * max(1.0, abs(check["trainer"])):
        raise RuntimeError(f"the two steps optimise different losses: {check}")
    cases = {"trainer": lambda: step(trainer_loss, looped, batch, opt, params, clip),
             "full_vocab": lambda: step(full_vocab_loss, looped, batch, opt, params, clip)}
    times = common.interleave(cases, reps, warmup, progress, desc=NAME)
    looped.eval()
    tokens = int(batch["attention_mask"].sum())
    tps = {k: common.summary([tokens / t for t in v]) for k, v in times.wall.items()}
    b, s = batch["input_ids"].shape
    T, C = batch["targets"].shape[1], batch["candidates"].shape[1]
    work = {"trainer": flops.train_step_flops(flops.split_of(looped), b, s, T, C),
            "full_vocab": flops.train_step_flops(flops.split_of(looped), b, s, T, C, full_vocab=True)}
    return {"batch": b, "seq": s, "loops": T, "tokens_per_step": tokens, "flops": work,
            "predicted_speedup": work["full_vocab"] / work["trainer"],
            "trained_params": sum(p.numel() for p in params), "loss_check": check,
            "times": {k: times.summary(k) for k in cases}, "tokens_per_s": tps,
            "speedup": times.ratio("full_vocab", "trainer")}


def report(r: dict, model: str, block: str) -> None:
    """Prints tokens/s for both steps and the speed-up."""
    print(f"training step: {model} block {block}, batch {r['batch']} x {r['seq']} tokens, T = {r['loops']}, "
          f"{r['trained_params']:,} trained parameters, {r['times']['trainer']['wall']['n']} rounds")
    for name in ("trainer", "full_vocab"):
        t, v = r["times"][name], r["tokens_per_s"][name]
        print(f"  {name:<10} per step {common.fmt_time(t)}; {v['median']:8.1f} tokens/s (wall)")
    print(f"  trainer speed-up (full_vocab time / trainer time): {common.fmt_ratio(r['speedup'])}; "
          f"predicted {r['predicted_speedup']:.2f}x by FLOPs")
    print(f"  loss at the same weights: {r['loss_check']['trainer']:.5f} (trainer) vs "
          f"{r['loss_check']['full_vocab']:.5f} (full vocab)")


def main(argv: list[str] | None = None) -> dict:
    """Runs the benchmark from command-line arguments; prints, writes and returns the record."""
    started = time.perf_counter()
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--batch", type=int)
    p.add_argument("--depth", type=int, help="rows of depths 1..depth; the step reads loops 1..depth")
    p.add_argument("--alphabet", type=int)
    args = common.parse(p, argv, FULL, QUICK)
    looped, tok = common.load_looped(args.model, args.block, max_loops=max(16, args.depth))
    results = run(looped, tok, args.batch, args.depth, args.alphabet, args.seed, args.reps, args.warmup,
                  not args.no_progress)
    return common.finish(NAME, args, argv, results, started, report)


if __name__ == "__main__":
    main(sys.argv[1:])
