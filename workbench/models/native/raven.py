"""The Raven architecture (Huginn-0125, Geiping et al. 2025, and every Raven-format checkpoint), every step hooked.

Written here from the paper and the reference's config (seal-rg/recurrent-pretraining, `recpre/`); tests hold it
to the reference's own numbers (tests/fixtures/raven). With e the Prelude's output and s_0 a random state:

    e   = P(sqrt(d) * embed(tokens))                     the Prelude: n_layers_in_prelude sandwich blocks
    s_0 ~ sqrt(d) * TruncNormal(0, 2 / (5 d), ±3 std)   the initial state (drawn per position, seeded)
    s_t = R(A([s_{t-1}, e]))          t = 1..r           A: a linear adapter of the concatenation (state first),
                                                         R: n_layers_in_recurrent_block sandwich blocks
    logits_t = W · norm(C(norm(s_t)))                    the Coda: n_layers_in_coda blocks, the one final norm twice

A sandwich block is  x = n2(x + Attn(n1(x))),  x = n4(x + MLP(n3(x)))  with RMSNorms n1..n4, attention with
learned query/key biases added before RoPE (rotating adjacent pairs of each head), and a gated SiLU MLP.
`looped(ids, loops=k)` is the reference's forward at `num_steps=k`; the default is `mean_recurrence` steps.

Hook points: the shared names (`prelude.{i}.hook_resid_post`, `hook_prelude`, `loop.{t}.hook_input`,
`loop.{t}.block.{i}...`, `loop.{t}.hook_state`, `loop.{t}.coda.{i}.hook_resid_post`, `loop.{t}.hook_readout`)
plus Raven's own: `hook_init_state` (s_0), `loop.{t}.adapter.hook_in` ([s_{t-1}, e]) and `loop.{t}.adapter.hook_out`
(A's output, which `loop.{t}.hook_input` then passes). Layers keep the checkpoint's order: Prelude 0..a-1, the
recurrent block a..b-1, the Coda b..n-1.

s_0 at absolute position p is drawn from its own generator seeded by (`init_seed`, p), so a row's state does not
depend on its batch, its padding or a KV cache; `init_state=` gives s_0 instead ([batch, seq, d]).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
from torch import nn
from transformer_lens.hook_points import HookPoint

from workbench.errors import WorkbenchError
from workbench.loop.looped import AdaptiveReadout
from workbench.models.native.contract import Carry, NativeLoopedLM, Site, frozen, hooked
from workbench.models.native.raven_exits import CRITERIA, DEFAULTS, ZeroShotExit, exit_steps, zero_shot_read
from workbench.models.native.raven_files import RavenConfig

SEED_STRIDE = 1_000_003  # s_0 at position p is drawn from the generator seeded init_seed * SEED_STRIDE + p


class RMSNorm(nn.Module):
    """x / rms(x) in fp32, cast back, times the weight."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def rotate(x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    """RoPE on adjacent pairs (x_{2i}, x_{2i+1}) of each head, in fp32: x [b, s, h, hd], rope [b, s, 1, hd/2, 2]."""
    pairs = x.float().unflatten(-1, (-1, 2))
    cos, sin = rope[..., 0], rope[..., 1]
    even, odd = pairs[..., 0], pairs[..., 1]
    return torch.stack([even * cos - odd * sin, odd * cos + even * sin], dim=-1).flatten(3).type_as(x)


def rope_table(config: RavenConfig) -> torch.Tensor:
    """[1, block_size, 1, head_dim / 2, 2]: cos and sin of position * rope_base^(-2i / head_dim)."""
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    angles = torch.outer(torch.arange(config.block_size, dtype=torch.float32), inv_freq)
    return torch.stack([angles.cos(), angles.sin()], dim=-1)[None, :, None]


class Attention(nn.Module):
    """Causal self-attention with one fused query/key/value matrix and learned query/key biases."""

    def __init__(self, config: RavenConfig):
        super().__init__()
        self.n_head, self.head_dim = config.n_heads, config.head_dim
        self.Wqkv = nn.Linear(config.n_embd, 3 * config.n_embd, bias=False)
        if config.qk_bias:
            self.qk_bias = nn.Parameter(torch.zeros(2, 1, self.n_head, self.head_dim))
        self.proj = nn.Linear(config.n_embd, config.n_embd, bias=False)
        self.num_heads = self.n_head

    @property
    def o_proj(self) -> nn.Linear:
        """The output projection under transformers' name (the probes read head subspaces from it)."""
        return self.proj

    def forward(self, x: torch.Tensor, ctx: _Ctx, slot: int, pattern: HookPoint) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = (t.view(b, s, self.n_head, self.head_dim) for t in self.Wqkv(x).split(d, dim=2))
        if hasattr(self, "qk_bias"):
            q, k = q + self.qk_bias[0], k + self.qk_bias[1]
        q, k, v = (t.transpose(1, 2) for t in (rotate(q, ctx.rope), rotate(k, ctx.rope), v))
        if ctx.cache is not None:
            k, v = ctx.cache.update(slot, k, v)
        if hooked(pattern):  # the probabilities pass the hook point, then weight the values
            scores = (q @ k.transpose(-1, -2)) / math.sqrt(self.head_dim)
            if ctx.mask is not None:
                scores = scores.masked_fill(~ctx.mask, float("-inf"))
            elif s > 1:
                scores = scores.masked_fill(~torch.ones(s, s, dtype=torch.bool, device=x.device).tril(), float("-inf"))
            y = pattern(scores.softmax(-1, dtype=torch.float32).to(q.dtype)) @ v
        elif ctx.mask is None:
            y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=s > 1)
        else:
            y = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=ctx.mask)
        return self.proj(y.transpose(1, 2).reshape(b, s, d))


