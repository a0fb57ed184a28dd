"""The halting stage (RecurTrace App. E): everything frozen but the halting head, which is distilled from the
loss-improvement oracle or trained with the ACT / PonderNet objective (`workbench.train.losses`).

Its own optimizer (AdamW on the head alone at `[halting] lr`, cosine after its warm-up, the head clipped at 1) records
the digest of every other tensor when it is built, and the run's end checks it unchanged. With `[halting] sweep = N`
the head trains on the oracle sweep of N training rows: the frozen model's per-loop losses and the head's pooled
inputs, computed once per stage (App. E's offline sweep, `OracleSweeps`) and kept on disk by content
(`workbench.train.oracle_sweep`); 0 runs the frozen model every step.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import replace

import torch
from tqdm.auto import tqdm

from workbench.errors import WorkbenchError
from workbench.loop.halting import oracle_labels
from workbench.train import oracle_sweep
from workbench.train.kinds import Optimizer, StageKind, register
from workbench.train.losses import halting_loss, halting_objective, halting_probs, make_batch
from workbench.train.optim import lr_factor, make_optimizer
from workbench.train.steps import StepContext, StepInputs, StepLoss, hashed_seed


def halting_step(model, x: StepInputs, run: StepContext) -> StepLoss:
    """The halting head alone, on the frozen model's forward or on the stage's oracle sweep."""
    h = run.halting
    if h.sweep:   # the paper's offline sweep: the frozen model's losses and pooled states, cached
        losses, z = run.own(x.step - x.local, x.stage)
        rng = random.Random(hashed_seed("sweep", x.step, run.seed))
        idx = rng.sample(range(len(losses)), min(len(x.rows), len(losses)))
        mine = idx[run.rank::run.ranks]
        loss, extra = halting_objective(losses[mine], halting_probs(model, z[mine]), h, denominator=len(idx))
    else:
        loss, extra = halting_loss(model, x.batch, h, denominator=len(x.rows))
    return StepLoss(loss, h.oracle_max, extra)


def build_head_optimizer(looped, groups: list[str], recipe) -> tuple[torch.optim.Optimizer, list[list[str]]]:
    """AdamW on the halting head alone at `[halting] lr`; asserts nothing else takes gradient (base, block,
    re-entry, memory, LoRA stay as the parent left them)."""
    h = recipe.halting
    cfg = replace(recipe.optim, name="adamw", lr=h.lr, prelude_lr_mult=1.0, weight_decay=0.0)
    opt, names = make_optimizer(looped, ["halting"], cfg)
    moving = [n for n, p in looped.named_parameters() if p.requires_grad and not n.startswith("halting.")]
    if moving:
        raise WorkbenchError(f"the halting stage must train the halting head alone; {moving[0]} takes gradient")
    if not any(p.requires_grad for p in looped.halting.parameters()):
        raise WorkbenchError("the halting stage has no halting parameter to train")
    return opt, names


HEAD = Optimizer("halting", build_head_optimizer,
                 schedule=lambda recipe, steps: lr_factor(recipe.halting.warmup_steps, steps, "cosine"),
                 clip=lambda recipe: 1.0, frozen=True,
                 freeze_message="the halting stage moved a tensor outside the halting head (base, block, re-entry, "
                                "memory or LoRA changed after the stages before it)")


def check_halting(recipe, i: int) -> None:
    """A head to train; probe depths the oracle reads; an oracle depth within the retrofit's loops."""
    h, max_loops = recipe.halting, recipe.model.max_loops
    if not recipe.model.halting:
        raise WorkbenchError(f"stage {i} is a halting stage but model.halting = false")
    probe = h.probe_depths
    # Loop counts past oracle_max are not read (losses.halting_loss), so the default [1, 2, 4, 6] suits a short
    # sweep; a list with none inside 1..oracle_max would read nothing and train to a NaN.
    if not (probe and all(isinstance(t, int) and t >= 1 for t in probe) and any(t <= h.oracle_max for t in probe)):
        raise WorkbenchError(f"recipe key 'halting.probe_depths' = {probe} must be loop counts >= 1, at least one "
                             f"in 1..halting.oracle_max = {h.oracle_max}")
    if not 1 <= h.oracle_max <= max_loops:
        raise WorkbenchError(f"recipe key 'halting.oracle_max' = {h.oracle_max} must lie in 1..model.max_loops = "
                             f"{max_loops}")


