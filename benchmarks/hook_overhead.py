"""Hook overhead: caching four per-loop hook sites at every loop against a bare pass.

    .venv/bin/python benchmarks/hook_overhead.py [--model smollm2-135m-instruct] [--quick]

The four sites, for every loop t = 1..T: `loop.{t}.hook_input`, `loop.{t}.block.{a}.hook_resid_post`
(the block's first layer), `loop.{t}.hook_state`, `loop.{t}.hook_readout`. Cases, interleaved:

- `read` / `read_cached`: the forced read (`looped.read(..., candidates=C)`), bare and with
  TransformerLens caching hooks on the 4 x T sites (the headline; target <= 1.10x);
- `forward` / `forward_cached`: the forward at loop T, bare and through `run_with_cache`
  filtered to the same sites (the forward runs the Coda only at loop T, so `hook_readout`
  fires once: 3T + 1 entries);
- `nnsight`: an nnsight trace of the forward saving the same sites;
- `tl_all`: `run_with_cache` with no filter (every hook point, attention patterns included),
  the way a user would otherwise grab "everything".
"""

from __future__ import annotations

import sys
import time

import common
import torch

from workbench.loop.hooks import hook_name

NAME = "hook_overhead"
FULL = dict(rows=2, loops=14, alphabet=8, reps=5, warmup=1)
QUICK = dict(rows=2, loops=4, alphabet=8, reps=2, warmup=1)
TARGET = 1.10


def sites(looped, loops: int, readout_every_loop: bool = True) -> list[str]:
    """The four per-loop hook names for loops 1..T (hook_readout only at T if not every loop)."""
    names = []
    for t in range(1, loops + 1):
        names += [hook_name("input", t), hook_name("block_resid", t, looped.a), hook_name("state", t)]
        if readout_every_loop or t == loops:
            names.append(hook_name("readout", t))
    return names


def nnsight_trace(wrapped, ids, mask, loops: int, block_layer: int) -> list:
    """Saves the four sites of every loop from one nnsight trace of the forward (in execution order)."""
    saved = []
    with wrapped.trace(ids, attention_mask=mask, loops=loops):
        for t in range(1, loops + 1):
            site = wrapped.loop[str(t)]
            saved.append(site.hook_input.output.save())
            saved.append(site.block[str(block_layer)].hook_resid_post.output.save())
            saved.append(site.hook_state.output.save())
        saved.append(wrapped.loop[str(loops)].hook_readout.output.save())
    return saved


def run(looped, ids, mask, cand, loops: int, reps: int, warmup: int, progress: bool = True) -> dict:
    """Times the seven cases side by side; returns times, paired ratios and cache sizes."""
    from nnsight import NNsight

    wrapped = NNsight(looped)
    read_sites, fwd_sites = sites(looped, loops), sites(looped, loops, readout_every_loop=False)
    sizes: dict[str, int] = {}

    def read_cached():
        cache, fwd, _ = looped.get_caching_hooks(names_filter=read_sites)
        with looped.hooks(fwd_hooks=fwd):
            looped.read(ids, mask, loops=loops, candidates=cand)
        sizes["read_cached"] = len(cache)

    def forward_cached():
        _, cache = looped.run_with_cache(ids, attention_mask=mask, loops=loops, names_filter=fwd_sites)
        sizes["forward_cached"] = len(cache)

    def nnsight_case():
        sizes["nnsight"] = len(nnsight_trace(wrapped, ids, mask, loops, looped.a))

    def tl_all():
        _, cache = looped.run_with_cache(ids, attention_mask=mask, loops=loops)
        sizes["tl_all"] = len(cache)

    cases = {
        "read": lambda: looped.read(ids, mask, loops=loops, candidates=cand),
        "read_cached": read_cached,
        "forward": lambda: looped(ids, mask, loops=loops),
        "forward_cached": forward_cached,
        "nnsight": nnsight_case,
        "tl_all": tl_all,
    }
    with torch.no_grad():
        times = common.interleave(cases, reps, warmup, progress, desc=NAME)
    ratios = {"read_cached/read": times.ratio("read_cached", "read")}
    for case in ("forward_cached", "nnsight", "tl_all"):
        ratios[f"{case}/forward"] = times.ratio(case, "forward")
    expected = {"read_cached": len(read_sites), "forward_cached": len(fwd_sites), "nnsight": len(fwd_sites)}
    for case, n in expected.items():
        if sizes[case] != n:
            raise RuntimeError(f"{case} cached {sizes[case]} tensors, expected {n}")
    rows, seq = ids.shape
    return {"rows": rows, "seq": seq, "loops": loops, "sites_per_loop": 4, "cached_tensors": sizes,
            "times": {k: times.summary(k) for k in cases}, "ratios": ratios,
            "target_met": common.verdicts({c: s["median"] for c, s in ratios["read_cached/read"].items()},
                                          lambda x: x <= TARGET)}


def report(r: dict, model: str, block: str) -> None:
    """Prints times and overhead ratios."""
    print(f"hook overhead: {model} block {block}, {r['rows']} rows x {r['seq']} tokens, T = {r['loops']}, "
          f"{r['times']['read']['wall']['n']} rounds")
    for name, t in r["times"].items():
        n = r["cached_tensors"].get(name)
        print(f"  {name:<15} {common.fmt_time(t)}"
              + ("" if n is None else f"  {n} tensors cached"))
    for name, s in r["ratios"].items():
        print(f"  {name:<24} {common.fmt_ratio(s)}")
    print(f"  target (read with 4 sites x {r['loops']} loops cached <= {TARGET:.2f}x bare): "
          f"{common.fmt_verdicts(r['target_met'])}")


def main(argv: list[str] | None = None) -> dict:
    """Runs the benchmark from command-line arguments; prints, writes and returns the record."""
    started = time.perf_counter()
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--rows", type=int)
    p.add_argument("--loops", type=int)
    p.add_argument("--alphabet", type=int)
    args = common.parse(p, argv, FULL, QUICK)
    looped, tok = common.load_looped(args.model, args.block, max_loops=max(16, args.loops))
    ids, mask, cand = common.chase_inputs(tok, args.rows, args.alphabet, args.seed)
    results = run(looped, ids, mask, cand, args.loops, args.reps, args.warmup, not args.no_progress)
    return common.finish(NAME, args, argv, results, started, report)


if __name__ == "__main__":
    main(sys.argv[1:])
