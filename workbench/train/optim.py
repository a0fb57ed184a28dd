"""The optimizer of a retrofit run and its safeguards (retrofit paper Sec. 5.1, App. A.2).

W_p alone in a `prelude_proj` AdamW group at lr x multiplier, asserted at start; a multiplier
the optimizer cannot honour is refused; re-entry liveness; realized movement (RMS of the
parameter change) per group. `make_optimizer` returns the parameter names of every group beside
the optimizer: checkpoints (`workbench.train.rundir`) store and check them. `step_with_movement` takes the
step and measures the movement without copying every trained tensor.
"""

from __future__ import annotations

import math

import torch

from workbench.errors import WorkbenchError
from workbench.loop.surgery import parameter_groups
from workbench.train.kinds import Optimizer
from workbench.train.recipe import OptimTable

PRELUDE_PROJ = "reentry.prelude_proj.weight"


def optimizer_groups(looped, trainable: list[str]) -> list[tuple[str, list[tuple[str, torch.nn.Parameter]]]]:
    """(group name, [(param name, param)]) for the trainable groups, W_p split into `prelude_proj`."""
    named = parameter_groups(looped)
    out = []
    for g in trainable:
        params = [(n, p) for n, p in named[g] if n != PRELUDE_PROJ]
        if params:
            out.append((g, params))
        if g == "reentry":
            out += [("prelude_proj", [(n, p) for n, p in named[g] if n == PRELUDE_PROJ])]
    return [(g, ps) for g, ps in out if ps]


def make_optimizer(looped, trainable: list[str], cfg: OptimTable) -> tuple[torch.optim.Optimizer, list[list[str]]]:
    """Returns (the optimizer, the parameter names of each of its groups in order).

    One parameter group per trainable group, W_p at lr × prelude_lr_mult, the loop codes (a group of their own)
    at lr × loop_codes_lr_mult, neither with weight decay. The names are what a
    checkpoint records (`workbench.train.rundir.save_checkpoint`) and checks on resume.

    Raises:
        WorkbenchError: a rate multiplier the optimizer cannot honour. Only AdamW's per-group
            rate is verified at the realized-update level (retrofit paper Sec. 5.1, App. E).
    """
    mult = cfg.prelude_lr_mult
    if cfg.name != "adamw" and mult != 1.0:
        raise WorkbenchError(f"optim.name = '{cfg.name}' with optim.prelude_lr_mult = {mult}: only adamw honours "
                             "a per-group rate multiplier here; use adamw or set prelude_lr_mult = 1")
    if cfg.name != "adamw" and "loop_codes" in trainable and cfg.loop_codes_lr_mult != 1.0:
        raise WorkbenchError(f"optim.name = '{cfg.name}' with optim.loop_codes_lr_mult = {cfg.loop_codes_lr_mult}: "
                             "only adamw honours a per-group rate multiplier here; use adamw or set it to 1")
    groups, names = [], []
    for g, params in optimizer_groups(looped, trainable):
        for _, p in params:
            p.requires_grad_(True)
        names.append([n for n, _ in params])
        lr = cfg.lr * {"prelude_proj": mult, "loop_codes": cfg.loop_codes_lr_mult}.get(g, 1.0)
        wd = 0.0 if g in ("prelude_proj", "loop_codes") else cfg.weight_decay  # W_p: as the paper's Listing 3
        groups.append({"name": g, "params": [p for _, p in params], "lr": lr, "weight_decay": wd})
    if cfg.name == "adamw":
        opt = torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, foreach=False)
    else:
        opt = torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum, foreach=False)
    return opt, names


def check_prelude_group(optimizer, looped, lr: float, mult: float) -> None:
    """Asserts W_p sits alone in a group named `prelude_proj` at lr × mult (bridge designs only).

    Raises:
        WorkbenchError: the group is missing, holds other tensors, or has another rate.
    """
    if not hasattr(looped.reentry, "prelude_proj"):
        return
    w_p = looped.reentry.prelude_proj.weight
    found = [g for g in optimizer.param_groups if any(p is w_p for p in g["params"])]
    if len(found) != 1 or found[0].get("name") != "prelude_proj" or len(found[0]["params"]) != 1:
        raise WorkbenchError("the bridge's Prelude projection W_p is not alone in its own 'prelude_proj' "
                             "optimizer group")
    rate = found[0].get("initial_lr", found[0]["lr"])
    if not math.isclose(rate, lr * mult, rel_tol=1e-12):
        raise WorkbenchError(f"the 'prelude_proj' group has lr {rate}, expected {lr} × {mult} = {lr * mult}")


