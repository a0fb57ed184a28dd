"""LoopedLM: Prelude -> weight-tied Block run T times with re-entry -> Coda, every loop hooked.

The forward reads like DESIGN.md §2:

    p = Prelude(embed(tokens));  h_0 = p
    for t in 1..T:
        u_t = h_{t-1} if t == 1 else ReEntry(p, h_{t-1})
        h_t = Block(u_t)                      # the same layer objects every loop
        readout_t = Norm(Coda(h_t))           # at the positions the caller asks for

Hook points exist per site *and per loop index* (DESIGN.md §3), so `run_with_cache`
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

from workbench.attention import pattern_hook
from workbench.errors import WorkbenchError
from workbench.precision import autocast


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
        str(i): _Site("hook_resid_post", attn=_Site("hook_pattern"),
                      **({"memory": _Site("hook_out")} if memory else {}))
        for i in block
    })
    children = {"block": blocks, "coda": nn.ModuleDict({str(i): _Site("hook_resid_post") for i in coda})}
    if halting:
        children["halt"] = _Site("hook_prob")
    return _Site("hook_input", "hook_state", "hook_readout", **children)


class LoopedLM(HookedRootModule):
    """A looped retrofit of a decoder LM. Build it with `workbench.surgery.retrofit`.

    The base model is held by reference (its weights are shared, never copied). Re-entry,
    memory and halting modules are the only new parameters.
    """

    def __init__(self, base: nn.Module, block: tuple[int, int], reentry: nn.Module,
                 memory: nn.ModuleDict | None = None, memory_window: int = 3,
                 halting: nn.Module | None = None, max_loops: int = 16):
        super().__init__()
        self.base = base
        self.a, self.b = block
        self.n_layers = len(base.model.layers)
        self.max_loops = max_loops
        self.reentry = reentry
        self.memory = memory
        self.memory_window = memory_window
        self.halting = halting
        self.precision = "fp32"  # "bf16": frozen weights in bf16, forward under autocast (workbench.precision)
        self.prelude = nn.ModuleDict({str(i): _Site("hook_resid_post") for i in range(self.a)})
        self.hook_prelude = HookPoint()
        block_range, coda_range = range(self.a, self.b), range(self.b, self.n_layers)
        self.loop = nn.ModuleDict({
            str(t): _loop_sites(block_range, coda_range, memory is not None, halting is not None)
            for t in range(1, max_loops + 1)
        })
        self.setup()

    # ----------------------------------------------------------------- pieces
    @property
    def layers(self) -> nn.ModuleList:
        return self.base.model.layers

    @property
    def config(self):
        return self.base.config

    def _check_loops(self, loops: int) -> None:
        if not isinstance(loops, int) or not 1 <= loops <= self.max_loops:
            raise WorkbenchError(f"loops={loops!r} is outside 1..{self.max_loops} (this retrofit's max_loops)")

    def _context(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None):
        """Embeddings, per-layer-type masks, position ids and rotary tables: the base model's own."""
        inner = self.base.model
        x = inner.embed_tokens(input_ids)
        if attention_mask is None:
            pos = torch.arange(x.shape[1], device=x.device).unsqueeze(0)
        else:
            pos = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        # Always build the mask: with eager attention an absent mask is not causal.
        kw = dict(config=self.config, inputs_embeds=x, attention_mask=attention_mask, cache=None, position_ids=pos)
        masks = {"full_attention": create_causal_mask(**kw)}
        layer_types = getattr(self.config, "layer_types", None) or ["full_attention"] * self.n_layers
        if "sliding_attention" in layer_types:
            masks["sliding_attention"] = create_sliding_window_causal_mask(**kw)
        rope = inner.rotary_emb(x, pos)
        return x, [masks[layer_types[i]] for i in range(self.n_layers)], pos, rope

    def _layer(self, i: int, h: torch.Tensor, ctx, pattern: HookPoint | None = None) -> torch.Tensor:
        _, masks, pos, rope = ctx
        if pattern is not None and (pattern.fwd_hooks or pattern.bwd_hooks):
            with pattern_hook(self.config, pattern):
                return self.layers[i](h, attention_mask=masks[i], position_ids=pos, position_embeddings=rope)
        return self.layers[i](h, attention_mask=masks[i], position_ids=pos, position_embeddings=rope)

    def _coda(self, t: int, h: torch.Tensor, ctx) -> torch.Tensor:
        """Coda layers and the final norm on loop t's state: [b, s, d] -> [b, s, d]."""
        sites = self.loop[str(t)].coda
        for i in range(self.b, self.n_layers):
            h = sites[str(i)].hook_resid_post(self._layer(i, h, ctx))
        return self.base.model.norm(h)

    def _halt_prob(self, t: int, h: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        return self.loop[str(t)].halt.hook_prob(self.halting(h, attention_mask))

    # ----------------------------------------------------------------- the loop
    def _loop(self, input_ids, attention_mask, loops: int):
        """Yields (t, h_t, ctx) for t = 1..loops; the recurrence of DESIGN.md §2."""
        self._check_loops(loops)
        ctx = self._context(input_ids, attention_mask)
        h = ctx[0]
        for i in range(self.a):
            h = self.prelude[str(i)].hook_resid_post(self._layer(i, h, ctx))
        p = self.hook_prelude(h)                                    # [b, s, d]
        past: dict[int, list[torch.Tensor]] = {i: [] for i in range(self.a, self.b)}
        for t in range(1, loops + 1):
            sites = self.loop[str(t)]
            h = sites.hook_input(h if t == 1 else self.reentry(p, h))
            for i in range(self.a, self.b):
                site = sites.block[str(i)]
                if self.memory is not None and t > 1:
                    window = past[i][-self.memory_window:]
                    distances = torch.arange(len(window), 0, -1, device=h.device)  # t - t_j, oldest first
                    update = self.memory[str(i)](window[-1], torch.stack(window, dim=2), distances)
                    h = h + site.memory.hook_out(update)
                h = site.hook_resid_post(self._layer(i, h, ctx, pattern=site.attn.hook_pattern))
                if self.memory is not None:
                    past[i] = (past[i] + [h])[-self.memory_window:]
            h = sites.hook_state(h)
            yield t, h, ctx

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                loops: int = 1) -> LoopedOutput:
        """Returns `LoopedOutput(logits=[batch, pos, vocab])` read through the Coda at loop `loops` (fp32)."""
        with autocast(self.precision, input_ids.device.type):
            for t, h, ctx in self._loop(input_ids, attention_mask, loops):
                if self.halting is not None:
                    self._halt_prob(t, h, attention_mask)
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

    def _read(self, input_ids, attention_mask, loops, positions, candidates, return_states) -> LoopReadout:
        positions = self._read_positions(input_ids, attention_mask, positions)
        unembed, bias = self._unembedding(candidates)
        exact_head = self.precision != "fp32"  # the readout in fp32 (once per call); bf16 scores would tie
        if exact_head:
            unembed, bias = unembed.float(), None if bias is None else bias.float()
        gather = positions.unsqueeze(-1).expand(-1, -1, self.config.hidden_size)
        scores, states, halts = [], [], []
        for t, h, ctx in self._loop(input_ids, attention_mask, loops):
            if self.halting is not None:
                halts.append(self._halt_prob(t, h, attention_mask))
            normed = self._coda(t, h, ctx).gather(1, gather)         # [b, p, d]
            normed = self.loop[str(t)].hook_readout(normed)
            with torch.autocast(input_ids.device.type, enabled=False) if exact_head else contextlib.nullcontext():
                normed = normed.float() if exact_head else normed
                if unembed.dim() == 2:
                    s = normed @ unembed.T                                # [b, p, c]
                else:
                    s = torch.einsum("bpd,bcd->bpc", normed, unembed)
            scores.append(s if bias is None else s + bias)
            if return_states:
                states.append(h.gather(1, gather))
        return LoopReadout(
            scores=torch.stack(scores, dim=1),
            positions=positions,
            states=torch.stack(states, dim=1) if return_states else None,
            halt_probs=torch.stack(halts, dim=1) if halts else None,
        )

    def _read_positions(self, input_ids, attention_mask, positions) -> torch.Tensor:
        b, s = input_ids.shape
        if positions is None:
            if attention_mask is None:
                return torch.full((b, 1), s - 1, dtype=torch.long, device=input_ids.device)
            last = s - 1 - attention_mask.long().flip(-1).argmax(-1)  # last real token, any padding side
            return last.unsqueeze(-1)
        positions = torch.as_tensor(positions, dtype=torch.long, device=input_ids.device)
        if positions.dim() == 1:
            positions = positions.unsqueeze(0).expand(b, -1)
        if positions.shape[0] != b or positions.min() < 0 or positions.max() >= s:
            raise WorkbenchError(f"positions of shape {tuple(positions.shape)} must be [batch={b}, n] within 0..{s - 1}")
        return positions

    def _unembedding(self, candidates):
        head = self.base.lm_head
        weight, bias = head.weight, head.bias
        if candidates is None:
            return weight, bias
        candidates = torch.as_tensor(candidates, dtype=torch.long, device=weight.device)
        if candidates.min() < 0 or candidates.max() >= weight.shape[0]:
            raise WorkbenchError(f"candidate token ids must lie in 0..{weight.shape[0] - 1}")
        if candidates.dim() == 1:
            return weight[candidates], None if bias is None else bias[candidates]
        return weight[candidates], None if bias is None else bias[candidates].unsqueeze(1)
