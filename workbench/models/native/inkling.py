"""transformers' Inkling2Loop (`inkling2_loop_text`) with every pass hooked.

The architecture (transformers/models/inkling2_loop/modeling_inkling2_loop.py, `Inkling2LoopTextModel.forward`):

    pre-loop layers [0, a)            -> (p, block states B_p)          the Prelude
    pass 1:  layers [a, b) on (p, B_p)                     -> h_1, B_1
    pass t:  layers [a, b) on (p, B_p) again (a restart), each layer's q / k / v / mlp inputs mixed with
             "messages" that learned queries (`message_input`) read from pass t-1's block states and h_{t-1},
             through low-rank tanh gates:  (1 - forget) * x + message_gate * message
    post-loop layers [b, n) on (h_T, B_T), `final_input` (block attention residual), norm, lm_head, softcap

A pass is one pass over layers [a, b); `loop.{t}.hook_state` is the last looped layer's output at pass t.
Reading pass t decodes (h_t, B_t) through the post-loop layers, `final_input`, norm, head and softcap:
exactly the model's own readout at T = t. Passes past the trained count run the same recurrence
(restart from p, messages from the pass before); they were never trained (docs/analyses.md).

Each pass has its own KV / convolution cache layers (appended after the model's layers), as in transformers.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from contextvars import ContextVar
from dataclasses import dataclass

import torch
from torch import nn
from transformer_lens.hook_points import HookPoint
from transformers import AttentionInterface
from transformers.cache_utils import DynamicCache
from transformers.masking_utils import (
    create_causal_mask,
    create_recurrent_attention_mask,
    create_sliding_window_causal_mask,
)
from transformers.modeling_outputs import MoeModelOutputWithPast
from transformers.models.inkling2_loop import modeling_inkling2_loop as ink

from workbench.loop.components import component_hooks
from workbench.loop.hooks import GATES
from workbench.models.native.contract import Carry, NativeLoopedLM, Site, hooked, instance_forward

HOOKED_INKLING = "workbench_hooked_inkling_eager"
_pattern: ContextVar = ContextVar("workbench_inkling_pattern", default=None)  # (module, hook point)


def hooked_inkling_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, position_bias=None,
                             sinks=None, **kwargs):
    """Inkling's eager attention (the same ops), its probabilities passing the active hook for one module."""
    key_states = ink.repeat_kv(key, module.num_key_value_groups)
    value_states = ink.repeat_kv(value, module.num_key_value_groups)
    attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
    if position_bias is not None:
        attn_weights = attn_weights + position_bias
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    if sinks is not None:
        combined_logits = torch.cat([attn_weights, sinks], dim=-1).float()
        attn_weights = nn.functional.softmax(combined_logits, dim=-1)[..., :-1].to(query.dtype)
    else:
        attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
    active = _pattern.get()
    if active is not None and active[0] is module:
        attn_weights = active[1](attn_weights)
    attn_weights = nn.functional.dropout(attn_weights, p=dropout, training=module.training)
    attn_output = torch.matmul(attn_weights, value_states)
    return attn_output.transpose(1, 2).contiguous(), attn_weights


AttentionInterface.register(HOOKED_INKLING, hooked_inkling_attention)


@contextlib.contextmanager
def _pattern_of(config, module, point):
    """For one call: `module`'s attention probabilities pass `point` (every other module unchanged)."""
    saved = config._attn_implementation
    token = _pattern.set((module, point))
    config._attn_implementation = HOOKED_INKLING
    try:
        yield
    finally:
        config._attn_implementation = saved
        _pattern.reset(token)


def _gate_forward(gate: nn.Module, site: Site):
    """`Inkling2LoopMessageGate.forward` (the same ops) with the forget and message gates hooked."""
    def forward(hidden_states, message):
        hidden_states, message = hidden_states.float(), message.float()
        gate_hidden_states = torch.cat([gate.norm(hidden_states), gate.norm(message)], dim=-1)
        gate_hidden_states = gate.down_proj(gate_hidden_states.to(gate.down_proj.weight.dtype)).float()
        forget_gate = site.hook_forget(torch.tanh(gate.forget_gate_proj(gate_hidden_states)))
        message_gate = site.hook_message(torch.tanh(gate.message_gate_proj(gate_hidden_states)))
        return (1 - forget_gate) * hidden_states + message_gate * message
    return forward


@dataclass
class _Ctx:
    x: torch.Tensor
    masks: dict
    rel: dict
    pos: torch.Tensor
    cache: object
    kwargs: dict


