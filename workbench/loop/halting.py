"""Halting head (RecurTrace Sec. 3, App. E): a continue probability from a pooled loop state.

`p_t = sigmoid(w . pool(h_t) + b)`, pooled over real prompt positions (mean by default,
or the last real token). The halting stage (RecurTrace's Stage 2) distills it from the loss-improvement oracle:
`y_t = 1[min_{t' > t} L_t' < L_t - delta]`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from workbench.defaults import ORACLE_DEPTH_COST, ORACLE_MARGIN
from workbench.errors import WorkbenchError
from workbench.loop.config import HALTING_POOLING, RetrofitConfig
from workbench.loop.positions import last_real_token

POOLING = HALTING_POOLING


class HaltingHead(nn.Module):
    """`forward(h [b, s, d], attention_mask [b, s] or None) -> continue probability [b]`."""

    def __init__(self, d_model: int, pooling: str = RetrofitConfig.halting_pooling):  # the one default
        super().__init__()
        if pooling not in POOLING:
            raise ValueError(f"pooling '{pooling}' is not one of {POOLING}")
        self.pooling = pooling
        self.proj = nn.Linear(d_model, 1)

    def pool(self, h: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        if attention_mask is None:
            return h.mean(dim=1) if self.pooling == "mean" else h[:, -1]
        m = attention_mask.to(h.dtype).unsqueeze(-1)
        if self.pooling == "mean":
            return (h * m).sum(dim=1) / m.sum(dim=1).clamp(min=1)
        return h[torch.arange(h.shape[0], device=h.device), last_real_token(attention_mask)]

    def forward(self, h: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        return torch.sigmoid(self.proj(self.pool(h, attention_mask)).squeeze(-1))


def oracle_labels(losses: torch.Tensor, margin: float = ORACLE_MARGIN,
                  depth_cost: float = ORACLE_DEPTH_COST) -> torch.Tensor:
    """Continue labels from per-depth losses [batch, T]: 1 where a deeper loop beats L_t - margin.

    An optional depth cost charges each extra loop before it counts as worthwhile.
    Returns float labels [batch, T]; the last depth is always 0 (nothing deeper to try).
    """
    b, T = losses.shape
    steps = torch.arange(T, device=losses.device, dtype=losses.dtype)
    labels = torch.zeros_like(losses)
    for t in range(T - 1):
        deeper = losses[:, t + 1:] + depth_cost * (steps[t + 1:] - t)
        labels[:, t] = (deeper.min(dim=1).values < losses[:, t] - margin).to(losses.dtype)
    return labels


def halt_depth(probs: torch.Tensor, threshold: float, t_min: int = 1) -> torch.Tensor:
    """Chosen depth per row [batch] from continue probabilities [batch, T]: the first t >= t_min
    with p_t < threshold, else T (the budget)."""
    b, T = probs.shape
    stop = probs < threshold
    stop[:, : max(0, t_min - 1)] = False
    stop[:, -1] = True
    return stop.long().argmax(dim=1) + 1


@dataclass(frozen=True)
class HaltPolicy:
    """When a row stops in adaptive inference (`LoopedLM.adaptive_read`): at the first loop
    t >= `min_loops` whose continue probability p_t < `tau`, else at the budget `max_loops`
    (default the model's). tau = 0 never stops early (the fixed-depth run); tau = 1 stops at `min_loops`.
    """

    tau: float
    min_loops: int = 1
    max_loops: int | None = None

    def __post_init__(self):
        if not (isinstance(self.tau, (int, float)) and math.isfinite(self.tau) and 0 <= self.tau <= 1):
            raise WorkbenchError(f"halting tau={self.tau!r} must be a number in [0, 1]")
        budget = self.max_loops if self.max_loops is not None else self.min_loops
        if not (isinstance(self.min_loops, int) and isinstance(budget, int) and 1 <= self.min_loops <= budget):
            raise WorkbenchError(f"halting min_loops={self.min_loops!r}, max_loops={self.max_loops!r}: "
                                 "need integers with 1 <= min_loops <= max_loops")

    def stops(self, t: int, probs: torch.Tensor, budget: int) -> torch.Tensor:
        """Which rows stop after loop t, bool [rows], from their continue probabilities p_t [rows]."""
        if t >= budget:
            return torch.ones_like(probs, dtype=torch.bool)
        if t < self.min_loops:
            return torch.zeros_like(probs, dtype=torch.bool)
        return probs < self.tau
