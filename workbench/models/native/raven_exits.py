"""Huginn's zero-shot exit criteria (Geiping et al. 2025, §6; the reference's exit evaluators), read per step.

At step t, with p_t the softmax of the last position's logits read through the Coda, s_t the recurrent state
(s_0 the initial state) and means taken over the row's real positions:

    kl                KL(p_{t-1} ‖ p_t), p_0 uniform over the vocabulary          exit when < 0.001
    latent-diff       mean_pos ||s_t - s_{t-1}|| / ||s_t||                        exit when < 0.03
    entropy-diff      |H(p_t) - H(p_{t-1})|, H(p_0) = 100, H = -Σ p log(p + 1e-10) exit when < 0.001
    argmax-stability  steps the argmax has stayed the same (0 at step 1)         exit when >= 5
    cosine            1 - mean_pos cos(s_t, s_{t-1})                             exit when < 0.001

The thresholds are the reference's defaults ("auto"). A row exits at the first step whose value crosses its
threshold, else at the budget T. Every step is computed in one forward to T: this reads where each criterion
would stop, it saves no compute.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from workbench.errors import WorkbenchError
from workbench.loop.hooks import hook_name

DEFAULTS = {"kl": 1e-3, "latent-diff": 0.03, "entropy-diff": 1e-3, "argmax-stability": 5, "cosine": 1e-3}
CRITERIA = tuple(DEFAULTS)
ABOVE = ("argmax-stability",)  # exits when the value is at least the threshold; the others when below it


@dataclass(frozen=True)
class ZeroShotExit:
    """One zero-shot criterion as an exit policy: `criterion` (a name of CRITERIA), its threshold (default the
    reference's), and the budget `max_loops` (default the model's native step count)."""

    criterion: str
    threshold: float | None = None
    max_loops: int | None = None

    def __post_init__(self):
        if self.criterion not in DEFAULTS:
            raise WorkbenchError(f"zero-shot exit '{self.criterion}' is unknown; accepted: {', '.join(CRITERIA)}")
        th = self.threshold
        if th is None:
            return
        if self.criterion == "argmax-stability":
            if isinstance(th, bool) or not isinstance(th, int) or th < 1:
                raise WorkbenchError(f"argmax-stability threshold={th!r} must be a whole number of steps >= 1")
        elif isinstance(th, bool) or not isinstance(th, (int, float)) or not 0 < th <= (2 if self.criterion ==
                                                                                           "cosine" else float("inf")):
            bound = "(0, 2]" if self.criterion == "cosine" else "> 0"
            raise WorkbenchError(f"{self.criterion} threshold={th!r} is out of range {bound}")

    @property
    def value(self) -> float:
        return DEFAULTS[self.criterion] if self.threshold is None else self.threshold


def criterion_values(logits: torch.Tensor, states: torch.Tensor, s0: torch.Tensor,
                     mask: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """{criterion: [b, T]} from the last position's logits [b, T, V], the states [b, T, s, d] and s_0 [b, s, d];
    `mask` [b, s] marks real positions (the state criteria average over them)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    b, T, V = logp.shape
    prev_logp = torch.cat([torch.full_like(logp[:, :1], -torch.log(torch.tensor(float(V)))), logp[:, :-1]], dim=1)
    kl = (prev_logp.exp() * (prev_logp - logp)).sum(-1)
    p = logp.exp()
    entropy = -(p * torch.log(p + 1e-10)).sum(-1)
    entropy_diff = (entropy - torch.cat([torch.full_like(entropy[:, :1], 100.0), entropy[:, :-1]], dim=1)).abs()
    predicted = logits.argmax(-1)
    stable = torch.zeros_like(predicted)
    for t in range(1, T):
        stable[:, t] = torch.where(predicted[:, t] == predicted[:, t - 1], stable[:, t - 1] + 1, 0)
    s = states.float()
    prev = torch.cat([s0.float()[:, None], s[:, :-1]], dim=1)
    real = torch.ones(s.shape[0], s.shape[2]) if mask is None else mask.float()
    real = real.to(s.device)[:, None]                                                         # [b, 1, s]

    def mean_over_positions(x):
        return (x * real).sum(-1) / real.sum(-1)

    latent = mean_over_positions((s - prev).norm(dim=-1) / s.norm(dim=-1))
    cosine = 1 - mean_over_positions((s * prev).sum(-1) / s.norm(dim=-1) / prev.norm(dim=-1))
    return {"kl": kl, "latent-diff": latent, "entropy-diff": entropy_diff, "argmax-stability": stable.float(),
            "cosine": cosine}


def exit_steps(values: torch.Tensor, criterion: str, threshold: float | None = None) -> torch.Tensor:
    """[b] the first step (1-based) whose value crosses the threshold, else T."""
    th = DEFAULTS[criterion] if threshold is None else threshold
    hit = values >= th if criterion in ABOVE else values < th
    T = values.shape[1]
    first = torch.where(hit, torch.arange(1, T + 1, device=values.device), T + 1).min(dim=1).values
    return first.clamp(max=T)


@torch.no_grad()
def zero_shot_read(looped, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                   loops: int | None = None, init_state=None, init_seed=None):
    """One forward to `loops` steps: (logits [b, T, V] at each row's last position per step, {criterion: [b, T]}).

    Rows are left padded (the last position is every row's last real token)."""
    if attention_mask is not None and not bool(attention_mask[:, -1].all()):
        raise WorkbenchError("zero-shot exits read each row's last position: pad on the left")
    seen = {}

    def keep(name):
        def hook(x, hook):
            seen.setdefault(name, []).append(x)
        return hook

    T = looped._loops(loops)
    last = torch.full((input_ids.shape[0], 1), input_ids.shape[1] - 1, device=input_ids.device)
    hooks = [(hook_name("init_state"), keep("s0"))] + [(hook_name("state", t), keep("states")) for t in range(1, T + 1)]
    with looped.hooks(fwd_hooks=hooks):
        read = looped.read(input_ids, attention_mask, loops=T, positions=last, init_state=init_state,
                           init_seed=init_seed)
    logits = read.scores[:, :, 0]
    states = torch.stack(seen["states"], dim=1)
    return logits, criterion_values(logits, states, seen["s0"][0], attention_mask)
