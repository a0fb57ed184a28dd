"""`LoopedModel`: what every looped model offers the probes, whoever built it.

A retrofit (`workbench.loop.looped.LoopedLM`) and a native family (`workbench.models.native`: Inkling2Loop,
HRM-Text) both satisfy it; probes, lenses and generation read these attributes directly instead of asking
`getattr` / `hasattr` what a model might have. What differs between kinds of model is declared, not probed:
`supports` names the capabilities a model has (`CAPABILITIES`), `unsupported` says for each one it lacks why,
and a probe that needs one declares it (`ProbeSpec.requires`), so the battery records the model's reason and
runs the rest.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Protocol, runtime_checkable

import torch
from torch import nn

# capability -> what it means; a probe's `requires` and a model's `supports` name these
CAPABILITIES = {
    "base_identity": "loop 1 reproduces an untouched base model exactly (the identity probe)",
    "trained_adapters": "trainable re-entry and adapters whose gradients can be audited (gradient_audit)",
    "dense_loop_cost": "one dense block per loop, the latency probe's cost model",
    "adaptive_read": "adaptive inference under a halting policy (`adaptive_read`)",
    "loop_kv_cache": "a KV cache with one slot per loop and layer, so a suffix recomputes on a cached prefix",
}


@runtime_checkable
class LoopedModel(Protocol):
    """The looped interface the probes read.

    Attributes:
        max_loops: the most loops (passes) one forward can run.
        native_loops: a native model's own pass count (what it was trained with); None for a retrofit, which
            runs any T in 1..max_loops.
        halting: the halting head, or None.
        halt_rule: how the model's own continue probabilities (`read(...).halt_probs`) stop a row, as
            `workbench.probes.halting.RULES` names it: "threshold" (p_t < tau, a retrofit's head) or "cdf"
            (1 - prod_{s<=t} p_s >= tau, Ouro's learned exit).
        has_initial_state: whether the loop starts from a state of its own, s_0 (Raven), which `init_state=` /
            `init_seed=` set; False for a retrofit and the other native families.
        precision: "fp32" or "bf16" (`workbench.precision`).
        supports: the capabilities (keys of `CAPABILITIES`) the model has.
        unsupported: {capability: why this model lacks it} for every capability it lacks.
        final_norm: the norm the LM head reads after (HRM: the one that ends its H stack).
        hook_dict: TransformerLens' {hook name: HookPoint}.
    """

    max_loops: int
    native_loops: int | None
    halting: nn.Module | None
    halt_rule: str
    has_initial_state: bool
    precision: str
    supports: frozenset[str]
    unsupported: Mapping[str, str]
    hook_dict: dict

    @property
    def final_norm(self) -> nn.Module: ...

    def logit_transform(self, logits: torch.Tensor) -> torch.Tensor:
        """The family's transform of the head's output (Inkling's softcap; identity elsewhere), for lenses."""

    def all_cycles_with_grad(self) -> AbstractContextManager:
        """A context in which every pass is differentiable (HRM runs some L cycles without grad)."""

    def read(self, input_ids, attention_mask=None, loops: int = 1, **kwargs): ...

    def read_final(self, input_ids, attention_mask=None, loops: int = 1, **kwargs): ...


def lacking(model: LoopedModel, required) -> list[str]:
    """The capabilities of `required` that `model` lacks, in order."""
    return [c for c in required if c not in model.supports]
