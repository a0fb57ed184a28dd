"""Ouro's modules, written here from the architecture (Zhu et al. 2025, "Scaling Latent Reasoning via Looped
Language Models"; the model card's config fields), under the checkpoint's own tensor names.

    h_0 = embed(tokens)
    step t = 1..T:  for each layer i:  h = h + N2_i(Attn_i(N1_i(h)))          sandwich norms around attention
                                       h = h + N4_i(MLP_i(N3_i(h)))           and around the MLP
                    h_t = Norm(h)                                             the final norm, after every step,
                    lambda_t = sigmoid(gate(h_t))                             carried into step t + 1
    logits_t = lm_head(h_t)

N1..N4 are `input_layernorm`, `input_layernorm_2`, `post_attention_layernorm`, `post_attention_layernorm_2`.
Attention is grouped-query with rotary positions on the half-split layout (`rotate_half`). Every (step, layer)
has its own KV-cache slot. Nothing here comes from the checkpoint directory but its config.json and tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from workbench.errors import WorkbenchError

# config.json field -> the reference's default (a field a checkpoint omits takes it)
FIELDS = {"vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016, "num_hidden_layers": 32,
          "num_attention_heads": 32, "num_key_value_heads": 32, "hidden_act": "silu", "max_position_embeddings": 32768,
          "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "rope_theta": 10000.0, "rope_scaling": None,
          "use_sliding_window": False, "total_ut_steps": 4, "early_exit_threshold": 1.0, "head_dim": None,
          "pad_token_id": None, "bos_token_id": None, "eos_token_id": None, "layer_types": None}


@dataclass
class OuroConfig:
    """An Ouro config.json's fields (the reference's names), checked; what the adapter contract reads."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    hidden_act: str
    max_position_embeddings: int
    rms_norm_eps: float
    tie_word_embeddings: bool
    rope_theta: float
    rope_scaling: dict | None
    use_sliding_window: bool
    total_ut_steps: int
    early_exit_threshold: float
    head_dim: int | None
    pad_token_id: int | None
    bos_token_id: int | None
    eos_token_id: int | list | None
    layer_types: list | None
    model_type: str = "ouro"
    use_cache: bool = True
    _attn_implementation: str = "eager"
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, raw: dict, where: str) -> OuroConfig:
        """The config of a config.json dict; an unsupported or out-of-range value is a one-line error."""
        values = {k: raw.get(k, default) for k, default in FIELDS.items()}
        if values["num_key_value_heads"] is None:
            values["num_key_value_heads"] = values["num_attention_heads"]
        config = cls(**values, extra={k: v for k, v in raw.items() if k not in FIELDS})
        config.check(where)
        return config

    def check(self, where: str) -> None:
        sizes = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "max_position_embeddings", "total_ut_steps")
        for name in sizes:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise WorkbenchError(f"{where}: config.json's {name} is {value!r}; a positive integer is needed")
        if self.num_attention_heads % self.num_key_value_heads or (
                self.head_dim is None and self.hidden_size % self.num_attention_heads):
            raise WorkbenchError(f"{where}: config.json's heads ({self.num_attention_heads} query, "
                                 f"{self.num_key_value_heads} key/value) do not divide hidden_size {self.hidden_size}")
        check_threshold(self.early_exit_threshold, f"{where}: config.json's early_exit_threshold")
        unsupported = {"hidden_act": self.hidden_act != "silu", "use_sliding_window": bool(self.use_sliding_window),
                       "layer_types": any(kind != "full_attention" for kind in self.layer_types or ()),
                       "rope_scaling": self.rope_scaling not in (None, {}) and
                       (self.rope_scaling.get("rope_type", self.rope_scaling.get("type")) != "default")}
        for name, bad in unsupported.items():
            if bad:
                raise WorkbenchError(f"{where}: config.json's {name} = {getattr(self, name)!r} is not supported "
                                     "(the released Ouro checkpoints use silu, full attention and plain RoPE)")

    @property
    def head_size(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads


def check_threshold(value, what: str) -> float:
    """`value` as an exit threshold on the cumulative exit probability, which must lie in (0, 1]."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
        raise WorkbenchError(f"{what} is {value!r}; an exit threshold is a cumulative probability in (0, 1]")
    return float(value)


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) in fp32, back to the input dtype, then times the weight."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotary(head_size: int, theta: float, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """(cos, sin) [batch, seq, head_size] for integer `positions` [batch, seq], computed in fp32."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_size, 2, dtype=torch.int64, device=positions.device).float()
                               / head_size)
    angles = (inv_freq[None, :, None] @ positions[:, None, :].float()).transpose(1, 2)   # [b, s, head_size / 2]
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on the half-split layout: x cos + (-x2, x1) sin, for x [b, heads, s, head_size]."""
    half = x.shape[-1] // 2
    turned = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos.unsqueeze(1) + turned * sin.unsqueeze(1)


class StepCache:
    """Keys and values per (step, layer): a token's step-t attention reads the earlier tokens' step-t keys."""

    def __init__(self, loops: int):
        self.workbench_loops = loops
        self.slots: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}

    def update(self, slot: tuple[int, int], k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if slot in self.slots:
            old_k, old_v = self.slots[slot]
            k, v = torch.cat([old_k, k], dim=2), torch.cat([old_v, v], dim=2)
        self.slots[slot] = (k, v)
        return k, v

    def get_seq_length(self) -> int:
        return next(iter(self.slots.values()))[0].shape[2] if self.slots else 0

    def nbytes(self) -> int:
        """Bytes the keys and values hold."""
        return sum(k.nelement() * k.element_size() + v.nelement() * v.element_size() for k, v in self.slots.values())


class Attention(nn.Module):
    """Grouped-query attention with RoPE; the probabilities pass `pattern` when given."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, head_size: int):
        super().__init__()
        self.heads, self.kv_heads, self.head_size = heads, kv_heads, head_size
        self.q_proj = nn.Linear(hidden, heads * head_size, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * head_size, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * head_size, bias=False)
        self.o_proj = nn.Linear(heads * head_size, hidden, bias=False)

    def forward(self, x, rope, mask, cache=None, slot=None, pattern=None) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, -1, self.head_size).transpose(1, 2)      # [b, heads, s, head_size]
        k = self.k_proj(x).view(b, s, -1, self.head_size).transpose(1, 2)      # [b, kv_heads, s, head_size]
        v = self.v_proj(x).view(b, s, -1, self.head_size).transpose(1, 2)
        q, k = rotate(q, *rope), rotate(k, *rope)
        if cache is not None:
            k, v = cache.update(slot, k, v)
        groups = self.heads // self.kv_heads
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        scores = q @ k.transpose(2, 3) * self.head_size ** -0.5 + mask
        probs = nn.functional.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        if pattern is not None:
            probs = pattern(probs)
        return self.o_proj((probs @ v).transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    """down(silu(gate(x)) * up(x))."""

    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """One layer with a norm before and after each sublayer (`h + N2(Attn(N1(h)))`, `h + N4(MLP(N3(h)))`)."""

    def __init__(self, config: OuroConfig):
        super().__init__()
        d, eps = config.hidden_size, config.rms_norm_eps
        self.self_attn = Attention(d, config.num_attention_heads, config.num_key_value_heads, config.head_size)
        self.mlp = MLP(d, config.intermediate_size)
        self.input_layernorm, self.input_layernorm_2 = RMSNorm(d, eps), RMSNorm(d, eps)
        self.post_attention_layernorm, self.post_attention_layernorm_2 = RMSNorm(d, eps), RMSNorm(d, eps)

    def forward(self, h, rope, mask, cache=None, slot=None, pattern=None) -> torch.Tensor:
        h = h + self.input_layernorm_2(self.self_attn(self.input_layernorm(h), rope, mask, cache, slot, pattern))
        return h + self.post_attention_layernorm_2(self.mlp(self.post_attention_layernorm(h)))


class OuroModel(nn.Module):
    """The embedding, the looped layer stack, the final norm and the exit gate (`model.*` in the checkpoint)."""

    def __init__(self, config: OuroConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.early_exit_gate = nn.Linear(config.hidden_size, 1)


class OuroForCausalLM(nn.Module):
    """`model` and `lm_head`, named as the checkpoint names them; the adapter (`ouro.OuroLooped`) runs them."""

    def __init__(self, config: OuroConfig):
        super().__init__()
        self.config = config
        self.model = OuroModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight


def causal_mask(attention_mask: torch.Tensor | None, batch: int, queries: int, past: int,
                dtype: torch.dtype, device) -> torch.Tensor:
    """[batch, 1, queries, past + queries] additive mask: 0 where a query may read a key, the dtype's minimum where
    the key is later or padding (`attention_mask` [batch, past + queries], 1 = real)."""
    keys = past + queries
    allowed = torch.arange(keys, device=device)[None, :] <= torch.arange(past, keys, device=device)[:, None]
    allowed = allowed[None, None].expand(batch, 1, queries, keys)
    if attention_mask is not None:
        allowed = allowed & attention_mask[:, None, None, -keys:].bool()
    return torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill(~allowed, torch.finfo(dtype).min)


def exit_distribution(lam: torch.Tensor) -> torch.Tensor:
    """p_t [..., T]: the probability of exiting at step t, lambda_t prod_{s<t} (1 - lambda_s), the last step taking
    what is left, from the per-step exit probabilities lambda [..., T]."""
    remaining = torch.ones_like(lam[..., 0])
    pdf = []
    for t in range(lam.shape[-1]):
        if t < lam.shape[-1] - 1:
            pdf.append(lam[..., t] * remaining)
            remaining = remaining * (1.0 - lam[..., t])
        else:
            pdf.append(remaining)
    return torch.stack(pdf, dim=-1)


def exit_steps(lam: torch.Tensor, threshold: float) -> torch.Tensor:
    """[...] the 1-based step at which each token exits: the first whose cumulative exit probability reaches
    `threshold`, else the last."""
    reached = torch.cumsum(exit_distribution(lam), dim=-1) >= threshold
    first = reached.float().argmax(dim=-1)
    return torch.where(reached.any(dim=-1), first, lam.shape[-1] - 1) + 1