class GatedMLP(nn.Module):
    """SiLU(x W_1) * (x W_2), projected back; W_1 and W_2 are the halves of one fused matrix `fc`."""

    def __init__(self, config: RavenConfig):
        super().__init__()
        self.fc = nn.Linear(config.n_embd, 2 * config.intermediate_size, bias=False)
        self.proj = nn.Linear(config.intermediate_size, config.n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.fc(x).chunk(2, dim=-1)
        return self.proj(nn.functional.silu(gate) * up)


class SandwichBlock(nn.Module):
    """x = n2(x + Attn(n1(x))); x = n4(x + MLP(n3(x)))."""

    def __init__(self, config: RavenConfig):
        super().__init__()
        self.norm_1 = RMSNorm(config.n_embd, config.norm_eps)
        self.attn = Attention(config)
        self.norm_2 = RMSNorm(config.n_embd, config.norm_eps)
        self.mlp = GatedMLP(config)
        self.norm_3 = RMSNorm(config.n_embd, config.norm_eps)
        self.norm_4 = RMSNorm(config.n_embd, config.norm_eps)

    @property
    def self_attn(self) -> Attention:
        """The attention under transformers' name (what the probes read)."""
        return self.attn

    def forward(self, x: torch.Tensor, ctx: _Ctx, slot: int, site: Site | None = None) -> torch.Tensor:
        attn = self.attn(self.norm_1(x), ctx, slot, site.attn.hook_pattern if site is not None else _UNHOOKED)
        if site is not None:
            attn = site.attn.hook_out(attn)
        x = self.norm_2(attn + x)
        mlp = self.mlp(self.norm_3(x))
        if site is not None:
            mlp = site.mlp.hook_out(mlp)
        return self.norm_4(mlp + x)


_UNHOOKED = HookPoint()  # the pattern point of a layer without sites (never hooked)


class RavenModel(nn.Module):
    """The Raven modules under the reference's tensor names (`transformer.*`, `lm_head`, `freqs_cis`)."""

    def __init__(self, config: RavenConfig):
        super().__init__()
        self.config = config
        d = config.n_embd
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, d),
            prelude=nn.ModuleList(SandwichBlock(config) for _ in range(config.n_layers_in_prelude)),
            adapter=nn.Linear(2 * d, d, bias=config.bias),
            core_block=nn.ModuleList(SandwichBlock(config) for _ in range(config.n_layers_in_recurrent_block)),
            coda=nn.ModuleList(SandwichBlock(config) for _ in range(config.n_layers_in_coda)),
            ln_f=RMSNorm(d, config.norm_eps),
        ))
        self.lm_head = nn.Linear(d, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.transformer.wte.weight
        self.register_buffer("freqs_cis", rope_table(config), persistent=True)


class RavenCache:
    """A KV cache with one slot per Prelude layer, per recurrent layer *per step*, and per Coda layer.

    Slots: Prelude layer i -> i; recurrent layer j at step t -> a + (t - 1) * n_core + j; Coda layer k ->
    a + loops * n_core + k. Keys are stored after RoPE, as the attention reads them.
    """

    def __init__(self, loops: int, slots: int):
        self.workbench_loops = loops
        self.keys: list[torch.Tensor | None] = [None] * slots
        self.values: list[torch.Tensor | None] = [None] * slots

    def update(self, slot: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.keys[slot] is not None:
            k, v = torch.cat([self.keys[slot], k], dim=2), torch.cat([self.values[slot], v], dim=2)
        self.keys[slot], self.values[slot] = k, v
        return k, v

    def get_seq_length(self) -> int:
        return 0 if self.keys[0] is None else int(self.keys[0].shape[2])

    def nbytes(self) -> int:
        """Bytes the cache's keys and values take."""
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values) if t is not None)


