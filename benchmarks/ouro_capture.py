"""Ouro: caching 4 sites x every step against the family's bare forward, one read against T forwards, the cache's growth.

    .venv/bin/python benchmarks/ouro_capture.py [--quick] [--threads 1]

Ouro has no transformers forward to compare with (its code is remote), so the baseline is the workbench's own
Ouro forward with no hook attached (exact against the reference: tests/test_native_ouro.py). Random weights, the
tiny-ouro config scaled to about 50M parameters (`--quick`: tiny-ouro itself), chase prompts, interleaved:

- `bare`: `looped(ids, mask, loops=T)` at the native T = 4 steps;
- `cached`: `run_with_cache` filtered to 4 sites at every step (`hook_input`, the first layer's `hook_resid_post`,
  `hook_state`, the exit gate's `exit.hook_prob`): 4 x T tensors. Target: cached / bare <= 1.10;
- `read`: `read(loops=T)`, every step decoded at the answer position in one forward, against
- `forwards`: T separate forwards at 1..T steps (what a tool that only sees the last step pays).

The per-step KV cache (`new_cache(k)`: one key/value slot per step and layer) is filled with the prompts at
k = 1..2T steps; its bytes are exact (2 x k x layers x kv heads x head size x tokens x dtype bytes).
"""

from __future__ import annotations

import sys
import time

import common
import torch

NAME = "ouro_capture"
FULL = dict(rows=4, reps=7, warmup=1, alphabet=8)
QUICK = dict(rows=2, reps=2, warmup=1, alphabet=8)
TARGET = 1.10
SCALED = dict(hidden_size=384, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=6,
              num_key_value_heads=2, total_ut_steps=4, early_exit_threshold=0.6, max_position_embeddings=1024)


def build(quick: bool):
    """(looped, tokenizer): tiny-ouro, or its config scaled to ~50M parameters (same seed and fill)."""
    from workbench.models import load_looped, load_tokenizer
    from workbench.models.native import TINY_SEED, ouro

    if quick:
        return load_looped("tiny-ouro")
    tok = load_tokenizer()
    tok.padding_side = "left"
    return ouro.tiny(torch.float32, tok, TINY_SEED, **SCALED).eval(), tok


def sites(T: int) -> list[str]:
    """The 4 cached sites at every step (the module docstring)."""
    from workbench.loop.hooks import hook_name

    return [name for t in range(1, T + 1) for name in (hook_name("input", t), hook_name("block_resid", t, 0),
                                                       hook_name("state", t), hook_name("exit_gate", t))]


def run(args) -> dict:
    looped, tok = build(args.quick)
    ids, mask, cand = common.chase_inputs(tok, args.rows, args.alphabet, args.seed)
    T = looped.native_loops
    names = sites(T)
    sizes: dict[str, int] = {}

    def cached():
        _, cache = looped.run_with_cache(ids, attention_mask=mask, loops=T, names_filter=names)
        sizes["cached"] = len(cache)

    def forwards():
        for t in range(1, T + 1):
            looped(ids, mask, loops=t)

    cases = {"bare": lambda: looped(ids, mask, loops=T), "cached": cached,
             "read": lambda: looped.read(ids, mask, loops=T, candidates=cand), "forwards": forwards}
    with torch.no_grad():
        times = common.interleave(cases, args.reps, args.warmup, not args.no_progress, desc=NAME)
        growth = {}
        for k in range(1, looped.max_loops + 1):
            kv = looped.new_cache(k)
            looped(ids, mask, loops=k, cache=kv)
            growth[k] = kv.nbytes()
    if sizes["cached"] != 4 * T:
        raise RuntimeError(f"cached {sizes['cached']} tensors, expected {4 * T}")
    ratios = {"cached/bare": times.ratio("cached", "bare"), "forwards/read": times.ratio("forwards", "read")}
    cfg = looped.config
    per_token_step = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_size * 4
    return {"params": sum(p.numel() for p in looped.base.parameters()), "rows": ids.shape[0], "seq": ids.shape[1],
            "steps": T, "cached_tensors": sizes["cached"], "times": {k: times.summary(k) for k in cases},
            "ratios": ratios,
            "target_met": common.verdicts({c: s["median"] for c, s in ratios["cached/bare"].items()},
                                          lambda x: x <= TARGET),
            "kv_cache_bytes": growth, "kv_bytes_per_token_step_fp32": per_token_step}


def report(r: dict, model: str, block: str) -> None:
    print(f"ouro capture: {r['params'] / 1e6:.1f}M parameters (random weights), {r['rows']} rows x {r['seq']} tokens, "
          f"{r['steps']} steps, {r['times']['bare']['wall']['n']} rounds")
    for name, t in r["times"].items():
        print(f"  {name:<9} {common.fmt_time(t)}")
    for name, s in r["ratios"].items():
        print(f"  {name:<14} {common.fmt_ratio(s)}")
    print(f"  target (4 sites x {r['steps']} steps cached <= {TARGET:.2f}x the bare forward): "
          f"{common.fmt_verdicts(r['target_met'])}")
    growth = ", ".join(f"{k}: {v / 2**10:.1f} KiB" for k, v in r["kv_cache_bytes"].items())
    print(f"  per-step KV cache after the prompts, by steps: {growth} "
          f"({r['kv_bytes_per_token_step_fp32']} B per token per step, fp32)")


def main(argv: list[str] | None = None) -> dict:
    started = time.perf_counter()
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--rows", type=int)
    p.add_argument("--alphabet", type=int)
    args = common.parse(p, argv, FULL, QUICK)
    args.model, args.block = "ouro (random weights)", "-"
    return common.finish(NAME, args, argv, run(args), started, report)


if __name__ == "__main__":
    main(sys.argv[1:])
