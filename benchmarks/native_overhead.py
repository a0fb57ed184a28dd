"""Native looped models: caching 4 sites x every pass against transformers' bare forward, and the lens read's memory.

    .venv/bin/python benchmarks/native_overhead.py [--families inkling,hrm] [--quick]

For each family (transformers' Inkling2Loop and HRM-Text, random weights, the tiny configs scaled to
about 50M parameters; `--quick`: the tiny test models) on chase prompts, interleaved in one run:

- `hf`: transformers' own forward (`AutoModelForCausalLM`, use_cache=False), the baseline;
- `adapter`: the workbench adapter's forward, no hook attached;
- `cached`: the adapter's `run_with_cache` filtered to 4 sites at every pass (Inkling: `hook_input`,
  the first and last looped layers' `hook_resid_post`, `hook_state`; HRM: `hook_input`, the first H
  layer's `hook_resid_post`, the last L cycle's `low.{L}.hook_state`, `hook_state`): 4 x T tensors.
  Target: cached / hf <= 1.10.

Memory, one call each: the per-pass lens read (`read(..., candidates=C)`, every pass decoded at the
answer position) against the way one gets per-pass logits from transformers alone:
`output_hidden_states=True`, then the final norm and the full-vocabulary head (and softcap) on every
pass's hidden states at every position. For HRM that route reads the same scores as the lens read
(its head reads the H stack directly); for Inkling it skips the post-loop layers and `final_input`
that the model's own readout of a pass runs, so it is a raw lens (the benchmark prints the difference).
Measured: output bytes (exact) and the CPU allocator's peak live bytes during the call (torch
profiler; the model's weights not included). On a shared machine run it with `--threads 1`.
"""

from __future__ import annotations

import sys
import time

import common
import torch

NAME = "native_overhead"
FULL = dict(rows=4, reps=7, warmup=1, alphabet=8)
QUICK = dict(rows=2, reps=2, warmup=1, alphabet=8)
TARGET = 1.10
# the tiny configs (workbench.models.native.TINY_NATIVE) scaled to ~50M parameters (the 49,152-token vocabulary included)
SCALED = {
    "inkling": ("tiny-inkling2-loop", dict(
        hidden_size=256, num_hidden_layers=6, head_dim=64, swa_head_dim=64, n_layers_per_attn_res_block=2,
        moe_intermediate_size=512, n_routed_experts=8, num_experts_per_tok=2, loop_layer_index_start=2,
        loop_layer_index_end=4, loop_gate_rank=32, sliding_window_size=64, rel_extent=256,
        layer_types=["hybrid_sliding", "hybrid"] * 3)),
    "hrm": ("tiny-hrm-text", dict(hidden_size=384, intermediate_size=1024, num_hidden_layers=3, num_attention_heads=6,
                                  head_dim=64)),
}


def build(family: str, quick: bool):
    """(looped, reference, tokenizer): the adapter and an independent transformers copy with the same weights."""
    import copy

    from transformers import AutoConfig, AutoModelForCausalLM

    from workbench.models import load_looped, load_tokenizer
    from workbench.models.native import FAMILIES, TINY_NATIVE

    name, overrides = SCALED[family]
    if quick:
        looped, tok = load_looped(name)
    else:
        tok = load_tokenizer()
        extra = {**TINY_NATIVE[name], **overrides}
        model_type = extra.pop("model_type")
        vocab = {"unpadded_vocab_size": len(tok)} if model_type.startswith("inkling") else {}
        config = AutoConfig.for_model(model_type, vocab_size=len(tok), pad_token_id=tok.pad_token_id,
                                      eos_token_id=tok.eos_token_id, **vocab, **extra)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
        for p in model.parameters():
            p.requires_grad_(False)
        looped = FAMILIES[model_type](model).eval()
        tok.padding_side = "left"
    return looped, copy.deepcopy(looped.base), tok


def sites(looped, loops: int) -> list[str]:
    """The 4 cached sites at every pass (see the module docstring)."""
    from workbench.loop.hooks import hook_name

    names = []
    for t in range(1, loops + 1):
        if looped.family == "inkling2_loop":
            middle = [hook_name("block_resid", t, looped.a), hook_name("block_resid", t, looped.b - 1)]
        else:
            middle = [hook_name("block_resid", t, 0), hook_name("low_state", t, cycle=looped.config.L_cycles)]
        names += [hook_name("input", t), *middle, hook_name("state", t)]
    return names


def hf_every_pass(looped, ref, ids, mask, pos) -> torch.Tensor:
    """Per-pass full-vocabulary logits [T, rows, seq, vocab] from transformers alone: output_hidden_states,
    then the final norm and head on each pass's hidden states (Inkling: its last looped layer's output at each
    pass, through `norm`, head and softcap; HRM: each H cycle's output through the head)."""
    out = ref(ids, attention_mask=mask, position_ids=pos, use_cache=False, output_hidden_states=True)
    hs, T = out.hidden_states, looped.native_loops
    if looped.family == "inkling2_loop":   # entry k is the input of the k-th layer visit (the embeddings first)
        n_loop = looped.b - looped.a
        picks = [hs[looped.a + t * n_loop] for t in range(1, T + 1)]
        return torch.stack([ref.logit_softcap(ref.lm_head(ref.model.norm(h)).float()) for h in picks])
    per_cycle = looped.n_stack * (looped.config.L_cycles + 1)   # HRM: the embeddings, then every layer visit
    picks = [hs[t * per_cycle] for t in range(1, T + 1)]        # the H stack's last layer at cycle t
    return torch.stack([ref.lm_head(ref.model.H_module.final_norm(h)) for h in picks])


