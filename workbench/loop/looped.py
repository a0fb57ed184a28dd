"""LoopedLM: Prelude -> weight-tied Block run T times with re-entry -> Coda, every loop hooked.

The forward reads like the recurrence in docs/architecture.md:

    p = Prelude(embed(tokens));  h_0 = p
    for t in 1..T:
        u_t = h_{t-1} if t == 1 else ReEntry(p, h_{t-1})
        h_t = Block(u_t)                      # the same layer objects every loop
        readout_t = Norm(Coda(h_t))           # at the positions the caller asks for

Hook points exist per site *and per loop index* (docs/hooks.md), so `run_with_cache`
keeps every loop rather than silently only the last.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch import nn
from transformer_lens import HookedRootModule
from transformer_lens.hook_points import HookPoint
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

from workbench.errors import WorkbenchError
from workbench.loop.attention import pattern_hook
from workbench.loop.cache import LoopCache
from workbench.loop.components import component_hooks, hooked
from workbench.loop.config import RetrofitConfig
from workbench.loop.hooks import StrictHookNames, hook_name
from workbench.loop.positions import last_real_token, position_ids
from workbench.precision import autocast


@dataclass(frozen=True)
class LoopContext:
    """What every layer of one forward shares, made once by `LoopedLM._context`: the base model's own.

    x: [b, s, d] the token embeddings (the Prelude's input).
    masks: layer i's attention mask at index i (full or sliding window, by the layer's type).
    positions: [b, s] position ids, counted over real tokens.
    rope: the rotary (cos, sin) tables of `positions`.
    cache: the loop KV cache when decoding (`workbench.loop.cache`), which every layer is handed; else None.
    """

    x: torch.Tensor
    masks: list
    positions: torch.Tensor
    rope: tuple
    cache: LoopCache | None = None

    def rows(self, pick) -> LoopContext:
        """The context of the rows `pick` keeps (`_rows_picker`); the cache is not split."""
        return LoopContext(pick(self.x), pick(self.masks), pick(self.positions), pick(self.rope), self.cache)


@dataclass
class LoopReadout:
    """What `LoopedLM.read` returns.

    scores: [batch, T, n_positions, n_candidates or vocab], loop 1 first.
    positions: [batch, n_positions], the sequence index read in each row.
    states: [batch, T, n_positions, d_model] h_t at the read positions, when asked.
    halt_probs: [batch, T] continue probabilities, when the model has a halting head.
    """

    scores: torch.Tensor
    positions: torch.Tensor
    states: torch.Tensor | None = None
    halt_probs: torch.Tensor | None = None


@dataclass
class AdaptiveReadout:
    """What `LoopedLM.adaptive_read` returns: each row read once, at the loop where it stopped.

    scores: [batch, n_positions, n_candidates or vocab] at each row's own last loop.
    positions: [batch, n_positions].
    loops_used: [batch] the loops each row ran (its halting loop), long.
    halt_probs: [batch, T] continue probabilities p_t, NaN after the row stopped.
    row_loops: rows x loops actually computed through the block (= loops_used.sum()); a fixed-depth
        run of the same batch computes batch x T.
    budget: T, the most loops any row could run.
    """

    scores: torch.Tensor
    positions: torch.Tensor
    loops_used: torch.Tensor
    halt_probs: torch.Tensor
    row_loops: int
    budget: int


@dataclass
class LoopedOutput:
    """What `LoopedLM.forward` returns: `logits` [batch, pos, vocab] read at the final loop."""

    logits: torch.Tensor


class _Site(nn.Module):
    """A named holder of hook points, so that module paths spell the public hook names."""

    def __init__(self, *hooks: str, **children: nn.Module):
        super().__init__()
        for name in hooks:
            setattr(self, name, HookPoint())
        for name, child in children.items():
            setattr(self, name, child)


def _loop_sites(block: range, coda: range, memory: bool, halting: bool) -> _Site:
    blocks = nn.ModuleDict({
        str(i): _Site("hook_resid_post", attn=_Site("hook_pattern", "hook_out"), mlp=_Site("hook_out"),
                      **({"memory": _Site("hook_out")} if memory else {}))
        for i in block
    })
    children = {"block": blocks, "coda": nn.ModuleDict({str(i): _Site("hook_resid_post") for i in coda})}
    if halting:
        children["halt"] = _Site("hook_prob")
    return _Site("hook_input", "hook_state", "hook_readout", **children)


class LoopedLM(StrictHookNames, HookedRootModule):
    """A looped retrofit of a decoder LM. Build it with `workbench.loop.surgery.retrofit`.

    The base model is held by reference (its weights are shared, never copied). Re-entry,
    memory, halting and loop-code modules are the only new parameters. `retrofit_config` declares the
    architecture (`workbench.loop.config.RetrofitConfig`); `a`, `b`, `max_loops` and
    `memory_window` read it. (`config` is the base's Hugging Face config.)
    """

    retrofit_config: RetrofitConfig
    native_loops = None   # no pass count of its own: any T in 1..max_loops (`workbench.models.looped.LoopedModel`)
    halt_rule = "threshold"  # the halting head's continue probability p_t < tau stops a row
    has_initial_state = False  # the loop starts from the Prelude's output, not from a state of its own (Raven's s_0)
    supports = frozenset({"base_identity", "trained_adapters", "dense_loop_cost", "adaptive_read", "loop_kv_cache"})
    unsupported: dict[str, str] = {}

    def __init__(self, base: nn.Module, retrofit_config: RetrofitConfig, reentry: nn.Module,
                 memory: nn.ModuleDict | None = None, halting: nn.Module | None = None,
                 loop_codes: nn.Module | None = None):
        super().__init__()
        self.base = base
        self.retrofit_config = retrofit_config
        self.n_layers = len(base.model.layers)
        self.reentry = reentry
        self.memory = memory
        self.halting = halting
        self.loop_codes = loop_codes  # `reentry.LoopCodes`, when the retrofit declares them
        self.precision = "fp32"  # "bf16": frozen weights in bf16, forward under autocast (workbench.precision)
        self.prelude = nn.ModuleDict({str(i): _Site("hook_resid_post") for i in range(self.a)})
        self.hook_prelude = HookPoint()
        block_range, coda_range = range(self.a, self.b), range(self.b, self.n_layers)
        self.loop = nn.ModuleDict({
            str(t): _loop_sites(block_range, coda_range, memory is not None, halting is not None)
            for t in range(1, self.max_loops + 1)
        })
        # Adaptive inference's loops per row [batch] (after every row stopped): reading or patching it is public.
        self.hook_loops_used = HookPoint() if halting is not None else None
        self.setup()

    # ----------------------------------------------------------------- pieces
    @property
    def a(self) -> int:
        """The first looped layer."""
        return self.retrofit_config.block[0]

    @property
    def b(self) -> int:
        """One past the last looped layer: the Coda starts here."""
        return self.retrofit_config.block[1]

    @property
    def max_loops(self) -> int:
        return self.retrofit_config.max_loops

    @property
    def memory_window(self) -> int:
        return self.retrofit_config.memory_window

    @property
    def layers(self) -> nn.ModuleList:
        return self.base.model.layers

    @property
    def config(self):
        return self.base.config

    @property
    def final_norm(self) -> nn.Module:
        """The base's final norm, which the LM head reads after."""
        return self.base.model.norm

    def logit_transform(self, logits: torch.Tensor) -> torch.Tensor:
        """The identity: a retrofit's head output is its logits (a native family may transform them)."""
        return logits

    def all_cycles_with_grad(self) -> contextlib.AbstractContextManager:
        """Every loop of a retrofit is differentiable already: a context that changes nothing."""
        return contextlib.nullcontext(self)

    def new_cache(self, loops: int) -> LoopCache:
        """An empty KV cache for decoding at `loops` loops (`workbench.loop.cache.LoopCache`): one slot per
        (loop, layer) use of the shared layers. Exact with loop-time memory too (it attends along loop time only)."""
        self._check_loops(loops)
        return LoopCache(self.config, (self.a, self.b), self.n_layers, loops)

    def _check_hook_names(self, names) -> None:
        """Raises WorkbenchError for a hook name this retrofit lacks: TransformerLens would silently skip it."""
        unknown = [n for n in names if isinstance(n, str) and n not in self.hook_dict]
        if unknown:
            raise WorkbenchError(f"hook '{unknown[0]}' does not exist on this retrofit (loops 1..{self.max_loops}); "
                                 f"names look like {hook_name('state', 1)} or {hook_name('block_resid', 2, self.a)}")

    def _check_loops(self, loops: int) -> None:
        if not isinstance(loops, int) or not 1 <= loops <= self.max_loops:
            raise WorkbenchError(f"loops={loops!r} is outside 1..{self.max_loops} (this retrofit's max_loops)")

    def _context(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                 cache: LoopCache | None = None) -> LoopContext:
        """Embeddings, per-layer-type masks, position ids and rotary tables: the base model's own.

        With a `cache` (decoding), `input_ids` are the new tokens and `attention_mask` covers the cached ones too;
        the context then carries the cache, which `_layer` hands to every layer."""
        if input_ids.dim() != 2 or 0 in input_ids.shape:
            raise WorkbenchError(f"input_ids of shape {tuple(input_ids.shape)} must be [batch >= 1, seq >= 1]")
        limit = self.config.max_position_embeddings
        length = input_ids.shape[-1] if cache is None or attention_mask is None else attention_mask.shape[-1]
        if length > limit:  # refused before eager attention allocates [b, heads, s, s]
            raise WorkbenchError(f"a prompt of {length} tokens is longer than the model's {limit} "
                                 "positions (max_position_embeddings); give shorter prompts")
        inner = self.base.model
        x = inner.embed_tokens(input_ids)
        if attention_mask is None:
            seen = 0 if cache is None else cache.get_seq_length()
            pos = torch.arange(seen, seen + x.shape[1], device=x.device).unsqueeze(0)
        else:
            pos = position_ids(attention_mask)[:, -x.shape[1]:]  # counted over real tokens, cached ones included
        # Always build the mask: with eager attention an absent mask is not causal.
        kw = dict(config=self.config, inputs_embeds=x, attention_mask=attention_mask, cache=cache, position_ids=pos)
        masks = {"full_attention": create_causal_mask(**kw)}
        layer_types = getattr(self.config, "layer_types", None) or ["full_attention"] * self.n_layers
        if "sliding_attention" in layer_types:
            masks["sliding_attention"] = create_sliding_window_causal_mask(**kw)
        rope = inner.rotary_emb(x, pos)
        return LoopContext(x, [masks[layer_types[i]] for i in range(self.n_layers)], pos, rope, cache)

    def _layer(self, i: int, h: torch.Tensor, ctx: LoopContext, site: nn.Module | None = None) -> torch.Tensor:
        """Layer i on h; for a block layer, `site` (loop t's) hooks its attention pattern, attention output and
        MLP output, each only when hooked (so with no hook attached the call is the base layer's own)."""
        kw = dict(attention_mask=ctx.masks[i], position_ids=ctx.positions, position_embeddings=ctx.rope)
        if ctx.cache is not None:
            kw["cache"] = ctx.cache
        if site is None:
            return self.layers[i](h, **kw)
        with contextlib.ExitStack() as stack:
            if hooked(site.attn.hook_pattern):
                stack.enter_context(pattern_hook(self.config, site.attn.hook_pattern))
            stack.enter_context(component_hooks(self.layers[i], site))
            return self.layers[i](h, **kw)

    def _coda(self, t: int, h: torch.Tensor, ctx: LoopContext) -> torch.Tensor:
        """Coda layers and the final norm on loop t's state: [b, s, d] -> [b, s, d]."""
        sites = self.loop[str(t)].coda
        for i in range(self.b, self.n_layers):
            h = sites[str(i)].hook_resid_post(self._layer(i, h, ctx))
        return self.base.model.norm(h)

    def _halt_prob(self, t: int, h: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        return self.loop[str(t)].halt.hook_prob(self.halting(h, attention_mask))

    # ----------------------------------------------------------------- the loop
    def _loop(self, input_ids, attention_mask, loops: int, cache: LoopCache | None = None):
        """Yields (t, h_t, ctx) for t = 1..loops; the recurrence of docs/architecture.md."""
        self._check_loops(loops)
        if cache is not None and cache.loops != loops:
            raise WorkbenchError(f"this cache holds {cache.loops} loops; a forward of {loops} loops was asked for")
        ctx = self._context(input_ids, attention_mask, cache)
        h, p = self._prelude(ctx)
        past: dict[int, list[tuple]] = {i: [] for i in range(self.a, self.b)}
        for t in range(1, loops + 1):
            if cache is not None:
                cache.at_loop(t)
            h = self._step(t, h, p, ctx, past)
            yield t, h, ctx

    def _prelude(self, ctx: LoopContext) -> tuple[torch.Tensor, torch.Tensor]:
        """(h_0, p): the Prelude's output [b, s, d], twice (the state and the re-entry's anchor)."""
        h = ctx.x
        for i in range(self.a):
            h = self.prelude[str(i)].hook_resid_post(self._layer(i, h, ctx))
        p = self.hook_prelude(h)                                    # [b, s, d]
        return p, p

    def _reenter(self, t: int, p: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """Loop t >= 2's input: the re-entry of (p, h_{t-1}), plus loop t's code when there are codes."""
        u = self.reentry(p, h)
        return u if self.loop_codes is None else self.loop_codes(t, u)

    def _step(self, t: int, h: torch.Tensor, p: torch.Tensor, ctx: LoopContext, past: dict) -> torch.Tensor:
        """One loop: h_t = Block(u_t) from h_{t-1}, memory windows in `past` updated in place."""
        sites = self.loop[str(t)]
        h = sites.hook_input(h if t == 1 else self._reenter(t, p, h))
        for i in range(self.a, self.b):
            site = sites.block[str(i)]
            if self.memory is not None and t > 1:
                window = past[i][-self.memory_window:]                 # (output, keys, values) per loop
                distances = torch.arange(len(window), 0, -1, device=h.device)  # t - t_j, oldest first
                outs, keys, values = (torch.stack(x, dim=2) for x in zip(*window))
                update = self.memory[str(i)].attend(window[-1][0], keys, values, outs.mean(dim=2), distances)
                h = h + site.memory.hook_out(update)
            h = site.hook_resid_post(self._layer(i, h, ctx, site=site))
            if self.memory is not None:
                past[i] = (past[i] + [(h, *self.memory[str(i)].keys_values(h))])[-self.memory_window:]
        return sites.hook_state(h)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                loops: int = 1, cache: LoopCache | None = None) -> LoopedOutput:
        """Returns `LoopedOutput(logits=[batch, pos, vocab])` read through the Coda at loop `loops` (fp32).

        `cache` (a `new_cache(loops)`) decodes incrementally: the first call fills it with the prompt, each
        later one gives only the new tokens, with `attention_mask` over every token so far."""
        with autocast(self.precision, input_ids.device.type):
            for t, h, ctx in self._loop(input_ids, attention_mask, loops, cache):
                if self.halting is not None:
                    mask = attention_mask if attention_mask is None else attention_mask[:, -h.shape[1]:]
                    self._halt_prob(t, h, mask)
            normed = self.loop[str(loops)].hook_readout(self._coda(loops, h, ctx))
        if self.precision == "fp32":
            return LoopedOutput(logits=self.base.lm_head(normed))
        head = self.base.lm_head  # the readout in fp32: bf16 logits come in steps of 0.125 and tie candidates
        logits = normed.float() @ head.weight.float().T
        return LoopedOutput(logits=logits if head.bias is None else logits + head.bias.float())

    def read(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, loops: int = 1,
             positions: torch.Tensor | None = None, candidates: torch.Tensor | None = None,
             return_states: bool = False) -> LoopReadout:
        """One forward up to `loops`, reading every loop through the Coda at the asked positions.

        Args:
            input_ids, attention_mask: [batch, seq]; any padding side.
            loops: T, the number of loops to run and read.
            positions: [batch, n_positions] sequence indices; default the last real token of each row.
            candidates: token ids to score, [n_candidates] or [batch, n_candidates]; default the
                whole vocabulary (memory then grows with vocab: ask only for what you need).
            return_states: also return h_t at the read positions.
        Returns:
            LoopReadout with scores [batch, T, n_positions, n_candidates or vocab].
        """
        with autocast(self.precision, input_ids.device.type):
            out = self._read(input_ids, attention_mask, loops, positions, candidates, return_states)
        if self.precision != "fp32":  # scores and states leave the model in fp32 whatever ran inside
            out.scores = out.scores.float()
            out.states = None if out.states is None else out.states.float()
            out.halt_probs = None if out.halt_probs is None else out.halt_probs.float()
        return out

    def read_final(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, loops: int = 1,
                   positions: torch.Tensor | None = None, candidates: torch.Tensor | None = None) -> torch.Tensor:
        """The forced-depth call: `loops` loops and the Coda once, at loop T only (what a deployed model runs).

        Same arguments as `read`; returns loop T's scores [batch, n_positions, n_candidates or vocab] (fp32),
        equal to `read(...).scores[:, -1]` at a fraction of its cost (`read` runs the Coda at every loop).
        """
        with autocast(self.precision, input_ids.device.type):
            positions = self._read_positions(input_ids, attention_mask, positions)
            unembed, bias, exact_head = self._head(candidates)
            gather = positions.unsqueeze(-1).expand(-1, -1, self.config.hidden_size)
            for t, h, ctx in self._loop(input_ids, attention_mask, loops):
                if self.halting is not None:
                    self._halt_prob(t, h, attention_mask)
            scores = self._readout(loops, h, ctx, gather, unembed, bias, exact_head)
        return scores.float()

    def _read(self, input_ids, attention_mask, loops, positions, candidates, return_states) -> LoopReadout:
        positions = self._read_positions(input_ids, attention_mask, positions)
        unembed, bias, exact_head = self._head(candidates)
        gather = positions.unsqueeze(-1).expand(-1, -1, self.config.hidden_size)
        scores, states, halts = [], [], []
        for t, h, ctx in self._loop(input_ids, attention_mask, loops):
            if self.halting is not None:
                halts.append(self._halt_prob(t, h, attention_mask))
            scores.append(self._readout(t, h, ctx, gather, unembed, bias, exact_head))
            if return_states:
                states.append(h.gather(1, gather))
        return LoopReadout(
            scores=torch.stack(scores, dim=1),
            positions=positions,
            states=torch.stack(states, dim=1) if return_states else None,
            halt_probs=torch.stack(halts, dim=1) if halts else None,
        )

    def _head(self, candidates):
        """(unembedding [c, d] or [b, c, d], bias, exact): the readout in fp32 under bf16 (scores would tie)."""
        unembed, bias = self._unembedding(candidates)
        exact_head = self.precision != "fp32"
        if exact_head:
            unembed, bias = unembed.float(), None if bias is None else bias.float()
        return unembed, bias, exact_head

    def _readout(self, t: int, h, ctx, gather, unembed, bias, exact_head) -> torch.Tensor:
        """Loop t's scores [b, p, c] at the gathered positions: Coda, norm, hook_readout, unembedding."""
        normed = self._coda(t, h, ctx).gather(1, gather)         # [b, p, d]
        normed = self.loop[str(t)].hook_readout(normed)
        with torch.autocast(h.device.type, enabled=False) if exact_head else contextlib.nullcontext():
            normed = normed.float() if exact_head else normed
            if unembed.dim() == 2:
                s = normed @ unembed.T                                # [b, p, c]
            else:
                s = torch.einsum("bpd,bcd->bpc", normed, unembed)
        return s if bias is None else s + bias

    # ----------------------------------------------------------------- adaptive inference
    def adaptive_read(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                      policy, positions: torch.Tensor | None = None,
                      candidates: torch.Tensor | None = None) -> AdaptiveReadout:
        """Runs each row until its halting head says stop (`workbench.loop.halting.HaltPolicy`), reading it once there.

        Rows that stop leave the batch: later loops, their memory windows and the Coda run only on
        the rows still going, so the saved compute is real (`row_loops` counts it). Per-loop hooks
        therefore see [rows still running, s, d]; `hook_loops_used` sees the loops of every row.
        A policy that never stops early (tau = 0) computes exactly what `read(loops=T)` reads at T.

        Args:
            input_ids, attention_mask: [batch, seq]; any padding side.
            policy: a HaltPolicy (tau, min_loops, max_loops = the budget T, default this retrofit's max_loops).
            positions, candidates: as for `read`.
        Returns:
            AdaptiveReadout with scores [batch, n_positions, n_candidates or vocab] (fp32).
        """
        if self.halting is None:
            raise WorkbenchError("adaptive_read needs a halting head; this retrofit has none (retrofit with "
                                 "halting=True and train it)")
        budget = self.max_loops if policy.max_loops is None else policy.max_loops
        self._check_loops(budget)
        if policy.min_loops > budget:
            raise WorkbenchError(f"halting min_loops={policy.min_loops} exceeds the budget of {budget} loops")
        with autocast(self.precision, input_ids.device.type):
            out = self._adaptive(input_ids, attention_mask, policy, budget, positions, candidates)
        out.scores = out.scores.float()
        out.halt_probs = out.halt_probs.float()
        return out

    def _adaptive(self, input_ids, attention_mask, policy, budget, positions, candidates) -> AdaptiveReadout:
        b = input_ids.shape[0]
        positions = self._read_positions(input_ids, attention_mask, positions)
        unembed, bias, exact_head = self._head(candidates)
        per_row_head = unembed.dim() == 3                             # candidates [b, c]: each row its own
        ctx = self._context(input_ids, attention_mask)
        h, p = self._prelude(ctx)
        past: dict[int, list[tuple]] = {i: [] for i in range(self.a, self.b)}
        rows = torch.arange(b, device=input_ids.device)               # batch index of each running row
        mask = attention_mask
        loops_used = torch.zeros(b, dtype=torch.long, device=input_ids.device)
        probs = torch.full((b, budget), float("nan"), device=input_ids.device)
        scores: torch.Tensor | None = None
        for t in range(1, budget + 1):
            h = self._step(t, h, p, ctx, past)
            prob = self._halt_prob(t, h, mask)                         # [running]
            probs[rows, t - 1] = prob.to(probs.dtype)
            stop = policy.stops(t, prob, budget)
            if not bool(stop.any()):
                continue
            done = stop.nonzero().squeeze(1)
            whole = len(done) == len(rows)                             # no copy when every running row stops
            pick = (lambda x: x) if whole else _rows_picker(done, len(rows))
            gather = positions[rows[done]].unsqueeze(-1).expand(-1, -1, self.config.hidden_size)
            head = (unembed[rows[done]], None if bias is None else bias[rows[done]]) if per_row_head else (unembed, bias)
            s = self._readout(t, pick(h), ctx.rows(pick), gather, *head, exact_head)
            if scores is None:
                scores = s.new_zeros((b, *s.shape[1:]))
            scores[rows[done]] = s
            loops_used[rows[done]] = t
            if whole:
                break
            keep = _rows_picker((~stop).nonzero().squeeze(1), len(rows))
            h, p, ctx, rows = keep(h), keep(p), ctx.rows(keep), keep(rows)
            mask = keep(mask)
            past = {i: [tuple(keep(y) for y in x) for x in xs] for i, xs in past.items()}
        loops_used = self.hook_loops_used(loops_used)
        return AdaptiveReadout(scores=scores, positions=positions, loops_used=loops_used, halt_probs=probs,
                               row_loops=int(loops_used.sum()), budget=budget)

    def _read_positions(self, input_ids, attention_mask, positions) -> torch.Tensor:
        b, s = input_ids.shape
        if positions is None:
            if attention_mask is None:
                return torch.full((b, 1), s - 1, dtype=torch.long, device=input_ids.device)
            return last_real_token(attention_mask).unsqueeze(-1)
        positions = torch.as_tensor(positions, dtype=torch.long, device=input_ids.device)
        if positions.dim() == 1:
            positions = positions.unsqueeze(0).expand(b, -1)
        if positions.shape[0] != b or not positions.numel() or positions.min() < 0 or positions.max() >= s:
            raise WorkbenchError(f"positions of shape {tuple(positions.shape)} must be [batch={b}, n] within 0..{s - 1}")
        return positions

    def _unembedding(self, candidates):
        head = self.base.lm_head
        weight, bias = head.weight, head.bias
        if candidates is None:
            return weight, bias
        candidates = torch.as_tensor(candidates, dtype=torch.long, device=weight.device)
        if candidates.numel() == 0 or candidates.min() < 0 or candidates.max() >= weight.shape[0]:
            raise WorkbenchError(f"candidate token ids must be at least one, each in 0..{weight.shape[0] - 1}")
        if candidates.dim() == 1:
            return weight[candidates], None if bias is None else bias[candidates]
        return weight[candidates], None if bias is None else bias[candidates].unsqueeze(1)


def _rows_picker(index: torch.Tensor, batch: int):
    """A function taking rows `index` of every tensor with a leading batch dim (nested tuples and lists too);
    broadcast tensors (leading dim 1 of a larger batch) and None pass through. Shared tensors are picked once."""
    seen: dict[int, torch.Tensor] = {}

    def pick(x):
        if x is None:
            return None
        if isinstance(x, (tuple, list)):
            return type(x)(pick(v) for v in x)
        if x.dim() == 0 or x.shape[0] != batch or (batch == 1 and len(index) == 1):
            return x
        if id(x) not in seen:
            seen[id(x)] = x[index]
        return seen[id(x)]

    return pick
