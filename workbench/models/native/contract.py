"""The adapter contract: a looped model that transformers ships, presented with the workbench's looped interface.

A family adapter (one file in this package) subclasses `NativeLoopedLM` and supplies four pieces,
each calling transformers' own modules in transformers' own order (docs/adding-a-looped-architecture.md):

    _context(input_ids, attention_mask, position_ids, cache, loops)  -> ctx   embeddings, masks, rotary tables
    _run(ctx, loops)          yields (t, carry) for t = 1..loops       the passes; carry.state is h_t
    _coda(t, carry, ctx)      -> [b, s, d]                              what the LM head reads (final norm included)
    _cap(logits)              -> logits                                 the family's logit transform (softcap)

and declares `a`, `b`, `n_layers`, `layers`, `native_loops`, `max_loops`, `family`, `text_model` and its
hook sites (module paths spelled by `workbench.loop.hooks`). This class gives every family the rest:
`forward`, `read` (every pass decoded at chosen positions and candidates), `read_final`, `generate`
(transformers' own generate, with its inner forward replaced by the adapter's passes), and TransformerLens'
`run_with_cache` / `run_with_hooks` / `hooks`, where a name the family does not have is an error.

With no hook attached, every op is transformers' own, in its order: the logits are bit-identical to
`AutoModelForCausalLM`'s (tests/test_native.py).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch import nn
from transformer_lens import HookedRootModule
from transformers.cache_utils import DynamicCache
from transformers.modeling_outputs import BaseModelOutputWithPast

from workbench.errors import WorkbenchError
from workbench.loop.components import hooked as hooked  # re-exported: the adapters' "is this hook point hooked?"
from workbench.loop.hooks import StrictHookNames
from workbench.loop.looped import LoopedLM, LoopedOutput, LoopReadout, _Site
from workbench.loop.positions import position_ids

Site = _Site  # a named holder of hook points (LoopedLM's own): module paths spell the public hook names


@dataclass
class Carry:
    """What one pass hands to the next and to the Coda: `state` is h_t; `extra` is the family's own."""

    state: torch.Tensor
    extra: object = None