class InklingLooped(NativeLoopedLM):
    """Inkling2LoopForCausalLM with a hook point per site and per pass (passes 1..2 x loop_num_passes)."""

    family = "inkling2_loop"
    sites = ("prelude_resid", "prelude", "input", "pattern", "attn_out", "mlp_out", "block_resid", "state",
             "coda_resid", "readout", "message", "message_pattern", "forget_gate", "message_gate")
    output_class = MoeModelOutputWithPast

    def __init__(self, base: nn.Module):
        super().__init__(base)
        # transformers says, once per process on stderr, that it runs its reference PyTorch causal convolution
        # (exact, slower) without the `causal_conv1d` kernel: the workbench's reads are that reference path.
        logging.getLogger("transformers.integrations.hub_kernels").setLevel(logging.ERROR)
        cfg = self.config
        self.a, self.b = cfg.loop_layer_index_start, cfg.loop_layer_index_end
        self.n_layers = cfg.num_hidden_layers
        self.native_loops = cfg.loop_num_passes
        self.max_loops = 2 * self.native_loops
        self.prelude = nn.ModuleDict({str(i): Site("hook_resid_post") for i in range(self.a)})
        self.hook_prelude = HookPoint()
        self.loop = nn.ModuleDict({str(t): self._pass_sites(t) for t in range(1, self.max_loops + 1)})
        self.setup()

    def _pass_sites(self, t: int) -> Site:
        def block(i):
            gates = {f"{g}_gate": Site("hook_forget", "hook_message") for g in GATES} if t > 1 else {}
            extra = {"message": Site("hook_pattern")} if t > 1 else {}
            return Site("hook_resid_post", *(["hook_message"] if t > 1 else []),
                        attn=Site("hook_pattern", "hook_out"), mlp=Site("hook_out"), **extra, **gates)
        blocks = nn.ModuleDict({str(i): block(i) for i in range(self.a, self.b)})
        coda = nn.ModuleDict({str(i): Site("hook_resid_post") for i in range(self.b, self.n_layers)})
        return Site("hook_input", "hook_state", "hook_readout", block=blocks, coda=coda)

    @property
    def text_model(self) -> nn.Module:
        """Inkling2LoopTextModel: `base.model`, or `base.model.language_model` of the composite (vision + text)."""
        inner = self.base.model
        return getattr(inner, "language_model", inner)

    @property
    def layers(self) -> nn.ModuleList:
        return self.text_model.layers

    @property
    def final_norm(self) -> nn.Module:
        """The text model's final norm (the raw lens's norm; the composite's `base.model` has none of its own)."""
        return self.text_model.norm

    # ----------------------------------------------------------------- the contract
    def _context(self, input_ids, attention_mask, position_ids, cache, loops, inputs_embeds=None, use_cache=False,
                 **kwargs):
        tm, cfg = self.text_model, self.config
        if inputs_embeds is None:
            inputs_embeds = tm.embed_tokens(input_ids)
        if use_cache and cache is None:
            cache = DynamicCache(config=cfg)
        if position_ids is None:
            past_seen_tokens = cache.get_seq_length() if cache is not None else 0
            position_ids = torch.arange(inputs_embeds.shape[1], device=inputs_embeds.device) + past_seen_tokens
            position_ids = position_ids.unsqueeze(0)
        if not isinstance(masks := attention_mask, dict):
            mask_kwargs = {"config": cfg, "inputs_embeds": inputs_embeds, "attention_mask": attention_mask,
                           "cache": cache, "position_ids": position_ids}
            masks = {"full_attention": create_causal_mask(**mask_kwargs),
                     "sliding_attention": create_sliding_window_causal_mask(**mask_kwargs),
                     "linear_attention": create_recurrent_attention_mask(**mask_kwargs)}
        rel = {"full_attention": ink.get_relative_distance(inputs_embeds, cache, is_sliding=False),
               "sliding_attention": ink.get_relative_distance(inputs_embeds, cache, is_sliding=True)}
        if cache is not None and len(cache.layers) == cfg.num_hidden_layers:
            loop_cache_layers = cache.layers[self.a:self.b]   # one copy of the loop layers' caches per extra pass
            cache.layers += [copy.deepcopy(layer) for layer in loop_cache_layers * (loops - 1)]
        return _Ctx(inputs_embeds, masks, rel, position_ids, cache, kwargs)

    def _call(self, layer, h, block_states, ctx, *messages, **extra):
        return layer(h, block_states, *messages, attention_mask=ctx.masks[layer.attention_type],
                     relative_distance=ctx.rel[layer.attention_type], conv_mask=ctx.masks["linear_attention"],
                     cache=ctx.cache, **extra, position_ids=ctx.pos, **ctx.kwargs)

    def _layer(self, layer, site, h, block_states, ctx, *messages, **extra):
        """One looped layer call, its attention pattern, attention / MLP outputs and message gates hooked when asked."""
        with contextlib.ExitStack() as stack:
            if hooked(site.attn.hook_pattern):
                stack.enter_context(_pattern_of(self.config, layer.self_attn, site.attn.hook_pattern))
            stack.enter_context(component_hooks(layer, site))  # self_attn's / mlp's own outputs, before the convolutions
            if messages:
                for g in GATES:
                    gate_site = getattr(site, f"{g}_gate")
                    if hooked(gate_site.hook_forget) or hooked(gate_site.hook_message):
                        gate = getattr(layer, f"{g}_message_gate")
                        stack.enter_context(instance_forward(gate, _gate_forward(gate, gate_site)))
            return self._call(layer, h, block_states, ctx, *messages, **extra)

    def _messages(self, site, previous_block_states, previous_hidden_states, j):
        message_input = self.text_model.message_input
        if hooked(site.message.hook_pattern):
            with _pattern_of(self.config, message_input, site.message.hook_pattern):
                out = message_input(previous_block_states, previous_hidden_states, j)
        else:
            out = message_input(previous_block_states, previous_hidden_states, j)
        return site.hook_message(out)

    def _run(self, ctx: _Ctx, loops: int):
        x = ctx.x
        hidden_states = x
        block_states = x.new_zeros(*x.shape[:-1], 0, x.shape[-1])
        for i in range(self.a):
            layer = self.layers[i]
            new_hidden_states = self._call(layer, hidden_states, block_states, ctx)
            if layer.is_block_boundary:
                block_states = torch.cat([block_states.to(hidden_states.device), hidden_states.unsqueeze(-2)], dim=-2)
            hidden_states = self.prelude[str(i)].hook_resid_post(new_hidden_states)
        pre_loop_hidden_states = self.hook_prelude(hidden_states)
        pre_loop_block_states = block_states
        num_pre_loop_blocks = pre_loop_block_states.shape[-2]
        num_loop_layers = self.b - self.a
        for t in range(1, loops + 1):
            sites = self.loop[str(t)]
            if t > 1:  # +1 skips the state the first loop layer appended
                previous_block_states = block_states[..., num_pre_loop_blocks + 1:, :]
                previous_hidden_states = hidden_states
                cache_offset = self.n_layers + (t - 2) * num_loop_layers - self.a
            hidden_states = sites.hook_input(pre_loop_hidden_states)
            block_states = pre_loop_block_states
            for j, i in enumerate(range(self.a, self.b)):
                layer, site = self.layers[i], sites.block[str(i)]
                if t == 1:
                    new_hidden_states = self._layer(layer, site, hidden_states, block_states, ctx)
                else:
                    messages = self._messages(site, previous_block_states, previous_hidden_states, j)
                    new_hidden_states = self._layer(layer, site, hidden_states, block_states, ctx, messages,
                                                    cache_offset=cache_offset)
                if layer.is_block_boundary:
                    block_states = torch.cat([block_states.to(hidden_states.device), hidden_states.unsqueeze(-2)],
                                             dim=-2)
                hidden_states = site.hook_resid_post(new_hidden_states)
            hidden_states = sites.hook_state(hidden_states)
            yield t, Carry(hidden_states, block_states)

    def _coda(self, t: int, carry: Carry, ctx: _Ctx) -> torch.Tensor:
        hidden_states, block_states = carry.state, carry.extra
        sites = self.loop[str(t)].coda
        for i in range(self.b, self.n_layers):
            layer = self.layers[i]
            new_hidden_states = self._call(layer, hidden_states, block_states, ctx)
            if layer.is_block_boundary:
                block_states = torch.cat([block_states.to(hidden_states.device), hidden_states.unsqueeze(-2)], dim=-2)
            hidden_states = sites[str(i)].hook_resid_post(new_hidden_states)
        tm = self.text_model
        hidden_states = tm.final_input(block_states, hidden_states)[0]
        return tm.norm(hidden_states).to(ctx.x.dtype)

    def _cap(self, logits: torch.Tensor) -> torch.Tensor:
        return self.base.logit_softcap(logits.float())

