"""What a stage kind's step function is handed and returns: the step interface of `workbench.train.kinds`.

Every step function (one per kind, in its module under `workbench/train/stages/`) takes what it uses and nothing
else: the model being trained, the step's `StepInputs` (the global batch of rows, this rank's shard, the stage, the
chain weight, the tokenizer and device its batches need) and the run's `StepContext` (the recipe's seed, sampler and
halting tables, this rank's place among the ranks, what the kind keeps of the run: the halting stage's oracle
sweeps). It returns a `StepLoss`: this rank's loss (its shard's, divided by the global normaliser, so the sum over
ranks is the one-process loss), the loop count it ran, and what the step logs beside the loss.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from workbench.tasks.seeding import row_seed
from workbench.train.losses import make_batch
from workbench.train.recipe import HaltingTable, SamplerTable, Stage


def hashed_seed(kind: str, step: int, seed: int) -> int:
    """The seed of one step's draw of `kind` (depths, loop counts, oracle sweep rows): the same on every rank."""
    return row_seed(f"workbench-train-{kind}", "train", 0, 0, step, seed) % (2 ** 63)


@dataclass
class StepInputs:
    """The step's own inputs: the step, its stage, the global batch and this rank's shard of it, and the tokenizer
    and device its batches are built with."""

    step: int                  # the global step (0-based)
    local: int                 # the step within its stage
    stage: Stage
    rows: list[dict]           # the global batch, the same on every rank
    shard: list[dict]          # this rank's rows
    chain_weight: float        # the stage's chain weight at this step
    device: torch.device | str | None
    tokenizer: object
    _batch: dict | None = field(default=None, repr=False)

    @property
    def batch(self) -> dict:
        """The shard's chain batch (`make_batch`), padded to the global batch's deepest row on every rank."""
        if self._batch is None:
            self._batch = make_batch(self.shard, self.tokenizer, chain_weight=self.chain_weight, device=self.device,
                                     loops=max(r["depth"] for r in self.rows))
        return self._batch


@dataclass
class StepContext:
    """What the step functions read of the run beside the model and the step's rows: the same at every step."""

    seed: int                  # the recipe's seed (the hashed draws of park loop counts and oracle sweep rows)
    sampler: SamplerTable      # the sampled stage's loop-count sampler (and park's maximum loop count)
    halting: HaltingTable      # the halting stage's objective, oracle depth and oracle sweep size
    rank: int                  # this process's index among the ranks
    ranks: int                 # the number of ranks
    # What the step's kind keeps of the run (`StageKind.context`), built once per run; None for a kind without:
    # the halting stage's oracle sweeps by stage start (`workbench.train.stages.halting.OracleSweeps`).
    own: object = None


@dataclass
class StepLoss:
    """A step function's result: this rank's loss, the loops it ran, and what the step logs beside the loss."""

    loss: torch.Tensor
    loops: int
    info: dict = field(default_factory=dict)


def rounded(values) -> list[float]:
    """A per-loop or per-position reading as a step's record logs it (5 decimals)."""
    return [round(float(v), 5) for v in values]