class OracleSweeps:
    """The oracle sweeps of one run's halting stages (`[halting] sweep` rows each), computed once per stage and
    kept in memory: called with a stage's first step and the stage, returns (losses [N, T], pooled states z).

    The rows are the ones the online halting stage would draw at the stage's first steps (`TrainingData.rows`), so
    the sweep is deterministic from the recipe and a resumed run rebuilds the same one."""

    def __init__(self, run, log, progress: bool):
        self.run, self.log, self.progress = run, log, progress
        self.sweeps: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def __call__(self, start: int, stage) -> tuple[torch.Tensor, torch.Tensor]:
        if start not in self.sweeps:
            self.sweeps[start] = self.compute(start, stage)
        return self.sweeps[start]

    def compute(self, start: int, stage) -> tuple[torch.Tensor, torch.Tensor]:
        """The sweep of the stage starting at `start`: read from the disk cache or computed (then stored); logged."""
        run = self.run
        h, B, looped = run.recipe.halting, run.recipe.optim.batch_size, run.model
        rows = [r for s in range(start, start + -(-h.sweep // B)) for r in run.data.rows(s, stage)][: h.sweep]
        size = run.recipe.eval.batch_size
        batches = (make_batch(rows[i:i + size], run.tokenizer, device=run.device) for i in range(0, len(rows), size))
        t0 = time.perf_counter()
        # one process: the sweep is read from the cache when the same frozen model, rows and loops computed it before
        # (heads on one frozen model, `workbench.train.oracle_sweep`); several ranks compute their own
        key = (oracle_sweep.sweep_key(looped, rows, h.oracle_max, size,
                                      json.dumps(run.precision_record, sort_keys=True, default=str), run.device)
               if oracle_sweep.enabled() and run.processes == 1 else None)
        cached = oracle_sweep.read_sweep(key, len(rows), h.oracle_max) if key else None
        if cached is not None:
            losses, z = (t.to(run.device) for t in cached)
        else:
            was_training = looped.training
            looped.eval()
            with tqdm(total=len(rows), desc="oracle sweep", leave=False, dynamic_ncols=True,
                      disable=not self.progress) as bar:
                losses, z = oracle_sweep.sweep(looped, batches, h.oracle_max, progress=bar.update)
            looped.train(was_training)
            if key:
                oracle_sweep.write_sweep(key, losses, z)
        labels = oracle_labels(losses, margin=h.margin, depth_cost=h.depth_cost)
        target = (labels < 0.5).float().argmax(1) + 1
        depths = sorted({r["depth"] for r in rows})
        self.log({"kind": "halting_sweep", "step": start, "rows": len(rows), "loops": h.oracle_max,
                  "seconds": round(time.perf_counter() - t0, 2), "cache": "off" if key is None else
                  "read" if cached is not None else "written", "sweep_key": key,
                  "continue_rate": [round(float(v), 4) for v in labels.mean(0)],
                  "mean_target": round(float(target.float().mean()), 4),
                  "mean_target_by_depth": {str(d): round(float(target[[r["depth"] == d for r in rows]]
                                                                    .float().mean()), 4) for d in depths}})
        return losses, z


HEAD_MODEL = {"model": {"block": "2:4", "reentry": "inject", "memory": True, "halting": True},
              "train": {"block": False}, "sampler": {"max": 3}}

register(StageKind(
    "halting", halting_step, HEAD, loops=lambda recipe, stage: recipe.halting.oracle_max, check=check_halting,
    kl=False, liveness=False, answers=True, new_head=True, context=OracleSweeps,
    # every objective, online and on the oracle sweep, after a sampled stage and on its own
    example={"sampled+oracle": {**HEAD_MODEL, "halting": {"oracle_max": 3, "objective": "oracle"},
                                "stages": [{"kind": "sampled", "depths": [1, 2], "steps": 1},
                                           {"kind": "halting", "depths": [1, 2], "steps": 1}]},
             "act on the sweep": {**HEAD_MODEL, "halting": {"oracle_max": 3, "objective": "act", "sweep": 4},
                                  "stages": [{"kind": "halting", "depths": [1, 2], "steps": 1}]},
             "pondernet": {**HEAD_MODEL, "halting": {"oracle_max": 3, "objective": "pondernet"},
                           "stages": [{"kind": "halting", "depths": [1, 2], "steps": 1}]}}))
