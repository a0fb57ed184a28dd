"""The engine a Trainer is handed: how one step's gradients are reduced, clipped and applied, and what it records.

`Engine` is the interface the trainer calls; the trainer never asks which engine it holds. Two implementations:

- `LocalEngine`: one process, and DDP under `accelerate launch` (the trainer's own gradient sum over ranks,
  `sharding.reduce_grads`; no wrapper). `Fsdp2Engine` is the same with the frozen base sharded after setup
  (`sharding.shard_frozen_base`), so the held-out readings then run on every rank (they all-gather).
- `Zero2Engine`: DeepSpeed ZeRO-2 (`workbench.train.zero2.Zero2Optimizer` wraps the trainer's AdamW): the loss
  scaled so DeepSpeed's average is the trainer's sum, clipping inside DeepSpeed's step on the full gradients'
  norm, the full AdamW state gathered before a checkpoint is saved; AdamW alone is accepted.

`make_engine` builds the one `sharding.requested_engine` names. A checkpoint's optimizer state is torch's own format
under every engine, so each engine loads it through the optimizer's `load_state_dict` (`rundir.load_checkpoint`).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import NamedTuple

import torch

from workbench.errors import WorkbenchError
from workbench.train.optim import group_rms, step_with_movement
from workbench.train.sharding import reduce_grads, shard_frozen_base
from workbench.train.zero2 import Zero2Optimizer


class Update(NamedTuple):
    """What one optimizer step records: the gradient RMS per group, the (pre-clip) global norm, the movement."""

    grad_rms: dict[str, float]
    grad_norm: float           # nan when the step does not clip
    move_rms: dict[str, float]


class Engine(ABC):
    """How a run's steps are taken across its processes (see the module docstring).

    The methods take the optimizer and the accelerator they act on rather than holding them: the trainer builds a
    new optimizer per stage kind (`wrap` turns it into the one this engine steps), and the accelerator is the
    trainer's (a test may stand another in after construction).
    """

    name: str

    def check_optimizer(self, name: str) -> None:
        """Refuses, before anything is written, a recipe optimizer (`optim.name`) this engine cannot step."""

    def prepare(self, looped) -> None:
        """Applies the engine's plan to the set-up retrofit, once, after every tensor was loaded."""

    @property
    def reads_on_every_rank(self) -> bool:
        """Whether held-out and guardrail readings run on every rank (a sharded model) or on the main one alone."""
        return False

    def record(self) -> dict:
        """The engine's record in provenance.json ("engine")."""
        return {"engine": self.name}

    def wrap(self, looped, optimizer: torch.optim.Optimizer, clip: float):
        """The optimizer the trainer steps, built around `optimizer` (its groups already named); `clip` is the
        stage's gradient clipping norm (0: none)."""
        return optimizer

    def release(self, optimizer) -> None:
        """Lets go of an optimizer `wrap` returned, before a new one replaces it."""

    @abstractmethod
    def backward(self, optimizer, loss: torch.Tensor, params: list[torch.Tensor], acc,
                 device) -> tuple[torch.Tensor, dict[int, float] | None]:
        """Backward on this rank's loss; returns (the loss summed over ranks, {id(param): sum of squares of its full
        gradient} where a rank holds only part of the gradients, else None: `param.grad` is then the full one)."""

    @abstractmethod
    def update(self, optimizer, params: list[torch.Tensor], names: list[list[str]],
               squares: dict[int, float] | None, clip: float) -> Update:
        """Reads the gradients, clips at `clip` (0: no clipping, norm nan), steps; returns what the step records."""

    def before_save(self, optimizer, keep: bool) -> None:
        """Called on every rank before a checkpoint; `keep` on the process that saves `optimizer.state_dict()`."""


class LocalEngine(Engine):
    """One process ("none"), or DDP ("ddp"): every rank holds whole gradients, summed over ranks by the trainer."""

    def __init__(self, name: str = "none"):
        self.name = name

    def backward(self, optimizer, loss, params, acc, device):
        loss.backward()
        return reduce_grads(acc, params, loss.detach(), device), None

    def update(self, optimizer, params, names, squares, clip):
        grad_rms = group_rms(optimizer, lambda p: p.grad)
        norm = float(torch.nn.utils.clip_grad_norm_(params, clip)) if clip > 0 else float("nan")
        return Update(grad_rms, norm, step_with_movement(optimizer))


class Fsdp2Engine(LocalEngine):
    """DDP's step with the frozen layers outside the looped block sharded by FSDP2 (`sharding.shard_frozen_base`)."""

    def __init__(self):
        super().__init__("fsdp2")
        self.sharding: dict | None = None   # the plan's record, once applied

    def prepare(self, looped) -> None:
        self.sharding = shard_frozen_base(looped)

    @property
    def reads_on_every_rank(self) -> bool:
        return self.sharding is not None

    def record(self) -> dict:
        return self.sharding or super().record()


class Zero2Engine(Engine):
    """DeepSpeed ZeRO-2 over `world_size` ranks: the trainer's AdamW partitioned (`workbench.train.zero2`)."""

    name = "zero2"

    def __init__(self, world_size: int):
        self.world_size = world_size

    def check_optimizer(self, name: str) -> None:
        if name != "adamw":
            raise WorkbenchError(f"optim.name = '{name}' under the zero2 preset: ZeRO-2 here partitions "
                                 "AdamW's state only; use optim.name = 'adamw' or --preset ddp")

    def record(self) -> dict:
        return {"engine": "zero2", "world_size": self.world_size, "stage": 2,
                "partitioned": "gradients, fp32 master copy and AdamW state of the trained tensors",
                "whole": "the trained tensors and the frozen base, on every rank"}

    def wrap(self, looped, optimizer, clip):
        # The same AdamW and groups, partitioned inside a DeepSpeed engine that clips at `clip` in its step.
        return Zero2Optimizer(looped, optimizer, clip, self.world_size)

    def release(self, optimizer: Zero2Optimizer) -> None:
        optimizer.close()   # its DeepSpeed engine's gradient hooks go with it

    def backward(self, optimizer: Zero2Optimizer, loss, params, acc, device):
        # DeepSpeed reduces an average: the loss is scaled to a sum inside `Zero2Optimizer.backward`.
        total = optimizer.backward(loss)
        return total, optimizer.grad_squares()   # of the full gradients, as one process reads them

    def update(self, optimizer: Zero2Optimizer, params, names, squares, clip):
        # DeepSpeed clips inside its step, on the same global norm.
        norm = math.sqrt(sum(squares.values())) if clip > 0 else float("nan")
        return Update(optimizer.group_rms(squares), norm, optimizer.step_with_movement(names))

    def before_save(self, optimizer: Zero2Optimizer, keep: bool) -> None:
        optimizer.gather_state(keep=keep)   # a collective; the process that saves keeps the full state


def make_engine(name: str, world_size: int) -> Engine:
    """The engine `sharding.requested_engine` names: "none", "ddp", "fsdp2" or "zero2"."""
    if name == "zero2":
        return Zero2Engine(world_size)
    if name == "fsdp2":
        return Fsdp2Engine()
    if name in ("none", "ddp"):
        return LocalEngine(name)
    raise ValueError(f"unknown engine {name!r}")
