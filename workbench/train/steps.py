"""One training step's loss, per stage kind: the table `STEPS` the trainer dispatches through.

Every step function takes what it uses and nothing else: the model being trained, the step's `StepInputs` (the
global batch of rows, this rank's shard, the stage, the chain weight, the tokenizer and device its batches need) and
the run's `StepContext` (the recipe's seed, sampler and halting tables, this rank's place among the ranks, Stage 2's
cached sweep). It returns a `StepLoss`: this rank's loss (its shard's, divided by the global normaliser, so the sum
over ranks is the one-process loss), the loop count it ran, and what the step logs beside the loss. Adding a stage
kind is one function here, one entry in `STEPS` and its name in `workbench.train.recipe.STAGE_KINDS`.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from workbench.tasks.seeding import row_seed
from workbench.train.dense import direct_loss, scratchpad_batch, scratchpad_loss
from workbench.train.losses import (
    answer_loss,
    chain_loss,
    halting_loss,
    halting_objective,
    halting_probs,
    make_batch,
    park_loop_count,
    sample_loop_counts,
)
from workbench.train.recipe import HaltingTable, SamplerTable, Stage


def hashed_seed(kind: str, step: int, seed: int) -> int:
    """The seed of one step's draw of `kind` (depths, loop counts, sweep rows): the same on every rank."""
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

    seed: int                  # the recipe's seed (the hashed draws of park loop counts and sweep rows)
    sampler: SamplerTable      # Stage 1's loop-count sampler (and park's maximum loop count)
    halting: HaltingTable      # Stage 2's objective, oracle depth and sweep size
    rank: int                  # this process's index among the ranks
    ranks: int                 # the number of ranks
    # Stage 2's oracle sweep (losses, pooled states) of the stage starting at a step, computed once per stage
    # (`Trainer.halting_cache`): read by a halting step with `[halting] sweep` rows.
    sweep: Callable[[int, Stage], tuple[torch.Tensor, torch.Tensor]]


@dataclass
class StepLoss:
    """A step function's result: this rank's loss, the loops it ran, and what the step logs beside the loss."""

    loss: torch.Tensor
    loops: int
    info: dict = field(default_factory=dict)


def _rounded(values) -> list[float]:
    return [round(float(v), 5) for v in values]


def direct_step(model, x: StepInputs, run: StepContext) -> StepLoss:
    """The dense direct control: loop 1 supervised on the final answer x_d."""
    return StepLoss(direct_loss(model, x.batch, denominator=len(x.rows)), 1)


def scratchpad_step(model, x: StepInputs, run: StepContext) -> StepLoss:
    """The dense scratchpad control: loop 1 teacher-forced on the written chain x_1 .. x_d."""
    pad = scratchpad_batch(x.shard, x.tokenizer, device=x.device)
    loss, per_pos = scratchpad_loss(model, pad, denominator=sum(r["depth"] for r in x.rows))
    return StepLoss(loss, 1, {"position_ce": _rounded(per_pos)})


def chain_step(model, x: StepInputs, run: StepContext) -> StepLoss:
    """Per-loop cross-entropy on loops 1..d of each row, intermediate loops weighted by the chain weight."""
    denom = sum(x.chain_weight * (r["depth"] - 1) + 1.0 for r in x.rows)
    loss, per_loop = chain_loss(model, x.batch, denominator=denom)
    return StepLoss(loss, max(r["depth"] for r in x.rows), {"loop_ce": _rounded(per_loop)})


def park_step(model, x: StepInputs, run: StepContext) -> StepLoss:
    """The chain up to each row's depth d, then the answer x_d at every loop d..T (T drawn per step); rows of depths
    outside the stage's `park_depths` (when it names any) iterate past d instead."""
    loops = park_loop_count(max(row["depth"] for row in x.rows), run.sampler.max, hashed_seed("park", x.step, run.seed))
    batch = make_batch(x.shard, x.tokenizer, chain_weight=x.chain_weight, device=x.device, park_loops=loops,
                       park_depths=None if x.stage.park_depths is None else set(x.stage.park_depths))
    denom = sum(x.chain_weight * (row["depth"] - 1) + (loops - row["depth"] + 1) for row in x.rows)
    loss, per_loop = chain_loss(model, batch, denominator=denom)
    return StepLoss(loss, loops, {"loop_ce": _rounded(per_loop)})


def sampled_step(model, x: StepInputs, run: StepContext) -> StepLoss:
    """RecurTrace Stage 1: the answer's loss at a loop count drawn from the clamped log-normal Poisson."""
    s = run.sampler
    loops = int(sample_loop_counts(1, s.mean, s.sigma, s.max, hashed_seed("loops", x.step, 0))[0])
    return StepLoss(answer_loss(model, x.batch, loops, denominator=len(x.rows)), loops)


def halting_step(model, x: StepInputs, run: StepContext) -> StepLoss:
    """RecurTrace Stage 2: the halting head alone, on the frozen model's forward or on the cached sweep."""
    h = run.halting
    if h.sweep:   # the paper's offline sweep: the frozen model's losses and pooled states, cached
        losses, z = run.sweep(x.step - x.local, x.stage)
        rng = random.Random(hashed_seed("sweep", x.step, run.seed))
        idx = rng.sample(range(len(losses)), min(len(x.rows), len(losses)))
        mine = idx[run.rank::run.ranks]
        loss, extra = halting_objective(losses[mine], halting_probs(model, z[mine]), h, denominator=len(idx))
    else:
        loss, extra = halting_loss(model, x.batch, h, denominator=len(x.rows))
    return StepLoss(loss, h.oracle_max, extra)


STEPS: dict[str, Callable[[torch.nn.Module, StepInputs, StepContext], StepLoss]] = {
    "chain": chain_step, "sampled": sampled_step, "park": park_step, "halting": halting_step,
    "direct": direct_step, "scratchpad": scratchpad_step,
}