class NativeLoopedLM(StrictHookNames, HookedRootModule):
    """Base of the native adapters. `base` is transformers' *ForCausalLM, held by reference (never copied)."""

    family: str = ""
    halting = None          # no halting head
    halt_rule = "threshold"  # how `read(...).halt_probs` stop a row, when a family has them (Ouro: "cdf")
    has_initial_state = False  # Raven starts its steps from s_0 (`init_state=` / `init_seed=`); the others do not
    memory = None
    retrofit_config = None  # not a retrofit
    # what a native model offers beyond reading every pass (`workbench.models.looped.CAPABILITIES`), and why not
    supports: frozenset[str] = frozenset()
    unsupported = {
        "base_identity": "a native model has no base to reproduce at loop 1; its exactness against transformers' own "
                         "forward is tests/test_native.py (max |Δlogit| = 0.0)",
        "trained_adapters": "it audits the gradients of a retrofit's trainable re-entry and adapter; a native model "
                            "has neither (the workbench trains nothing in it)",
        "dense_loop_cost": "its cost model counts one dense block per loop; Inkling's MoE layers (top-k of n experts) "
                           "and HRM's L cycles inside every pass do not fit it",
        "adaptive_read": "a native model has no halting head to stop a row early",
        "loop_kv_cache": "a native model recomputes the whole prompt: its cache is transformers' own, not one slot per "
                         "loop and layer",
    }

    def __init__(self, base: nn.Module):
        super().__init__()
        self.base = base
        self.precision = "fp32"  # no autocast: a native model runs in the dtype it was loaded in

    # ----------------------------------------------------------------- what a family declares
    a: int
    b: int
    n_layers: int
    native_loops: int
    max_loops: int
    sites: tuple[str, ...]   # the hook sites the family has (names of workbench.loop.hooks.SITES)

    @property
    def config(self):
        """The (text) config of the transformers model: hidden_size, heads, `_attn_implementation`."""
        return self.text_model.config

    @property
    def text_model(self) -> nn.Module:
        return self.base.model

    @property
    def layers(self) -> nn.ModuleList:
        raise NotImplementedError

    def _context(self, input_ids, attention_mask, position_ids, cache, loops, inputs_embeds=None, **kwargs):
        raise NotImplementedError

    def _run(self, ctx, loops: int):
        raise NotImplementedError

    def _coda(self, t: int, carry: Carry, ctx) -> torch.Tensor:
        raise NotImplementedError

    def _cap(self, logits: torch.Tensor) -> torch.Tensor:
        return logits

    def logit_transform(self, logits: torch.Tensor) -> torch.Tensor:
        """The family's transform of the head's output (Inkling's softcap; identity for HRM), for lenses."""
        return self._cap(logits)

    @property
    def final_norm(self) -> nn.Module:
        """The norm the LM head reads after (the family's own)."""
        raise NotImplementedError

    def all_cycles_with_grad(self):
        """A context in which every pass is differentiable; a family that runs some passes without grad (HRM's
        L cycles) overrides it. Here: nothing to change."""
        return contextlib.nullcontext(self)

    output_class = BaseModelOutputWithPast  # what the family's text model returns (generate reads it)
    # the family's own exit criteria, by method name -> default threshold (Huginn's zero-shot exits); none here
    own_exits: dict[str, float] = {}

    def own_exit_steps(self, input_ids, attention_mask=None, loops: int | None = None) -> dict[str, torch.Tensor]:
        """{method: [batch] the step (1-based) each row's own exit criterion stops it, at its default threshold}, in one
        forward to `loops`; the exit_rules probe puts them beside the post-hoc rules. A family with `own_exits`
        overrides it."""
        raise WorkbenchError(f"this {self.family} model has no exit criteria of its own")

    # ----------------------------------------------------------------- checks
    def _check_hook_names(self, names) -> None:
        unknown = [n for n in names if isinstance(n, str) and n not in self.hook_dict]
        if unknown:
            raise WorkbenchError(f"hook '{unknown[0]}' does not exist on this {self.family} model (passes "
                                 f"1..{self.max_loops}; its sites: {', '.join(self.sites)}; docs/hooks.md)")

    def hooks(self, fwd_hooks=(), bwd_hooks=(), *args, **kwargs):
        """TransformerLens' hooks context; a hook name that does not exist is an error."""
        self._check_hook_names([name for name, _ in [*fwd_hooks, *bwd_hooks]])
        return super().hooks(list(fwd_hooks), list(bwd_hooks), *args, **kwargs)

    def _loops(self, loops: int | None) -> int:
        if loops is None:
            return self.native_loops
        if isinstance(loops, bool) or not isinstance(loops, int) or not 1 <= loops <= self.max_loops:
            raise WorkbenchError(f"loops={loops!r} is outside 1..{self.max_loops} for this {self.family} model "
                                 f"(native {self.native_loops}; the adapter reads up to twice that)")
        return loops

    def _positions(self, input_ids, attention_mask, position_ids_):
        if input_ids.dim() != 2 or 0 in input_ids.shape:
            raise WorkbenchError(f"input_ids of shape {tuple(input_ids.shape)} must be [batch >= 1, seq >= 1]")
        limit = self.config.max_position_embeddings
        if input_ids.shape[-1] > limit:
            raise WorkbenchError(f"a prompt of {input_ids.shape[-1]} tokens is longer than the model's {limit} "
                                 "positions (max_position_embeddings); give shorter prompts")
        if position_ids_ is None and attention_mask is not None:
            return position_ids(attention_mask)  # counted over real tokens: padding cannot shift them
        return position_ids_

    # ----------------------------------------------------------------- forward and reads
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, loops: int | None = None,
                position_ids: torch.Tensor | None = None, cache=None) -> LoopedOutput:
        """Returns `LoopedOutput(logits=[batch, pos, vocab])` read through the Coda at pass `loops` (default native).

        Positions default to `workbench.loop.positions.position_ids(attention_mask)`; pass `position_ids` to
        choose them (transformers' own forward counts padding: give it the same ids to compare).
        `cache` (a `new_cache(loops)`) decodes incrementally: the first call fills it with the prompt, each later
        one gives only the new tokens, with `attention_mask` over every token so far (positions continue per row).
        """
        loops = self._loops(loops)
        if cache is None:
            pos = self._positions(input_ids, attention_mask, position_ids)
        else:
            if getattr(cache, "workbench_loops", loops) != loops:
                raise WorkbenchError(f"this cache holds {cache.workbench_loops} passes; a forward of {loops} was asked for")
            whole = input_ids if attention_mask is None else attention_mask
            pos = self._positions(whole, attention_mask, position_ids)
            if pos is not None and position_ids is None:
                pos = pos[:, -input_ids.shape[1]:]
        ctx = self._context(input_ids, attention_mask, pos, cache, loops, use_cache=cache is not None)
        for t, carry in self._run(ctx, loops):
            pass
        normed = self.loop[str(loops)].hook_readout(self._coda(loops, carry, ctx))
        return LoopedOutput(logits=self._cap(self.base.lm_head(normed)))

    def read(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, loops: int | None = None,
             positions: torch.Tensor | None = None, candidates: torch.Tensor | None = None,
             return_states: bool = False) -> LoopReadout:
        """One forward up to `loops` passes, reading every pass through the Coda at the asked positions.

        Args and returns as `workbench.loop.looped.LoopedLM.read`: scores [batch, T, n_positions, n_candidates
        or vocab] (fp32, after the family's logit transform), states h_t at the read positions when asked.
        """
        loops, read_at, weight, gather, ctx = self._read_setup(input_ids, attention_mask, loops, positions,
                                                               candidates)
        scores, states, halts = [], [], []
        for t, carry in self._run(ctx, loops):
            scores.append(self._readout(t, carry, ctx, gather, weight))
            if return_states:
                states.append(carry.state.gather(1, gather).float())
            halts.append(self._continue_prob(carry, read_at))
        return LoopReadout(scores=torch.stack(scores, dim=1), positions=read_at,
                           states=torch.stack(states, dim=1) if return_states else None,
                           halt_probs=None if halts[0] is None else torch.stack(halts, dim=1).float())

    def _continue_prob(self, carry: Carry, read_at: torch.Tensor) -> torch.Tensor | None:
        """[batch] the family's own continue probability at each row's last read position, when it has a learned
        exit (Ouro's gate); None otherwise."""
        return None

    def read_final(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                   loops: int | None = None, positions: torch.Tensor | None = None,
                   candidates: torch.Tensor | None = None) -> torch.Tensor:
        """Pass T's scores only [batch, n_positions, n_candidates or vocab] (the Coda runs once), fp32."""
        loops, _, weight, gather, ctx = self._read_setup(input_ids, attention_mask, loops, positions, candidates)
        for t, carry in self._run(ctx, loops):
            pass
        return self._readout(loops, carry, ctx, gather, weight)

    def _read_setup(self, input_ids, attention_mask, loops, positions, candidates):
        """What read and read_final share: the pass count, read positions, unembedding rows, gather index, context."""
        loops = self._loops(loops)
        pos = self._positions(input_ids, attention_mask, None)
        read_at = self._read_positions(input_ids, attention_mask, positions)
        weight = self._unembedding(candidates)
        gather = read_at.unsqueeze(-1).expand(-1, -1, self.config.hidden_size)
        ctx = self._context(input_ids, attention_mask, pos, None, loops)
        return loops, read_at, weight, gather, ctx

    def _readout(self, t, carry, ctx, gather, weight) -> torch.Tensor:
        normed = self.loop[str(t)].hook_readout(self._coda(t, carry, ctx).gather(1, gather))
        if weight is None:
            logits = self.base.lm_head(normed)
        elif weight.dim() == 2:
            logits = nn.functional.linear(normed, weight)
        else:
            logits = torch.einsum("bpd,bcd->bpc", normed, weight)
        return self._cap(logits).float()

    _read_positions = LoopedLM._read_positions  # default: each row's last real token; else checked [batch, n]

    def _unembedding(self, candidates):
        weight = self.base.lm_head.weight
        if candidates is None:
            return None
        candidates = torch.as_tensor(candidates, dtype=torch.long, device=weight.device)
        if candidates.numel() == 0 or candidates.min() < 0 or candidates.max() >= weight.shape[0]:
            raise WorkbenchError(f"candidate token ids must be at least one, each in 0..{weight.shape[0] - 1}")
        return weight[candidates]

    # ----------------------------------------------------------------- generation
    def new_cache(self, loops: int | None = None):
        """An empty KV cache for decoding at `loops` passes (default native) through `forward(..., cache=...)`.

        transformers' own cache (`DynamicCache(config=...)`), which the family's context extends to one copy of the
        looped layers' slots per pass at any pass count 1..max_loops: exact past the native count too."""
        cache = DynamicCache(config=self.config)
        cache.workbench_loops = self._loops(loops)
        return cache

    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs):
        """transformers' `generate` on the base model, its inner forward replaced by the adapter's hooked passes.

        Runs at the native pass count (the KV cache holds one copy of the looped layers per native pass);
        hooks attached with `hooks(...)` fire at every decoding step. `workbench.generation.generate` decodes at
        any pass count 1..max_loops (on `new_cache`) and equals this at the native one.
        """
        inner = self.text_model
        inner.forward = self._inner_forward
        try:
            return self.base.generate(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        finally:
            del inner.forward

    def _inner_forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None, inputs_embeds=None,
                       use_cache=None, **kwargs):
        """The transformers text model's forward, through the adapter (what `generate` calls)."""
        cache = kwargs.pop("past_key_values", cache)
        for flag in ("output_attentions", "output_hidden_states", "return_dict", "output_router_logits"):
            kwargs.pop(flag, None)
        use_cache = self.config.use_cache if use_cache is None else use_cache
        loops = self.native_loops
        ctx = self._context(input_ids, attention_mask, position_ids, cache, loops, inputs_embeds=inputs_embeds,
                            use_cache=use_cache, **kwargs)
        for t, carry in self._run(ctx, loops):
            pass
        normed = self.loop[str(loops)].hook_readout(self._coda(loops, carry, ctx))
        return self.output_class(last_hidden_state=normed, cache=ctx.cache)


def frozen(module: nn.Module) -> nn.Module:
    """`module` in eval mode with every parameter frozen: how `load_looped` returns a model (the workbench trains
    nothing in a native one)."""
    module.eval()
    for p in module.parameters():
        p.requires_grad_(False)
    return module


@contextlib.contextmanager
def instance_forward(module: nn.Module, forward):
    """Routes one module's calls through `forward` for the duration (removed after, whatever happens)."""
    module.forward = forward
    try:
        yield
    finally:
        del module.forward
