"""transformers' HRM-Text (`hrm_text`) with every H cycle hooked, and the L cycles inside it.

The architecture (transformers/models/hrm_text/modeling_hrm_text.py, `HrmTextModel.forward`):

    z_H = embed(tokens) * embedding_scale        z_L = z_L_init (zeros)          the Prelude: no layers
    for H cycle t = 1..H_cycles:
        for L cycle l = 1..L_cycles:  z_L = L_stack(z_L + z_H)     (early L cycles under no_grad)
        z_H = H_stack(z_H + z_L)                                    the looped block
    logits = lm_head(z_H)                                           the Coda: the head alone

Each stack ends in its own final norm, so h_t = z_H after H cycle t is what the head reads: reading
pass t is lm_head(z_H^t), the model's own readout at H_cycles = t. A pass is one H cycle;
`loop.{t}.hook_input` is z_H + z_L (the H stack's input), `loop.{t}.low.{l}.*` the L cycles inside it.
Layer indices are the stacks' own (0..num_layers_per_stack - 1). Every L and H invocation has its own
KV cache slot (`cycle_offset`), as in transformers.

Like transformers, the early L cycles of each H cycle run under `torch.no_grad()` (`L_bp_cycles`, a training-time
memory trick), so a gradient from the output reaches only the trailing L cycles. For gradient-based attribution
across every cycle, run inside `looped.all_cycles_with_grad()` (or set `looped.all_cycles_grad = True`): every
L cycle then records its graph; the values, and so the logits, are exactly the same.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn
from transformer_lens.hook_points import HookPoint
from transformers.cache_utils import DynamicCache
from transformers.masking_utils import create_causal_mask

from workbench.errors import WorkbenchError
from workbench.loop.attention import pattern_hook
from workbench.loop.components import component_hooks
from workbench.models.native.contract import Carry, NativeLoopedLM, Site, hooked


@dataclass
class _Ctx:
    x: torch.Tensor
    mask: torch.Tensor
    rope: tuple
    pos: torch.Tensor
    cache: object
    kwargs: dict


class HrmLooped(NativeLoopedLM):
    """HrmTextForCausalLM with a hook point per site and per H cycle (1..2 x H_cycles)."""

    family = "hrm_text"
    sites = ("prelude", "input", "pattern", "attn_out", "mlp_out", "block_resid", "state", "readout",
             "low_input", "low_resid", "low_attn_out", "low_mlp_out", "low_state")
    # False: transformers' own gradient routing (early L cycles under no_grad); True: every L cycle with grad
    all_cycles_grad: bool = False

    def __init__(self, base: nn.Module):
        super().__init__(base)
        cfg = self.config
        self.n_stack = cfg.num_layers_per_stack
        self.a, self.b, self.n_layers = 0, self.n_stack, self.n_stack   # the H stack is the block; no Coda layers
        self.native_loops = cfg.H_cycles
        self.max_loops = 2 * self.native_loops
        self.hook_prelude = HookPoint()
        self.loop = nn.ModuleDict({str(t): self._pass_sites() for t in range(1, self.max_loops + 1)})
        self.setup()

    def _pass_sites(self) -> Site:
        def stack():
            return nn.ModuleDict({str(i): Site("hook_resid_post", attn=Site("hook_pattern", "hook_out"),
                                               mlp=Site("hook_out")) for i in range(self.n_stack)})
        low = nn.ModuleDict({str(c): Site("hook_input", "hook_state", block=stack())
                             for c in range(1, self.config.L_cycles + 1)})
        return Site("hook_input", "hook_state", "hook_readout", block=stack(), low=low)

    @contextlib.contextmanager
    def all_cycles_with_grad(self) -> Iterator[HrmLooped]:
        """For the duration, every L cycle runs with grad (transformers runs the early ones under `no_grad`), so a
        gradient from the output reaches every cycle's state: `with looped.all_cycles_with_grad(): looped(ids)...`.

        The forward computes the same values (the logits are bit-identical); only the autograd graph, and so the
        memory a backward needs, grows. An enclosing `torch.no_grad()` still turns grad off everywhere."""
        saved = self.all_cycles_grad
        self.all_cycles_grad = True
        try:
            yield self
        finally:
            self.all_cycles_grad = saved

    @property
    def layers(self) -> nn.ModuleList:
        return self.text_model.H_module.layers

    @property
    def final_norm(self) -> nn.Module:
        """The norm that ends the H stack (what the head reads after): the raw lens's norm."""
        return self.text_model.H_module.final_norm

    # ----------------------------------------------------------------- the contract
    def _context(self, input_ids, attention_mask, position_ids, cache, loops, inputs_embeds=None, use_cache=False,
                 token_type_ids=None, **kwargs):
        tm, cfg = self.text_model, self.config
        if inputs_embeds is None:
            inputs_embeds = tm.embed_tokens(input_ids)
        inputs_embeds = inputs_embeds * tm.embedding_scale
        if use_cache and cache is None:
            cache = DynamicCache(config=cfg)
        slots = self.n_stack * loops * (cfg.L_cycles + 1)      # every L and H invocation's own slot, as transformers
        if cache is not None and len(cache.layers) < slots:    # past the native count: the config sized it for H_cycles
            if cache.get_seq_length() > 0:
                raise WorkbenchError(f"this cache was filled at fewer than {loops} H cycles; start a new one")
            cache.layers += [copy.deepcopy(cache.layers[k % len(cache.layers)]) for k in range(len(cache.layers), slots)]
        if position_ids is None:
            past_seen_tokens = cache.get_seq_length() if cache is not None else 0
            position_ids = torch.arange(inputs_embeds.shape[1], device=inputs_embeds.device) + past_seen_tokens
            position_ids = position_ids.unsqueeze(0)
        mask_kwargs = {"config": cfg, "inputs_embeds": inputs_embeds, "attention_mask": attention_mask,
                       "cache": cache, "position_ids": position_ids}
        is_first_iteration = cache is None or not cache.is_initialized
        if token_type_ids is not None and is_first_iteration and cfg.prefix_lm:
            mask_kwargs["block_sequence_ids"] = torch.where(token_type_ids == 1, 0, -1)
        mask = create_causal_mask(**mask_kwargs)
        rope = tm.rotary_emb(inputs_embeds, position_ids)
        return _Ctx(inputs_embeds, mask, rope, position_ids, cache, kwargs)

    def _stack(self, stack: nn.Module, h: torch.Tensor, ctx: _Ctx, cycle_offset: int, sites) -> torch.Tensor:
        """`HrmTextStack.forward` (its layers, then its final norm), each layer's output, pattern and attention /
        MLP outputs hooked."""
        for i, layer in enumerate(stack.layers):
            site = sites[str(i)]
            kw = dict(attention_mask=ctx.mask, cache=ctx.cache, position_embeddings=ctx.rope,
                      cycle_offset=cycle_offset, position_ids=ctx.pos, **ctx.kwargs)
            with contextlib.ExitStack() as hooks:
                if hooked(site.attn.hook_pattern):
                    hooks.enter_context(pattern_hook(self.config, site.attn.hook_pattern))
                hooks.enter_context(component_hooks(layer, site))
                h = layer(h, **kw)
            h = site.hook_resid_post(h)
        return stack.final_norm(h)

    def _run(self, ctx: _Ctx, loops: int):
        tm, cfg = self.text_model, self.config
        n, L = self.n_stack, cfg.L_cycles
        high = self.hook_prelude(ctx.x)
        low = tm.z_L_init.to(dtype=high.dtype, device=high.device).expand_as(high).contiguous()
        for h in range(loops):
            sites = self.loop[str(h + 1)]
            grad_iterations = tm.L_bp_cycles_padded[h] if h < len(tm.L_bp_cycles_padded) else 1
            grad_threshold = 0 if self.all_cycles_grad else L - grad_iterations
            for c in range(L):
                cycle_offset = (h * (L + 1) + c) * n
                low_site = sites.low[str(c + 1)]
                with contextlib.nullcontext() if c >= grad_threshold else torch.no_grad():
                    u = low_site.hook_input(low.to(high.device) + high)
                    low = low_site.hook_state(self._stack(tm.L_module, u, ctx, cycle_offset, low_site.block))
            cycle_offset = (h * (L + 1) + L) * n
            u = sites.hook_input(high + low.to(high.device))
            high = sites.hook_state(self._stack(tm.H_module, u, ctx, cycle_offset, sites.block))
            yield h + 1, Carry(high)

    def _coda(self, t: int, carry: Carry, ctx: _Ctx) -> torch.Tensor:
        return carry.state
