"""The dense controls (`workbench.train.dense`): direct and scratchpad, loop 1 only, each an arm of its own."""

from __future__ import annotations

from workbench.errors import WorkbenchError
from workbench.train.dense import direct_loss, scratchpad_batch, scratchpad_loss
from workbench.train.evaluate import evaluate_dense
from workbench.train.kinds import StageKind, register
from workbench.train.optim import MAIN
from workbench.train.steps import StepContext, StepInputs, StepLoss, rounded


def direct_step(model, x: StepInputs, run: StepContext) -> StepLoss:
    """The dense direct control: loop 1 supervised on the final answer x_d."""
    return StepLoss(direct_loss(model, x.batch, denominator=len(x.rows)), 1)


def scratchpad_step(model, x: StepInputs, run: StepContext) -> StepLoss:
    """The dense scratchpad control: loop 1 teacher-forced on the written chain x_1 .. x_d."""
    pad = scratchpad_batch(x.shard, x.tokenizer, device=x.device)
    loss, per_pos = scratchpad_loss(model, pad, denominator=sum(r["depth"] for r in x.rows))
    return StepLoss(loss, 1, {"position_ce": rounded(per_pos)})


def check_chase(recipe, i: int) -> None:
    """A dense control is a control of the chase."""
    task = recipe.task.name
    if task != "chase":
        raise WorkbenchError(f"stage {i} is a {recipe.stages[i].kind} stage, a dense control of the chase; "
                             f"task '{task}' trains with kind 'sampled' or 'chain'")


def control(kind: str, step) -> StageKind:
    """The record of a dense control: loop 1, the main optimizer, its own reader of the held-out rows."""
    def reader(model, tokenizer, rows, batch_size):
        return evaluate_dense(model, tokenizer, rows, kind, batch_size)

    example = {"train": {"block": False}, "lora": {"enabled": True, "r": 2, "alpha": 4},
               "stages": [{"kind": kind, "depths": [1, 2], "steps": 1}]}
    return StageKind(kind, step, MAIN, loops=lambda recipe, stage: 1, check=check_chase, arm="dense control",
                     reader=reader, example={kind: example})


register(control("direct", direct_step))
register(control("scratchpad", scratchpad_step))
