"""Ouro (Ouro-1.4B / 2.6B, model_type `ouro`) with every step hooked, written here (`ouro_modules`).

No installable package ships Ouro: its modeling code sits beside the weights as remote code. The workbench
reads a checkpoint directory as the hub ships it (config.json under its own field names, safetensors shards
and their index under the checkpoint's tensor names, tokenizer files if present) and never imports a .py file
from it. The architecture (docstring of `ouro_modules`): the whole layer stack is one step, run
`total_ut_steps` times; after every step the final norm, which the next step reads, and a learned exit gate.

    pass t (a step)   layers 0..n-1 on h_{t-1}, then Norm:       loop.{t}.hook_state = h_t (normed)
    exit gate         lambda_t = sigmoid(gate(h_t))              loop.{t}.exit.hook_prob  [batch, seq]
    readout           lm_head(h_t)                               the reference's logits at exit_at_step = t - 1

`looped(ids, loops=k)` is the reference's forward at `exit_at_step=k-1`; `looped(ids)` is its default: each
token exits at the first step whose cumulative exit probability reaches `early_exit_threshold` (config.json),
or `exit_threshold=` given. Steps past `total_ut_steps` (up to twice it) run the same stack again; the model
was never trained there. Exactness against the reference's own outputs: tests/test_native_ouro.py on the
committed tiny checkpoint (tests/fixtures/ouro/README.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn
from transformer_lens.hook_points import HookPoint

from workbench.errors import WorkbenchError
from workbench.loop.components import component_hooks
from workbench.loop.looped import AdaptiveReadout, LoopedOutput
from workbench.models.native.contract import Carry, NativeLoopedLM, Site, frozen, hooked
from workbench.models.native.ouro_modules import (
    OuroConfig,
    OuroForCausalLM,
    StepCache,
    causal_mask,
    check_threshold,
    exit_distribution,
    exit_steps,
    rotary,
)
from workbench.models.weights_check import check_hf_weights, weights_index


@dataclass
class _Ctx:
    x: torch.Tensor
    mask: torch.Tensor
    rope: tuple
    cache: StepCache | None


@dataclass(frozen=True)
class GateExit:
    """Ouro's own exit for `adaptive_read`: a row stops at the first step t >= `min_loops` whose cumulative exit
    probability at its read position reaches `threshold` (None: config.json's `early_exit_threshold`), else at
    `max_loops` (None: the native step count), where the exit distribution puts what is left."""

    threshold: float | None = None
    min_loops: int = 1
    max_loops: int | None = None

    def __post_init__(self):
        if self.threshold is not None:
            check_threshold(self.threshold, "GateExit threshold")
        if isinstance(self.min_loops, bool) or not isinstance(self.min_loops, int) or self.min_loops < 1 or (
                self.max_loops is not None and self.min_loops > self.max_loops):
            raise WorkbenchError(f"GateExit min_loops={self.min_loops!r}, max_loops={self.max_loops!r}: need "
                                 "integers with 1 <= min_loops <= max_loops")


def _rows(ctx: _Ctx, keep: torch.Tensor) -> _Ctx:
    """The context of the rows `keep` (a rotary table shared by every row stays whole)."""
    cos, sin = ctx.rope
    rope = (cos, sin) if cos.shape[0] == 1 else (cos[keep], sin[keep])
    return _Ctx(ctx.x[keep], ctx.mask[keep], rope, None)


class OuroLooped(NativeLoopedLM):
    """Ouro with a hook point per site and per step (1..2 x total_ut_steps), its exit gate among them."""

    family = "ouro"
    halt_rule = "cdf"   # read(...).halt_probs are 1 - lambda_t: a token exits once 1 - prod(1 - lambda) reaches tau
    supports = frozenset({"adaptive_read", "loop_kv_cache"})
    sites = ("prelude", "input", "pattern", "attn_out", "mlp_out", "block_resid", "state", "readout", "exit_gate",
             "loops_used")
    unsupported = {**{k: v for k, v in NativeLoopedLM.unsupported.items() if k not in ("adaptive_read", "loop_kv_cache")},
                   "base_identity": "Ouro has no base to reproduce at loop 1; its exactness against the reference "
                                    "modeling code is tests/test_native_ouro.py (committed reference outputs)",
                   "dense_loop_cost": "its cost model counts one retrofit block per loop; an Ouro step is the whole "
                                      "stack"}

    def __init__(self, base: OuroForCausalLM):
        super().__init__(base)
        cfg = self.config
        self.a, self.b = 0, cfg.num_hidden_layers      # the whole stack loops: no Prelude or Coda layers
        self.n_layers = cfg.num_hidden_layers
        self.native_loops = cfg.total_ut_steps
        self.max_loops = 2 * self.native_loops
        self.exit_threshold = cfg.early_exit_threshold
        self.hook_prelude = HookPoint()
        self.hook_loops_used = HookPoint()   # adaptive_read's steps per row [batch]
        self.loop = nn.ModuleDict({str(t): self._pass_sites() for t in range(1, self.max_loops + 1)})
        self.setup()

    def _pass_sites(self) -> Site:
        blocks = nn.ModuleDict({str(i): Site("hook_resid_post", attn=Site("hook_pattern", "hook_out"),
                                             mlp=Site("hook_out")) for i in range(self.n_layers)})
        return Site("hook_input", "hook_state", "hook_readout", block=blocks, exit=Site("hook_prob"))

    @property
    def layers(self) -> nn.ModuleList:
        return self.text_model.layers

    @property
    def final_norm(self) -> nn.Module:
        """The norm after every step (the next step reads its output, and so does the head)."""
        return self.text_model.norm

    # ----------------------------------------------------------------- the contract
    def _context(self, input_ids, attention_mask, position_ids, cache, loops, inputs_embeds=None, use_cache=False,
                 **kwargs):
        if kwargs:
            raise WorkbenchError(f"the Ouro forward takes no option {sorted(kwargs)[0]!r}")
        x = self.text_model.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        past = cache.get_seq_length() if cache is not None else 0
        if position_ids is None:   # as the reference: positions count from the cache's length, padding included
            position_ids = (torch.arange(x.shape[1], device=x.device) + past).unsqueeze(0)
        mask = causal_mask(attention_mask, x.shape[0], x.shape[1], past, x.dtype, x.device)
        rope = rotary(self.config.head_size, self.config.rope_theta, position_ids, x.dtype)
        return _Ctx(x, mask, rope, cache)

    def _layer(self, i: int, h: torch.Tensor, ctx: _Ctx, t: int, site) -> torch.Tensor:
        layer = self.layers[i]
        pattern = site.attn.hook_pattern if hooked(site.attn.hook_pattern) else None
        with component_hooks(layer, site):
            return layer(h, ctx.rope, ctx.mask, ctx.cache, (t, i), pattern)

    def _step(self, t: int, h: torch.Tensor, ctx: _Ctx) -> tuple[torch.Tensor, torch.Tensor]:
        """(h_t [b, s, d], lambda_t [b, s]): the stack on h_{t-1}, the final norm, the exit gate."""
        tm, sites = self.text_model, self.loop[str(t)]
        h = sites.hook_input(h)
        for i in range(self.n_layers):
            h = sites.block[str(i)].hook_resid_post(self._layer(i, h, ctx, t, sites.block[str(i)]))
        h = sites.hook_state(tm.norm(h))
        return h, sites.exit.hook_prob(torch.sigmoid(tm.early_exit_gate(h).squeeze(-1)))

    def _run(self, ctx: _Ctx, loops: int):
        h = self.hook_prelude(ctx.x)
        for t in range(1, loops + 1):
            h, lam = self._step(t, h, ctx)
            yield t, Carry(h, lam)

    def _coda(self, t: int, carry: Carry, ctx: _Ctx) -> torch.Tensor:
        return carry.state    # the final norm ran inside the step

    # ----------------------------------------------------------------- the learned exit
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, loops: int | None = None,
                position_ids: torch.Tensor | None = None, cache=None, exit_threshold: float | None = None
                ) -> LoopedOutput:
        """`LoopedOutput(logits=[batch, pos, vocab])` at step `loops` (the reference's `exit_at_step=loops-1`), or
        with no `loops`, each token's logits at its exit step under the gate's threshold rule (`exit_steps`).

        Args:
            exit_threshold: the cumulative exit probability a token's exit needs (default: config.json's
                `early_exit_threshold`); only without `loops`.
        """
        if loops is not None or cache is not None:
            if exit_threshold is not None:
                raise WorkbenchError("exit_threshold applies to the gate's exit; with loops= every token reads "
                                     "that step")
            return super().forward(input_ids, attention_mask, loops, position_ids, cache)
        threshold = self._threshold(exit_threshold)
        pos = self._positions(input_ids, attention_mask, position_ids)
        ctx = self._context(input_ids, attention_mask, pos, None, self.native_loops)
        states, lam = [], []
        for t, carry in self._run(ctx, self.native_loops):
            states.append(self.loop[str(t)].hook_readout(carry.state))
            lam.append(carry.extra)
        step = exit_steps(torch.stack(lam, dim=-1), threshold)                   # [batch, seq], 1-based
        chosen = torch.stack(states, dim=2).gather(2, (step - 1)[..., None, None].expand(
            -1, -1, 1, states[0].shape[-1])).squeeze(2)
        return LoopedOutput(logits=self.base.lm_head(chosen))

    def _threshold(self, exit_threshold: float | None) -> float:
        if exit_threshold is None:
            return self.exit_threshold
        return check_threshold(exit_threshold, "exit_threshold")

    def exit_probabilities(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                           loops: int | None = None) -> torch.Tensor:
        """lambda [batch, T, seq] (fp32): the gate's exit probability at each step 1..T, from one forward."""
        loops = self._loops(loops)
        ctx = self._context(input_ids, attention_mask, self._positions(input_ids, attention_mask, None), None, loops)
        return torch.stack([carry.extra.float() for _, carry in self._run(ctx, loops)], dim=1)

    def exit_distribution(self, lam: torch.Tensor) -> torch.Tensor:
        """p [batch, T, ...]: the probability of exiting at each step, from lambda [batch, T, ...]."""
        return exit_distribution(lam.movedim(1, -1)).movedim(-1, 1)

    def exit_steps(self, lam: torch.Tensor, exit_threshold: float | None = None) -> torch.Tensor:
        """[batch, ...] each token's 1-based exit step under the CDF rule, from lambda [batch, T, ...]."""
        return exit_steps(lam.movedim(1, -1), self._threshold(exit_threshold))

    def _continue_prob(self, carry: Carry, read_at: torch.Tensor) -> torch.Tensor:
        return 1 - carry.extra.gather(1, read_at[:, -1:]).squeeze(1)

    def adaptive_read(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                      policy: GateExit | None = None, positions: torch.Tensor | None = None,
                      candidates: torch.Tensor | None = None) -> AdaptiveReadout:
        """Runs each row until its exit gate says stop at its last read position (`GateExit`; default the config's
        threshold over the native steps), reading it once there. Rows that stop leave the batch, so the saved
        compute is real (`row_loops`). Returns `AdaptiveReadout`, halt_probs the continue probabilities 1 - lambda_t.
        """
        policy = policy or GateExit()
        budget = self._loops(policy.max_loops or self.native_loops)
        threshold = self._threshold(policy.threshold)
        read_at = self._read_positions(input_ids, attention_mask, positions)
        weight = self._unembedding(candidates)
        ctx = self._context(input_ids, attention_mask, self._positions(input_ids, attention_mask, None), None, budget)
        b, device = input_ids.shape[0], input_ids.device
        rows = torch.arange(b, device=device)
        loops_used = torch.zeros(b, dtype=torch.long, device=device)
        probs = torch.full((b, budget), float("nan"), device=device)
        cdf, remaining = torch.zeros(b, device=device), torch.ones(b, device=device)
        scores, h = None, self.hook_prelude(ctx.x)
        for t in range(1, budget + 1):
            h, lam = self._step(t, h, ctx)
            lam = lam.gather(1, read_at[rows][:, -1:]).squeeze(1).float()
            probs[rows, t - 1] = 1 - lam
            cdf, remaining = cdf + lam * remaining, remaining * (1 - lam)   # the exit distribution's CDF at t
            stop = (cdf >= threshold) & (t >= policy.min_loops) | (t == budget)
            done = stop.nonzero().squeeze(1)
            if len(done):
                gather = read_at[rows[done]].unsqueeze(-1).expand(-1, -1, self.config.hidden_size)
                s = self._readout(t, Carry(h[done]), ctx, gather, weight)
                scores = s.new_zeros((b, *s.shape[1:])) if scores is None else scores
                scores[rows[done]], loops_used[rows[done]] = s, t
            keep = (~stop).nonzero().squeeze(1)
            if not len(keep):
                break
            h, rows, cdf, remaining, ctx = h[keep], rows[keep], cdf[keep], remaining[keep], _rows(ctx, keep)
        return AdaptiveReadout(scores=scores, positions=read_at, loops_used=self.hook_loops_used(loops_used),
                               halt_probs=probs, row_loops=int(loops_used.sum()), budget=budget)

    # ----------------------------------------------------------------- generation
    def new_cache(self, loops: int | None = None) -> StepCache:
        """An empty cache for decoding at `loops` steps: one key/value slot per (step, layer)."""
        return StepCache(self._loops(loops))

    def generate(self, *args, **kwargs):
        raise WorkbenchError("Ouro decodes through workbench.generation.generate (a KV slot per step and layer); "
                             "transformers' generate needs the remote code the workbench never runs")


# ----------------------------------------------------------------------------- loading
def load(path: Path, dtype: torch.dtype) -> OuroLooped:
    """The model of an Ouro checkpoint directory, strictly: every tensor the config describes, with its shape, and no
    other (its tokenizer and code are the registry's: `own.OwnFamily.load`)."""
    spec = str(path)
    try:
        raw = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as err:
        raise WorkbenchError(f"model '{spec}': config.json cannot be read ({type(err).__name__})") from None
    config = OuroConfig.from_dict(raw, f"model '{spec}'")
    with torch.device("meta"):
        base = OuroForCausalLM(config)
    expected = {k: tuple(v.shape) for k, v in base.state_dict().items()}
    if config.tie_word_embeddings:
        expected.pop("lm_head.weight")
    check_hf_weights(path, config, expected=expected)
    extra = sorted(set(weights_index(path)) - set(expected))
    if extra:
        raise WorkbenchError(f"model '{spec}': its weights hold {len(extra)} tensors an Ouro config does not describe "
                             f"(first: '{extra[0]}'); the weights are not this config's model")
    tensors = {}
    for shard in sorted({*_shards(path)}):
        tensors.update(load_file(str(path / shard)))
    base.load_state_dict({k: v.to(dtype) for k, v in tensors.items()}, strict=True, assign=True)
    if config.tie_word_embeddings:
        base.lm_head.weight = base.model.embed_tokens.weight
    return OuroLooped(frozen(base))


def tiny(dtype: torch.dtype, tokenizer, seed: int, **sizes) -> OuroLooped:
    """A random Ouro of `sizes` (config.json fields) over `tokenizer`'s vocabulary, filled as the committed fixture:
    matrices N(0, (0.5 / sqrt(fan_in))^2), norm weights 1 + 0.1 N(0, 1), the gate's bias N(0, 0.5^2)."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    config = OuroConfig.from_dict({"vocab_size": len(tokenizer), "bos_token_id": tokenizer.bos_token_id,
                                   "eos_token_id": tokenizer.eos_token_id, "pad_token_id": pad, **sizes}, "tiny-ouro")
    generator = torch.Generator().manual_seed(seed)
    base = OuroForCausalLM(config)
    with torch.no_grad():
        for name, p in base.named_parameters():
            noise = torch.randn(p.shape, generator=generator)
            p.copy_(1 + 0.1 * noise if "norm" in name else 0.5 * noise if p.dim() == 1 else
                    noise * 0.5 / p.shape[1] ** 0.5)
    return OuroLooped(frozen(base.to(dtype)))


def _shards(path: Path) -> list[str]:
    if (path / "model.safetensors").is_file():
        return ["model.safetensors"]
    return list(json.loads((path / "model.safetensors.index.json").read_text())["weight_map"].values())
