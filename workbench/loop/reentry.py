"""Re-entry designs: how loop t >= 2 combines the Prelude output p with the carried state h.

Both start as an exact identity (loop t input == h_{t-1}) that still carries gradient, so a
fresh retrofit reproduces the base model at loop 1 and the new parameters can learn.
"""

from __future__ import annotations

import torch
from torch import nn

from workbench.errors import WorkbenchError
from workbench.loop.config import REENTRIES


class SplitBridge(nn.Module):
    """Retrofit paper Sec. 3.2 / App. A.2: `h + g * (W_p LN(p) + W_s h + bias - h)`.

    W_p (`prelude_proj`) is its own tensor so it can sit in its own optimizer group with its
    own learning rate (Sec. 5.1). At init W_p = 0, W_s = I, bias = 0, g = 1: the output is h
    exactly, and W_p receives gradient g * dL/du * LN(p)^T from the first step. The gate's own
    gradient is (translated - h) * dL/du, which is zero until W_p or W_s move (by design: a
    zero gate would instead be self-locking, App. A.2).
    """

    def __init__(self, d_model: int):
        super().__init__()
        self.prelude_norm = nn.LayerNorm(d_model)
        self.prelude_proj = nn.Linear(d_model, d_model, bias=False)
        self.state_proj = nn.Linear(d_model, d_model, bias=True)
        self.gate = nn.Parameter(torch.ones(()))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.zeros_(self.prelude_proj.weight)
        with torch.no_grad():
            self.state_proj.weight.copy_(torch.eye(self.state_proj.in_features))
        nn.init.zeros_(self.state_proj.bias)
        self.prelude_norm.reset_parameters()
        with torch.no_grad():
            self.gate.fill_(1.0)

    def forward(self, p: torch.Tensor, h: torch.Tensor) -> torch.Tensor:  # [b, s, d] each
        translated = self.prelude_proj(self.prelude_norm(p)) + self.state_proj(h)
        return h + self.gate * (translated - h)


class AdditiveInjection(nn.Module):
    """RecurTrace Eq. 1: `h + alpha * RMSNorm(p)`, alpha = 0 at init (ReZero style).

    alpha's gradient at init is <RMSNorm(p), dL/du>, nonzero: the path is live from step 0.
    """

    def __init__(self, d_model: int, eps: float = 1e-6):
        super().__init__()
        self.prelude_norm = nn.RMSNorm(d_model, eps=eps)
        self.alpha = nn.Parameter(torch.zeros(()))

    def reset_parameters(self) -> None:
        self.prelude_norm.reset_parameters()
        with torch.no_grad():
            self.alpha.zero_()

    def forward(self, p: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return h + self.alpha * self.prelude_norm(p)


class LoopCodes(nn.Module):
    """A learned vector per loop t >= 2, added to the re-entry's output: `u_t + codes[t - 2]`.

    In neither paper. A weight-tied block fed only its carried state and the Prelude output has no loop index,
    so a model that must act on the loop count (park on x_d when the prompt states d: issue 33's park model)
    has to build a counter inside its state. The codes give it one. Loop 1 never sees a code, so the loop-1
    identity holds whatever they learn; they start at 0 (the retrofit unchanged at every loop) and, being
    added with no gate, take the gradient dL/du_t from the first step.
    """

    def __init__(self, max_loops: int, d_model: int, device: torch.device | str | None = None):
        super().__init__()
        self.codes = nn.Parameter(torch.zeros(max(max_loops - 1, 0), d_model, device=device))

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.codes.zero_()

    def forward(self, t: int, u: torch.Tensor) -> torch.Tensor:
        if t < 2:
            raise WorkbenchError(f"loop codes start at loop 2 (loop 1 is the base); got loop {t}")
        return u + self.codes[t - 2].to(u.dtype)


REENTRY_DESIGNS = dict(zip(REENTRIES, (SplitBridge, AdditiveInjection)))


def make_reentry(design: str, d_model: int) -> nn.Module:
    """Returns a fresh re-entry module for `design` ("bridge" or "inject")."""
    if design not in REENTRY_DESIGNS:
        raise WorkbenchError(f"unknown re-entry design '{design}'; accepted: {', '.join(REENTRY_DESIGNS)}")
    return REENTRY_DESIGNS[design](d_model)