def group_rms(optimizer, values) -> dict[str, float]:
    """RMS per optimizer group of `values(param)` (None counts as zeros)."""
    out = {}
    for g in optimizer.param_groups:
        sq = n = 0
        for p in g["params"]:
            v = values(p)
            n += p.numel()
            sq += 0.0 if v is None else float(v.detach().double().pow(2).sum())
        out[g["name"]] = math.sqrt(sq / max(n, 1))
    return out


def step_with_movement(optimizer) -> dict[str, float]:
    """Takes the optimizer's step; returns the RMS per group of how far it moved each parameter (`group_rms`).

    The step is taken one parameter at a time, the others' gradients held aside so the optimizer skips them. The
    per-tensor (foreach=False) AdamW and SGD of `make_optimizer` update each parameter from its own gradient and
    state alone, so this is the same arithmetic, bit for bit, as one step over all of them; only the parameter being
    stepped is copied to measure its change, not every trained tensor at once (benchmarks/training_memory.py).

    Raises:
        WorkbenchError: a foreach or fused optimizer (it updates every tensor in one kernel).
    """
    if optimizer.defaults.get("foreach") or optimizer.defaults.get("fused"):
        raise WorkbenchError("step_with_movement needs a per-tensor optimizer (foreach=False, not fused)")
    held = [(p, p.grad) for g in optimizer.param_groups for p in g["params"]]
    for p, _ in held:
        p.grad = None
    grads = {id(p): grad for p, grad in held}
    out = {}
    for g in optimizer.param_groups:
        sq = n = 0
        for p in g["params"]:
            n += p.numel()
            if grads[id(p)] is None:   # no gradient: the optimizer leaves it where it is
                continue
            p.grad = grads[id(p)]
            before = p.detach().clone()
            optimizer.step()
            sq += float((p.detach() - before).double().pow(2).sum())
            p.grad = None
        out[g["name"]] = math.sqrt(sq / max(n, 1))
    for p, grad in held:
        p.grad = grad
    return out


def liveness(looped, squares: dict[int, float] | None = None) -> dict[str, float]:
    """Gradient RMS of the re-entry's live parameters (W_p, W_s, gate; or alpha).

    `squares` ({id(param): sum of squares of its full gradient}) replaces `param.grad` where a rank holds only
    part of the gradient (ZeRO-2, `workbench.train.zero2`)."""
    def rms(p) -> float:
        if squares is not None:
            return math.sqrt(squares[id(p)] / max(p.numel(), 1))
        return 0.0 if p.grad is None else float(p.grad.double().pow(2).mean().sqrt())

    return {n: rms(p) for n, p in looped.reentry.named_parameters()
            if n in ("prelude_proj.weight", "state_proj.weight", "gate", "alpha")}


def lr_factor(warmup: int, total: int, schedule: str):
    """The learning-rate multiplier at a step: linear warm-up, then the schedule (constant, linear or cosine)."""
    def factor(step: int) -> float:  # a plain function: LambdaLR then saves no lambda state
        if step < warmup:
            return (step + 1) / warmup
        frac = (step - warmup) / max(total - warmup, 1)
        return {"constant": 1.0, "linear": 1.0 - frac, "cosine": 0.5 * (1 + math.cos(math.pi * frac))}[schedule]
    return factor


def build_main(looped, groups: list[str], recipe) -> tuple[torch.optim.Optimizer, list[list[str]]]:
    """The main optimizer: every trained group but the halting head, at the recipe's [optim], W_p's group checked."""
    opt, names = make_optimizer(looped, [g for g in groups if g != "halting"], recipe.optim)
    check_prelude_group(opt, looped, recipe.optim.lr, recipe.optim.prelude_lr_mult)
    return opt, names


def main_schedule(recipe, steps: int):
    """[optim]'s warm-up and schedule over the steps of every stage the main optimizer steps."""
    return lr_factor(recipe.optim.warmup_steps, steps, recipe.optim.schedule)


def main_clip(recipe) -> float:
    return recipe.optim.grad_clip


MAIN = Optimizer("main", build_main, main_schedule, main_clip)   # the optimizer of every kind but the halting stage