@dataclass
class _Ctx:
    e: torch.Tensor               # the embeddings, then the Prelude's output
    s0: torch.Tensor              # the initial state
    rope: torch.Tensor            # [b, s, 1, head_dim / 2, 2]
    mask: torch.Tensor | None     # [b, 1, s, kv] bool, None when causal alone suffices
    cache: RavenCache | None
    loops: int


class RavenLooped(NativeLoopedLM):
    """A Raven model with a hook point per site and per step (1..max_loops, twice mean_recurrence)."""

    family = "huginn_raven"
    has_initial_state = True
    sites = ("prelude_resid", "prelude", "init_state", "adapter_in", "adapter_out", "input", "pattern", "attn_out",
             "mlp_out", "block_resid", "state", "coda_resid", "readout")
    init_seed: int = 0  # s_0's seed when a call gives neither init_state nor init_seed
    unsupported = {
        **NativeLoopedLM.unsupported,
        "base_identity": "a Raven model has no base to reproduce at loop 1; its exactness against the reference's own "
                         "forward is tests/test_native_raven.py (the reference's committed logits, max |Δlogit| = 0.0)",
        "dense_loop_cost": "its cost model counts the retrofit's loop; Raven's step is an adapter and its own "
                           "recurrent block, and the workbench has not fitted the model to it",
        "adaptive_read": "Raven has no halting head to stop a row; its zero-shot exits run through "
                         "adaptive_read(policy=ZeroShotExit(...)) and the exit_rules probe",
        "loop_kv_cache": "Raven's cache is its own (`new_cache`): one slot per recurrent layer per step",
    }

    def __init__(self, base: RavenModel):
        super().__init__(base)
        cfg = base.config
        self.a = cfg.n_layers_in_prelude
        self.b = self.a + cfg.n_layers_in_recurrent_block
        self.n_layers = self.b + cfg.n_layers_in_coda
        self.native_loops = cfg.mean_recurrence
        self.max_loops = 2 * cfg.mean_recurrence
        self._init: tuple[torch.Tensor | None, int | None] = (None, None)
        self.prelude = nn.ModuleDict({str(i): Site("hook_resid_post") for i in range(self.a)})
        self.hook_prelude = HookPoint()
        self.hook_init_state = HookPoint()
        self.loop = nn.ModuleDict({str(t): self._step_sites() for t in range(1, self.max_loops + 1)})
        self.setup()

    def _step_sites(self) -> Site:
        block = nn.ModuleDict({str(i): Site("hook_resid_post", attn=Site("hook_pattern", "hook_out"),
                                            mlp=Site("hook_out")) for i in range(self.a, self.b)})
        coda = nn.ModuleDict({str(i): Site("hook_resid_post") for i in range(self.b, self.n_layers)})
        return Site("hook_input", "hook_state", "hook_readout", adapter=Site("hook_in", "hook_out"), block=block,
                    coda=coda)

    @property
    def text_model(self) -> RavenModel:
        return self.base

    @property
    def layers(self) -> nn.ModuleList:
        t = self.base.transformer
        return nn.ModuleList([*t.prelude, *t.core_block, *t.coda])

    @property
    def final_norm(self) -> nn.Module:
        """ln_f: it normalises s_t before the Coda and the Coda's output before the head."""
        return self.base.transformer.ln_f

    # ----------------------------------------------------------------- the initial state
    @contextlib.contextmanager
    def initial_state(self, init_state: torch.Tensor | None = None, init_seed: int | None = None):
        """For the calls inside: s_0 is `init_state` ([batch, seq, d]) or drawn from `init_seed`."""
        if init_seed is not None and (isinstance(init_seed, bool) or not isinstance(init_seed, int) or init_seed < 0):
            raise WorkbenchError(f"init_seed={init_seed!r} must be a non-negative integer")
        saved = self._init
        self._init = (init_state, init_seed)
        try:
            yield
        finally:
            self._init = saved

    def draw_state(self, positions: torch.Tensor, seed: int, dtype: torch.dtype) -> torch.Tensor:
        """s_0 at each absolute position [b, s] -> [b, s, d]: sqrt(d) * TruncNormal(0, std^2, ±3 std), std =
        sqrt(2 / (5 d)), each position from its own generator (CPU, so every device draws the same)."""
        cfg = self.config
        std = cfg.init_std
        unique, where = positions.cpu().unique(return_inverse=True)
        rows = []
        for p in unique.tolist():
            g = torch.Generator().manual_seed(seed * SEED_STRIDE + int(p))
            rows.append(nn.init.trunc_normal_(torch.empty(cfg.n_embd), std=std, a=-3 * std, b=3 * std, generator=g))
        table = torch.stack(rows) * cfg.embed_scale
        return table[where].to(device=positions.device, dtype=dtype)

    def _s0(self, positions: torch.Tensor, e: torch.Tensor, past: int) -> torch.Tensor:
        """The given state, or one drawn; a cache's decoding steps (past > 0) draw theirs from the seed."""
        given, seed = self._init
        if given is None or past > 0:
            return self.draw_state(positions, self.init_seed if seed is None else seed, e.dtype)
        given = torch.as_tensor(given)
        if tuple(given.shape) != tuple(e.shape):
            raise WorkbenchError(f"init_state of shape {tuple(given.shape)} must be [batch, seq, d] = "
                                 f"{tuple(e.shape)} for this input")
        return given.to(device=e.device, dtype=e.dtype)

    # ----------------------------------------------------------------- the contract
    def _context(self, input_ids, attention_mask, position_ids, cache, loops, inputs_embeds=None, use_cache=False,
                 **kwargs):
        cfg, t = self.config, self.base.transformer
        e = t.wte(input_ids) if inputs_embeds is None else inputs_embeds
        e = e * cfg.embed_scale
        b, s = e.shape[:2]
        past = cache.get_seq_length() if cache is not None else 0
        if position_ids is None:
            position_ids = (torch.arange(s, device=e.device) + past).unsqueeze(0).expand(b, s)
        position_ids = position_ids.expand(b, s)
        rope = self.base.freqs_cis[0, position_ids.clamp(min=0)]
        mask = None
        if attention_mask is not None and not bool(attention_mask.all()) or past and s > 1:
            mask = _mask(attention_mask, b, s, past, e.device)
        return _Ctx(e, self._s0(position_ids, e, past), rope, mask, cache, loops)

    def _run(self, ctx: _Ctx, loops: int):
        t, a, n_core = self.base.transformer, self.a, self.b - self.a
        e = ctx.e
        for i, layer in enumerate(t.prelude):
            e = self.prelude[str(i)].hook_resid_post(layer(e, ctx, i))
        e = self.hook_prelude(e)
        s = self.hook_init_state(ctx.s0)
        for step in range(1, loops + 1):
            sites = self.loop[str(step)]
            x = sites.adapter.hook_in(torch.cat([s, e], dim=-1))   # the state first, then the Prelude's output
            x = sites.hook_input(sites.adapter.hook_out(t.adapter(x)))
            for j, layer in enumerate(t.core_block):
                site = sites.block[str(a + j)]
                x = site.hook_resid_post(layer(x, ctx, a + (step - 1) * n_core + j, site))
            s = sites.hook_state(x)
            yield step, Carry(s)

    def _coda(self, t: int, carry: Carry, ctx: _Ctx) -> torch.Tensor:
        tr, sites = self.base.transformer, self.loop[str(t)].coda
        x = tr.ln_f(carry.state)
        first = self.a + ctx.loops * (self.b - self.a)
        for k, layer in enumerate(tr.coda):
            x = sites[str(self.b + k)].hook_resid_post(layer(x, ctx, first + k))
        return tr.ln_f(x)

    # ----------------------------------------------------------------- calls with an initial state
    def forward(self, input_ids, attention_mask=None, loops=None, position_ids=None, cache=None, init_state=None,
                init_seed=None):
        """`NativeLoopedLM.forward`, with s_0 given (`init_state`, [batch, seq, d]) or drawn from `init_seed`."""
        with self.initial_state(init_state, init_seed):
            return super().forward(input_ids, attention_mask, loops, position_ids, cache)

    def read(self, input_ids, attention_mask=None, loops=None, positions=None, candidates=None, return_states=False,
             init_state=None, init_seed=None):
        """`NativeLoopedLM.read`, with s_0 given or drawn from `init_seed`."""
        with self.initial_state(init_state, init_seed):
            return super().read(input_ids, attention_mask, loops, positions, candidates, return_states)

    def read_final(self, input_ids, attention_mask=None, loops=None, positions=None, candidates=None,
                   init_state=None, init_seed=None):
        """`NativeLoopedLM.read_final`, with s_0 given or drawn from `init_seed`."""
        with self.initial_state(init_state, init_seed):
            return super().read_final(input_ids, attention_mask, loops, positions, candidates)

    def zero_shot(self, input_ids, attention_mask=None, loops=None, init_state=None, init_seed=None):
        """Huginn's zero-shot exit criteria per step, {criterion: [batch, T]} (`raven_exits`), in one forward."""
        return zero_shot_read(self, input_ids, attention_mask, loops, init_state, init_seed)[1]

    own_exits = {f"zero_shot_{c}": th for c, th in DEFAULTS.items()}

    def own_exit_steps(self, input_ids, attention_mask=None, loops=None) -> dict[str, torch.Tensor]:
        """Where each of Huginn's zero-shot criteria stops each row, at the reference's default thresholds."""
        values = self.zero_shot(input_ids, attention_mask, loops)
        return {f"zero_shot_{c}": exit_steps(values[c], c) for c in CRITERIA}

    def adaptive_read(self, input_ids, attention_mask=None, *, policy, positions=None, candidates=None,
                      init_state=None, init_seed=None) -> AdaptiveReadout:
        """Each row read at the step where a zero-shot criterion (`raven_exits.ZeroShotExit`) says stop.

        Raven has no halting head; Huginn's own exits are the zero-shot criteria, computed here on the last
        position's Coda readout and the states. Every step to the budget is computed (the rows' exits are read
        off one forward; the scores at `positions` / `candidates` off a second, same s_0): `row_loops` counts
        what ran, batch x T. `halt_probs` holds the criterion's value per step [batch, T].
        """
        if not isinstance(policy, ZeroShotExit):
            raise WorkbenchError("a Raven model has no halting head: adaptive_read takes a ZeroShotExit policy "
                                 f"(workbench.models.native.raven_exits; criteria {', '.join(CRITERIA)})")
        budget = self._loops(policy.max_loops)
        _, values = zero_shot_read(self, input_ids, attention_mask, budget, init_state, init_seed)
        used = exit_steps(values[policy.criterion], policy.criterion, policy.value)
        read = self.read(input_ids, attention_mask, budget, positions, candidates, init_state=init_state,
                         init_seed=init_seed)
        scores = read.scores[torch.arange(len(used)), used - 1]
        return AdaptiveReadout(scores=scores, positions=read.positions, loops_used=used,
                               halt_probs=values[policy.criterion], row_loops=input_ids.shape[0] * budget,
                               budget=budget)

    def new_cache(self, loops: int | None = None) -> RavenCache:
        """An empty per-step KV cache for decoding at `loops` steps (default mean_recurrence)."""
        loops = self._loops(loops)
        return RavenCache(loops, self.n_layers + (loops - 1) * (self.b - self.a))

    @torch.no_grad()
    def generate(self, input_ids, attention_mask=None, max_new_tokens: int = 16, loops: int | None = None,
                 init_state=None, init_seed=None):
        """Greedy decoding on the per-step cache: [batch, seq + max_new_tokens] token ids.

        s_0 of the prompt is `init_state` when given; every new position's is drawn from `init_seed`.
        `workbench.generation.generate` decodes any step counts, sampling included, on the same cache.
        """
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise WorkbenchError(f"max_new_tokens={max_new_tokens!r} must be a positive integer")
        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        cache, ids = self.new_cache(loops), input_ids
        with self.initial_state(init_state, init_seed):
            logits = super().forward(input_ids, mask, cache.workbench_loops, None, cache).logits
            for _ in range(max_new_tokens):
                chosen = logits[:, -1].argmax(-1, keepdim=True)
                ids, mask = torch.cat([ids, chosen], dim=1), torch.cat([mask, mask.new_ones(mask.shape[0], 1)], 1)
                if ids.shape[1] - input_ids.shape[1] == max_new_tokens:
                    break
                logits = super().forward(chosen, mask, cache.workbench_loops, None, cache).logits
        return ids


