"""The looped kinds that supervise loops with the task's answers: chain, sampled and park (`workbench.train.recipe`
describes each). They share the main optimizer (`workbench.train.optim.MAIN`) and the looped reader."""

from __future__ import annotations

from workbench.errors import WorkbenchError
from workbench.train.kinds import StageKind, register
from workbench.train.losses import answer_loss, chain_loss, make_batch, park_loop_count, sample_loop_counts
from workbench.train.optim import MAIN
from workbench.train.steps import StepContext, StepInputs, StepLoss, hashed_seed, rounded


def chain_step(model, x: StepInputs, run: StepContext) -> StepLoss:
    """Per-loop cross-entropy on loops 1..d of each row, intermediate loops weighted by the chain weight."""
    denom = sum(x.chain_weight * (r["depth"] - 1) + 1.0 for r in x.rows)
    loss, per_loop = chain_loss(model, x.batch, denominator=denom)
    return StepLoss(loss, max(r["depth"] for r in x.rows), {"loop_ce": rounded(per_loop)})


def sampled_step(model, x: StepInputs, run: StepContext) -> StepLoss:
    """RecurTrace Stage 1: the answer's loss at a loop count drawn from the clamped log-normal Poisson."""
    s = run.sampler
    loops = int(sample_loop_counts(1, s.mean, s.sigma, s.max, hashed_seed("loops", x.step, 0))[0])
    return StepLoss(answer_loss(model, x.batch, loops, denominator=len(x.rows)), loops)


def park_step(model, x: StepInputs, run: StepContext) -> StepLoss:
    """The chain up to each row's depth d, then the answer x_d at every loop d..T (T drawn per step); rows of depths
    outside the stage's `park_depths` (when it names any) iterate past d instead."""
    loops = park_loop_count(max(row["depth"] for row in x.rows), run.sampler.max, hashed_seed("park", x.step, run.seed))
    batch = make_batch(x.shard, x.tokenizer, chain_weight=x.chain_weight, device=x.device, park_loops=loops,
                       park_depths=None if x.stage.park_depths is None else set(x.stage.park_depths))
    denom = sum(x.chain_weight * (row["depth"] - 1) + (loops - row["depth"] + 1) for row in x.rows)
    loss, per_loop = chain_loss(model, batch, denominator=denom)
    return StepLoss(loss, loops, {"loop_ce": rounded(per_loop)})


def check_sampled(recipe, i: int) -> None:
    """The sampler's deepest count within the retrofit's loops."""
    if not 1 <= recipe.sampler.max <= recipe.model.max_loops:
        raise WorkbenchError(f"recipe key 'sampler.max' = {recipe.sampler.max} must lie in 1..model.max_loops = "
                             f"{recipe.model.max_loops}")


def check_park(recipe, i: int) -> None:
    """park_depths names some of the stage's depths; the answer is held from the deepest depth to sampler.max."""
    s, top, max_loops = recipe.stages[i], recipe.sampler.max, recipe.model.max_loops
    if s.park_depths is not None and not s.park_depths:
        raise WorkbenchError(f"recipe key 'stages.{i}.park_depths' = [] parks no depth; name at least one or "
                             "leave the key out (every depth parks)")
    if s.park_depths and not set(s.park_depths) <= set(s.depths):
        raise WorkbenchError(f"recipe key 'stages.{i}.park_depths' = {s.park_depths} names depths the stage "
                             f"does not train (its depths: {s.depths})")
    if not max(s.depths) <= top <= max_loops:
        raise WorkbenchError(f"recipe key 'sampler.max' = {top} must lie in {max(s.depths)}..model.max_loops = "
                             f"{max_loops} (stage {i} parks on the answer from its deepest row's depth up to "
                             "sampler.max loops)")


def sampler_loops(recipe, stage) -> int:
    return recipe.sampler.max


register(StageKind(
    "chain", chain_step, MAIN, loops=lambda recipe, stage: max(stage.depths),
    # the outcome-only anneal (chain weight 1 -> 0), LoRA with the preservation KL, the guardrail on
    example={"chain+outcome+kl+guardrail": {
        "lora": {"enabled": True, "r": 2, "alpha": 4}, "train": {"block": False},
        "preserve": {"kl_weight": 0.1, "rows": 2}, "guardrail": {"enabled": True, "max_drop": 1.0, "every": 1},
        "stages": [{"depths": [1, 2], "steps": 1},
                   {"depths": [1, 2], "steps": 2, "chain_weight": 1.0, "chain_weight_end": 0.0}]}}))
register(StageKind("sampled", sampled_step, MAIN, loops=sampler_loops, check=check_sampled, answers=True))
register(StageKind(
    "park", park_step, MAIN, loops=sampler_loops, check=check_park, reads_past=True, stage_keys=("park_depths",),
    # the answer held at every loop d..T (T sampled), its evaluation reading past d
    example={"park": {"sampler": {"max": 3}, "stages": [{"kind": "park", "depths": [1, 2], "steps": 1}]}}))
