"""The Raven family: caching 4 sites at every recurrent step against its bare forward, one read against reruns,
and the per-step KV cache's growth with steps.

    .venv/bin/python benchmarks/raven_overhead.py [--steps 32] [--quick]

On chase prompts, the Raven family (`workbench.models.native.raven`, random weights: `tiny-raven` scaled to
n_embd 512, 8 heads, MLP 1536, 2 / 4 / 2 layers, 53M parameters (25M of them the embedding); `--quick`:
`tiny-raven` itself), at T steps, interleaved in one run:

- `bare`: the family's forward at T steps, no hook attached, the baseline;
- `cached`: `run_with_cache` filtered to 4 sites at every step (`adapter.hook_in`, `hook_input`, the first
  recurrent layer's `hook_resid_post`, `hook_state`): 4 x T tensors. Target: cached / bare <= 1.10;
- `read`: every step decoded at the answer position in one forward (`read`), against
- `reruns`: T separate forwards at 1..T steps, what a reader of the reference's `num_steps` has to run.

The KV cache (`new_cache`) after the prompt, at 4, 8, 16 and T steps: its bytes per token, measured, and the same
count for Huginn-0125 in bf16 (n_embd 5280, 2 / 4 / 2 layers), computed from the slot count. On a shared machine
run it with `--threads 1`.
"""

from __future__ import annotations

import sys
import time

import common
import torch

NAME = "raven_overhead"
FULL = dict(rows=4, reps=5, warmup=1, alphabet=8, steps=32)
QUICK = dict(rows=2, reps=2, warmup=1, alphabet=8, steps=8)
TARGET = 1.10
SCALED = dict(n_embd=512, n_heads=8, intermediate_size=1536, n_layers_in_recurrent_block=4, mean_recurrence=32)
HUGINN = dict(n_embd=5280, prelude=2, core=4, coda=2, bytes=2)  # Huginn-0125's config, bf16


def build(quick: bool):
    from workbench.models import load_looped, load_tokenizer
    from workbench.models.native import TINY_NATIVE, TINY_SEED
    from workbench.models.native.raven import RavenLooped, tiny_raven
    from workbench.models.native.raven_files import RavenConfig

    if quick:
        return load_looped("tiny-raven")
    tok = load_tokenizer()
    tok.padding_side = "left"
    extra = {k: v for k, v in {**TINY_NATIVE["tiny-raven"], **SCALED}.items() if k != "model_type"}
    model = tiny_raven(RavenConfig(vocab_size=len(tok), **extra), TINY_SEED).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return RavenLooped(model).eval(), tok


def sites(looped, steps: int) -> list[str]:
    from workbench.loop.hooks import hook_name

    return [name for t in range(1, steps + 1) for name in (hook_name("adapter_in", t), hook_name("input", t),
                                                          hook_name("block_resid", t, looped.a),
                                                          hook_name("state", t))]


def huginn_bytes_per_token(steps: int) -> int:
    """Keys and values of one token over every slot: Prelude, each recurrent layer at each step, Coda."""
    slots = HUGINN["prelude"] + HUGINN["core"] * steps + HUGINN["coda"]
    return slots * 2 * HUGINN["n_embd"] * HUGINN["bytes"]


def main(argv: list[str] | None = None) -> dict:
    started = time.perf_counter()
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--rows", type=int)
    p.add_argument("--alphabet", type=int)
    p.add_argument("--steps", type=int)
    args = common.parse(p, argv, FULL, QUICK)
    looped, tok = build(args.quick)
    T = looped._loops(args.steps)
    ids, mask, cand = common.chase_inputs(tok, args.rows, args.alphabet, args.seed)
    names = sites(looped, T)
    sizes: dict[str, int] = {}

    def cached():
        _, cache = looped.run_with_cache(ids, attention_mask=mask, loops=T, names_filter=names)
        sizes["cached"] = len(cache)

    def reruns():
        return [looped(ids, attention_mask=mask, loops=t) for t in range(1, T + 1)]

    cases = {"bare": lambda: looped(ids, attention_mask=mask, loops=T), "cached": cached,
             "read": lambda: looped.read(ids, attention_mask=mask, loops=T, candidates=cand), "reruns": reruns}
    with torch.no_grad():
        times = common.interleave(cases, args.reps, args.warmup, not args.no_progress, desc=NAME)
        growth = {}
        for steps in sorted({4, 8, 16, T} & set(range(1, T + 1))):
            cache = looped.new_cache(steps)
            looped(ids, attention_mask=mask, loops=steps, cache=cache)
            growth[steps] = {"bytes_per_token": cache.nbytes() // ids.numel(),
                             "huginn_bf16_bytes_per_token": huginn_bytes_per_token(steps)}
    if sizes["cached"] != 4 * T:
        raise RuntimeError(f"cached {sizes['cached']} tensors, expected {4 * T}")
    ratios = {"cached/bare": times.ratio("cached", "bare"), "reruns/read": times.ratio("reruns", "read")}
    results = {
        "params": sum(p.numel() for p in looped.base.parameters()), "rows": ids.shape[0], "seq": ids.shape[1],
        "steps": T, "cached_tensors": sizes["cached"], "times": {k: times.summary(k) for k in cases},
        "ratios": ratios,
        "target_met": common.verdicts({c: s["median"] for c, s in ratios["cached/bare"].items()}, lambda x: x <= TARGET),
        "kv_cache": growth,
    }
    args.model, args.block = "raven (random weights)", "-"
    return common.finish(NAME, args, argv, results, started, report)


def report(r: dict, model: str, block: str) -> None:
    print(f"raven overhead: {r['params'] / 1e6:.1f}M parameters (random weights), {r['rows']} rows x {r['seq']} "
          f"tokens, {r['steps']} steps, {r['times']['bare']['wall']['n']} rounds")
    for name, t in r["times"].items():
        print(f"  {name:<8} {common.fmt_time(t)}")
    for name, s in r["ratios"].items():
        print(f"  {name:<12} {common.fmt_ratio(s)}")
    print(f"  target (4 sites x {r['steps']} steps cached <= {TARGET:.2f}x the bare forward): "
          f"{common.fmt_verdicts(r['target_met'])}")
    for steps, g in r["kv_cache"].items():
        print(f"  KV cache at {steps} steps: {g['bytes_per_token']} B per token here; Huginn-0125 in bf16: "
              f"{g['huginn_bf16_bytes_per_token'] / 2**20:.2f} MiB per token")


if __name__ == "__main__":
    main(sys.argv[1:])
