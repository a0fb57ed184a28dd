"""Loop Memory Attention (RecurTrace Eq. 2-5, App. C).

Before looped layer l at loop t, each token attends over the outputs that the same layer
wrote at the same position on the last W loops. Attention runs along loop time only, so
no token sees another. The query is layer l's previous-loop output (also the newest key).
QK-norm, a signed learnable per-head loop-distance slope initialised to ALiBi values, a
scalar gate gamma = 1 and a token-wise gate sigmoid(MLP([q, mean(X)])) starting at
sigmoid(-3) ~ 0.047.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from workbench.loop.config import RetrofitConfig


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """ALiBi slopes 2^(-8 h / n) for h = 1..n (Press et al. 2022), shape [n_heads]."""
    return torch.tensor([2.0 ** (-8.0 * (h + 1) / n_heads) for h in range(n_heads)])


def memory_width(d_model: int) -> int:
    """Memory attention width: the paper's 512 at d = 1024 (ratio 1/2), capped at 512."""
    return min(512, max(8, d_model // 2))


class LoopMemoryAttention(nn.Module):
    """One layer's loop-time memory. `forward(q, X, distances)` returns the update [b, s, d]."""

    def __init__(self, d_model: int, n_heads: int = RetrofitConfig.memory_heads, width: int | None = None,
                 gate_bias: float = -3.0, gamma: float = 1.0, eps: float = 1e-6):
        super().__init__()
        width = width or memory_width(d_model)
        if width % n_heads:
            raise ValueError(f"memory width {width} is not divisible by {n_heads} heads")
        self.n_heads, self.head_dim = n_heads, width // n_heads
        self.q_in_norm = nn.RMSNorm(d_model, eps=eps)
        self.kv_in_norm = nn.RMSNorm(d_model, eps=eps)
        self.q_proj = nn.Linear(d_model, width, bias=False)
        self.k_proj = nn.Linear(d_model, width, bias=False)
        self.v_proj = nn.Linear(d_model, width, bias=False)
        self.o_proj = nn.Linear(width, d_model, bias=False)
        self.q_norm = nn.RMSNorm(self.head_dim, eps=eps)  # QK-norm, per head
        self.k_norm = nn.RMSNorm(self.head_dim, eps=eps)
        self.slopes = nn.Parameter(alibi_slopes(n_heads))  # signed, free
        self.gamma = nn.Parameter(torch.tensor(float(gamma)))
        self.gate_mlp = nn.Sequential(nn.Linear(2 * d_model, d_model), nn.SiLU(), nn.Linear(d_model, 1))
        # Zero output weights: the token gate starts at exactly sigmoid(gate_bias) for every token,
        # and the output layer still receives gradient (its input is the live hidden layer).
        nn.init.zeros_(self.gate_mlp[2].weight)
        nn.init.constant_(self.gate_mlp[2].bias, gate_bias)

    def keys_values(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One loop's output x [b, s, d] as a memory entry's (keys, values), each [b, s, h, dh].

        A loop's output is a key and value for the next W loops: computed once when it is written
        (`LoopedLM` keeps them in its window) instead of once per reading loop."""
        b, s, _ = x.shape
        xk = self.kv_in_norm(x)
        k = self.k_norm(self.k_proj(xk).view(b, s, self.n_heads, self.head_dim))
        return k, self.v_proj(xk).view(b, s, self.n_heads, self.head_dim)

    def forward(self, q: torch.Tensor, memory: torch.Tensor, distances: torch.Tensor) -> torch.Tensor:
        """Args: q [b, s, d]; memory X [b, s, m, d] (oldest first); distances t - t_j, shape [m]."""
        b, s, m, _ = memory.shape
        k, v = self.keys_values(memory.reshape(b, s * m, -1))
        shape = (b, s, m, self.n_heads, self.head_dim)
        return self.attend(q, k.view(shape), v.view(shape), memory.mean(dim=2), distances)

    def attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mean: torch.Tensor,
               distances: torch.Tensor) -> torch.Tensor:
        """The update from precomputed entries: q [b, s, d]; keys, values [b, s, m, h, dh] (oldest first, from
        `keys_values`); mean [b, s, d] the entries' mean output (the token gate's input); distances [m]."""
        b, s, _ = q.shape
        h, dh = self.n_heads, self.head_dim
        qh = self.q_norm(self.q_proj(self.q_in_norm(q)).view(b, s, h, dh))            # [b, s, h, dh]
        logits = torch.einsum("bshd,bsmhd->bshm", qh, keys) / math.sqrt(dh)
        logits = logits - self.slopes[:, None] * distances.to(logits.dtype)[None, :]   # [h, m] bias
        attn = logits.float().softmax(dim=-1).to(logits.dtype)  # fp32 softmax in bf16 runs too
        mixed = torch.einsum("bshm,bsmhd->bshd", attn, values).reshape(b, s, h * dh)
        gate = torch.sigmoid(self.gate_mlp(torch.cat([q, mean], dim=-1)))  # [b, s, 1]
        return self.gamma * gate * self.o_proj(mixed)  # per-loop hook applied by LoopedLM