def _mask(attention_mask: torch.Tensor | None, b: int, s: int, past: int, device) -> torch.Tensor:
    """[b, 1, s, past + s] bool: query i (absolute past + i) sees key j <= past + i that is a real token; a padding
    query sees itself, so no row of the softmax is empty."""
    kv = past + s
    query = torch.arange(past, kv, device=device)[:, None]
    key = torch.arange(kv, device=device)[None, :]
    allowed = (key <= query).expand(b, s, kv)
    if attention_mask is not None:
        allowed = allowed & attention_mask[:, None, -kv:].bool()
    return (allowed | (key == query))[:, None]


def load(path, dtype: torch.dtype) -> RavenLooped:
    """The model of a Raven-format directory (`load_raven`), eval mode, every parameter frozen."""
    return RavenLooped(frozen(load_raven(path, dtype)))


def tiny(dtype: torch.dtype, tokenizer, seed: int, **sizes) -> RavenLooped:
    """A random Raven of `sizes` (config.json fields) over `tokenizer`'s vocabulary (`tiny_raven`), frozen."""
    return RavenLooped(frozen(tiny_raven(RavenConfig(vocab_size=len(tokenizer), **sizes), seed, dtype)))


def load_raven(path, dtype: torch.dtype = torch.float32) -> RavenModel:
    """A Raven-format directory's model, strictly: every tensor checked before any is used (its tokenizer and code
    are the registry's: `own.OwnFamily.load`).

    Raises:
        WorkbenchError: as `raven_files.read_config`, `weight_files` and `read_weights`.
    """
    from pathlib import Path  # noqa: PLC0415 - only the directory reader needs it

    from workbench.models.native import raven_files  # noqa: PLC0415 - the file reader, beside this module

    path = Path(path).expanduser()
    config = raven_files.read_config(path)
    with torch.device("meta"):
        model = RavenModel(config)
    expected = {name: t.shape for name, t in model.state_dict().items()}
    optional = frozenset({"freqs_cis", *(["lm_head.weight"] if config.tie_embeddings else [])})
    found = raven_files.read_weights(path, expected, optional, dtype)
    found.setdefault("freqs_cis", rope_table(config))
    if config.tie_embeddings:
        found.pop("lm_head.weight", None)
        expected.pop("lm_head.weight", None)
    model.load_state_dict(found, strict=False, assign=True)
    if config.tie_embeddings:
        model.lm_head.weight = model.transformer.wte.weight
    return model


def tiny_raven(config: RavenConfig, seed: int, dtype: torch.dtype = torch.float32) -> RavenModel:
    """A random Raven model: matrices N(0, (0.5 / sqrt(fan_in))^2), norm weights 1 + 0.1 randn, query/key biases
    N(0, 0.5^2), from `seed` (a scale at which every step, norm and rotation moves the logits)."""
    model = RavenModel(config)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("qk_bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            elif p.dim() == 1:
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5 / math.sqrt(p.shape[-1]))
    model.to(dtype)
    model.freqs_cis = model.freqs_cis.float()  # the rotation table stays fp32, as a checkpoint's does
    return model