def run_family(family: str, args) -> dict:
    from workbench.loop.positions import position_ids

    looped, ref, tok = build(family, args.quick)
    ids, mask, cand = common.chase_inputs(tok, args.rows, args.alphabet, args.seed)
    pos = position_ids(mask)
    T = looped.native_loops
    names = sites(looped, T)
    sizes: dict[str, int] = {}

    def cached():
        _, cache = looped.run_with_cache(ids, attention_mask=mask, position_ids=pos, names_filter=names)
        sizes["cached"] = len(cache)

    cases = {"hf": lambda: ref(ids, attention_mask=mask, position_ids=pos, use_cache=False),
             "adapter": lambda: looped(ids, attention_mask=mask, position_ids=pos),
             "cached": cached}
    with torch.no_grad():
        hf_logits = ref(ids, attention_mask=mask, position_ids=pos, use_cache=False).logits
        max_abs_diff = float((looped(ids, attention_mask=mask, position_ids=pos).logits - hf_logits).abs().max())
        times = common.interleave(cases, args.reps, args.warmup, not args.no_progress, desc=f"{NAME} {family}")
        lens, lens_peak = common.allocator_peak(lambda: looped.read(ids, attention_mask=mask, loops=T,
                                                                    candidates=cand).scores)
        stack, stack_peak = common.allocator_peak(lambda: hf_every_pass(looped, ref, ids, mask, pos))
        # what the transformers route says at the answer position about the candidates, against the lens read:
        # equal for HRM (its head reads the H stack directly); for Inkling the route skips the post-loop layers
        # and final_input that the model's own readout of a pass runs, so it is a raw lens, not the model's read
        diff = float((stack[:, :, -1][..., cand].transpose(0, 1).float() - lens[:, :, 0]).abs().max())
    if sizes["cached"] != 4 * T:
        raise RuntimeError(f"cached {sizes['cached']} tensors, expected {4 * T}")
    ratios = {f"{c}/hf": times.ratio(c, "hf") for c in ("adapter", "cached")}
    return {
        "family": looped.family, "params": sum(p.numel() for p in looped.base.parameters()), "rows": ids.shape[0],
        "seq": ids.shape[1], "passes": T, "cached_tensors": sizes["cached"], "max_abs_diff_vs_hf": max_abs_diff,
        "times": {k: times.summary(k) for k in cases}, "ratios": ratios,
        "target_met": common.verdicts({c: s["median"] for c, s in ratios["cached/hf"].items()}, lambda x: x <= TARGET),
        "memory": {"lens_read": {"output_bytes": lens.numel() * lens.element_size(), "allocator_peak_bytes": lens_peak},
                   "hidden_states_full_head": {"output_bytes": stack.numel() * stack.element_size(),
                                               "allocator_peak_bytes": stack_peak},
                   "peak_ratio": stack_peak / lens_peak, "answer_scores_max_abs_diff": diff},
    }


def report(r: dict, model: str, block: str) -> None:
    for family, f in r["families"].items():
        print(f"native overhead: {f['family']} ({f['params'] / 1e6:.1f}M parameters, random weights), "
              f"{f['rows']} rows x {f['seq']} tokens, {f['passes']} passes, {f['times']['hf']['wall']['n']} rounds; "
              f"adapter vs transformers max |Δlogit| = {f['max_abs_diff_vs_hf']}")
        for name, t in f["times"].items():
            print(f"  {name:<8} {common.fmt_time(t)}")
        for name, s in f["ratios"].items():
            print(f"  {name:<12} {common.fmt_ratio(s)}")
        print(f"  target (4 sites x {f['passes']} passes cached <= {TARGET:.2f}x transformers' forward): "
              f"{common.fmt_verdicts(f['target_met'])}")
        m = f["memory"]
        print(f"  lens read: output {m['lens_read']['output_bytes']} B, allocator peak "
              f"{m['lens_read']['allocator_peak_bytes'] / 2**20:.1f} MiB; output_hidden_states + full head: output "
              f"{m['hidden_states_full_head']['output_bytes'] / 2**20:.1f} MiB, peak "
              f"{m['hidden_states_full_head']['allocator_peak_bytes'] / 2**20:.1f} MiB ({m['peak_ratio']:.1f}x); "
              f"its answer-position candidate scores differ from the lens read by {m['answer_scores_max_abs_diff']:.3g}")


def main(argv: list[str] | None = None) -> dict:
    started = time.perf_counter()
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--rows", type=int)
    p.add_argument("--alphabet", type=int)
    p.add_argument("--families", default="inkling,hrm", help="comma list of inkling, hrm")
    args = common.parse(p, argv, FULL, QUICK)
    families = [f.strip() for f in args.families.split(",") if f.strip()]
    bad = [f for f in families if f not in SCALED]
    if bad or not families:
        p.error(f"--families {args.families!r}: accepted inkling, hrm")
    args.model, args.block = "native (random weights)", "-"
    results = {"families": {f: run_family(f, args) for f in families}}
    return common.finish(NAME, args, argv, results, started, report)


if __name__ == "__main__":
    main(sys.argv[1:])
