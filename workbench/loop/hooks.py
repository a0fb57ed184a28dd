"""The hook-name contract: every hook point of a LoopedLM, named from one place.

A LoopedLM has hook points per site *and per loop* (so `run_with_cache` keeps every loop).
Their names are module paths, and this table is the one source of them:

    site           name                                         holds
    prelude_resid  prelude.{layer}.hook_resid_post              a Prelude layer's output (layer < a)
    prelude        hook_prelude                                 p, the Prelude's output
    input          loop.{loop}.hook_input                       u_t, the block input after re-entry
    memory         loop.{loop}.block.{layer}.memory.hook_out    Loop Memory Attention's update (t >= 2)
    pattern        loop.{loop}.block.{layer}.attn.hook_pattern  attention probabilities [B, H, q, k]
    attn_out       loop.{loop}.block.{layer}.attn.hook_out      self_attn's output (after o_proj, before the residual add)
    mlp_out        loop.{loop}.block.{layer}.mlp.hook_out       the MLP's output (before the residual add)
    block_resid    loop.{loop}.block.{layer}.hook_resid_post    a block layer's output (a <= layer < b)
    state          loop.{loop}.hook_state                       h_t, the block's output
    coda_resid     loop.{loop}.coda.{layer}.hook_resid_post     a Coda layer's output on h_t (layer >= b)
    readout        loop.{loop}.hook_readout                     Norm(Coda(h_t)) at the read positions
    halt           loop.{loop}.halt.hook_prob                   the halting head's continue probability
    loops_used     hook_loops_used                              adaptive inference's loops per row [B]

Native looped models (`workbench.models.native`: transformers' own looped architectures) have the
sites above that their architecture has plus their own, each family listing its sites on its adapter:

    message        loop.{loop}.block.{layer}.hook_message             Inkling: the 4 messages from pass t-1 (t >= 2)
    message_pattern loop.{loop}.block.{layer}.message.hook_pattern    Inkling: pass-query attention over pass t-1's blocks
    forget_gate    loop.{loop}.block.{layer}.{gate}_gate.hook_forget   Inkling: tanh forget gate (gate q, k, v, mlp; t >= 2)
    message_gate   loop.{loop}.block.{layer}.{gate}_gate.hook_message  Inkling: tanh message gate (same)
    low_input      loop.{loop}.low.{cycle}.hook_input                  HRM: the L stack's input, z_L + z_H
    low_resid      loop.{loop}.low.{cycle}.block.{layer}.hook_resid_post  HRM: an L-stack layer's output
    low_attn_out   loop.{loop}.low.{cycle}.block.{layer}.attn.hook_out    HRM: an L-stack layer's attention output
    low_mlp_out    loop.{loop}.low.{cycle}.block.{layer}.mlp.hook_out     HRM: an L-stack layer's MLP output
    low_state      loop.{loop}.low.{cycle}.hook_state                  HRM: z_L after L cycle `cycle` of H cycle t
    init_state     hook_init_state                                     Raven: s_0, the random initial state
    adapter_in     loop.{loop}.adapter.hook_in                         Raven: the adapter's input [s_{t-1}, e]
    adapter_out    loop.{loop}.adapter.hook_out                        Raven: the adapter's output (then hook_input)
    exit_gate      loop.{loop}.exit.hook_prob                          Ouro: the exit gate's probability lambda_t [B, s]

Loops count from 1 (a native model's pass or H cycle); L cycles count from 1; layers are the
base model's own indices. attn_out and mlp_out ([B, s, d]) are the modules' own returns (self_attn's first),
routed through their hook points only while hooked (`workbench.loop.components`); Inkling's then pass its
post-attention / post-MLP convolutions, as in transformers. Probes, benchmarks and notebooks
build names with `hook_name` and stack a site over loops with `stack_loops`.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from workbench.errors import WorkbenchError

SITES = {
    "prelude_resid": "prelude.{layer}.hook_resid_post",
    "prelude": "hook_prelude",
    "input": "loop.{loop}.hook_input",
    "memory": "loop.{loop}.block.{layer}.memory.hook_out",
    "pattern": "loop.{loop}.block.{layer}.attn.hook_pattern",
    "attn_out": "loop.{loop}.block.{layer}.attn.hook_out",
    "mlp_out": "loop.{loop}.block.{layer}.mlp.hook_out",
    "block_resid": "loop.{loop}.block.{layer}.hook_resid_post",
    "state": "loop.{loop}.hook_state",
    "coda_resid": "loop.{loop}.coda.{layer}.hook_resid_post",
    "readout": "loop.{loop}.hook_readout",
    "halt": "loop.{loop}.halt.hook_prob",
    "loops_used": "hook_loops_used",
    "message": "loop.{loop}.block.{layer}.hook_message",
    "message_pattern": "loop.{loop}.block.{layer}.message.hook_pattern",
    "forget_gate": "loop.{loop}.block.{layer}.{gate}_gate.hook_forget",
    "message_gate": "loop.{loop}.block.{layer}.{gate}_gate.hook_message",
    "low_input": "loop.{loop}.low.{cycle}.hook_input",
    "low_resid": "loop.{loop}.low.{cycle}.block.{layer}.hook_resid_post",
    "low_attn_out": "loop.{loop}.low.{cycle}.block.{layer}.attn.hook_out",
    "low_mlp_out": "loop.{loop}.low.{cycle}.block.{layer}.mlp.hook_out",
    "low_state": "loop.{loop}.low.{cycle}.hook_state",
    "init_state": "hook_init_state",
    "adapter_in": "loop.{loop}.adapter.hook_in",
    "adapter_out": "loop.{loop}.adapter.hook_out",
    "exit_gate": "loop.{loop}.exit.hook_prob",
}

# The sites a retrofit (a LoopedLM) has; memory / halt / loops_used only with Loop Memory Attention or a halting
# head. A native family declares its own (`sites` on its adapter, workbench.models.native); a site outside a
# model's list is an error there.
RETROFIT_SITES = ("prelude_resid", "prelude", "input", "memory", "pattern", "attn_out", "mlp_out", "block_resid",
                  "state", "coda_resid", "readout", "halt", "loops_used")
GATES = ("q", "k", "v", "mlp")


def hook_name(site: str, loop: int | None = None, layer: int | None = None, *, cycle: int | None = None,
              gate: str | None = None) -> str:
    """Returns the hook point's name, e.g. hook_name("block_resid", 2, 14) == "loop.2.block.14.hook_resid_post".

    `cycle` (HRM's L cycle, from 1) and `gate` (Inkling's q, k, v or mlp gate) only for the sites that take them.

    Raises:
        WorkbenchError: an unknown site, or a loop / layer / cycle / gate the site needs and did not get
            (or does not take).
    """
    if site not in SITES:
        raise WorkbenchError(f"unknown hook site '{site}'; accepted: {', '.join(SITES)}")
    pattern = SITES[site]
    if gate is not None and gate not in GATES:
        raise WorkbenchError(f"gate={gate!r} is not one of {', '.join(GATES)}")
    if cycle is not None and (isinstance(cycle, bool) or not isinstance(cycle, int) or cycle < 1):
        raise WorkbenchError(f"cycle={cycle!r} must be an integer >= 1 (L cycles count from 1)")
    for key, value in (("loop", loop), ("layer", layer), ("cycle", cycle), ("gate", gate)):
        needed = "{" + key + "}" in pattern
        if needed and value is None:
            raise WorkbenchError(f"hook site '{site}' needs a {key} ({pattern})")
        if not needed and value is not None:
            raise WorkbenchError(f"hook site '{site}' takes no {key} ({pattern}); got {key}={value!r}")
    if loop is not None and (isinstance(loop, bool) or not isinstance(loop, int) or loop < 1):
        raise WorkbenchError(f"loop={loop!r} must be an integer >= 1 (loops count from 1)")
    return pattern.format(loop=loop, layer=layer, cycle=cycle, gate=gate)


def loop_hook_names(site: str, loops: int, layer: int | None = None) -> list[str]:
    """The names of `site` at loops 1..loops."""
    return [hook_name(site, t, layer) for t in range(1, loops + 1)]


def stack_loops(cache: Mapping[str, torch.Tensor], site: str, loops: int, layer: int | None = None) -> torch.Tensor:
    """Returns `site` at loops 1..loops from a cache (an ActivationCache or any name -> tensor mapping), [T, ...].

    Raises:
        WorkbenchError: a loop's tensor is missing from the cache (name it in the cache's names_filter).
    """
    names = loop_hook_names(site, loops, layer)
    missing = [n for n in names if n not in cache]
    if missing:
        raise WorkbenchError(f"the cache holds no '{missing[0]}' ({len(missing)} of {len(names)} loops missing)")
    return torch.stack([cache[n] for n in names])


class StrictHookNames:
    """TransformerLens' run_with_cache / run_with_hooks with names checked first: a hook name that does not exist
    is an error, not a silent no-op. Mixed in before HookedRootModule; the class defines `_check_hook_names`."""

    def run_with_cache(self, *args, names_filter=None, **kwargs):
        """TransformerLens' run_with_cache; a hook name in `names_filter` that does not exist is an error."""
        if isinstance(names_filter, (str, list, tuple)):
            self._check_hook_names([names_filter] if isinstance(names_filter, str) else names_filter)
        return super().run_with_cache(*args, names_filter=names_filter, **kwargs)

    def run_with_hooks(self, *args, fwd_hooks=(), bwd_hooks=(), **kwargs):
        """TransformerLens' run_with_hooks; a hook name that does not exist is an error, not a no-op."""
        self._check_hook_names([name for name, _ in [*fwd_hooks, *bwd_hooks]])
        return super().run_with_hooks(*args, fwd_hooks=list(fwd_hooks), bwd_hooks=list(bwd_hooks), **kwargs)
