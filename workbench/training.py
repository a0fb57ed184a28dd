"""Training the retrofit: losses, optimizer groups and their safeguards, audits, and `train`.

- Losses: per-loop cross-entropy over the task's candidate symbols at the answer position,
  read through `looped.read(..., candidates=...)` (the evaluation reader's path), loops past a
  row's depth masked, intermediate loops weighted (the outcome-only anneal ramps that to 0);
  RecurTrace's answer loss at a sampled depth; the Stage 2 halting objectives.
- Safeguards (retrofit paper Sec. 5.1, App. A.2): W_p alone in a `prelude_proj` AdamW group at
  lr x multiplier, asserted at start; a multiplier the optimizer cannot honour is refused;
  re-entry liveness; realized movement (RMS of the parameter change) per group.
- `gradient_audit`: per-loop gradient RMS by parameter group and a finite-difference check.

The step loop, checkpoints and the run directory live in `workbench.trainer` and
`workbench.runs`; `load_run` is re-exported here as the counterpart of `train`.
"""

from __future__ import annotations

import contextlib
import copy
import math
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from workbench.errors import WorkbenchError
from workbench.runs import load_run  # noqa: F401  (re-exported: the counterpart of train)
from workbench.surgery import parameter_groups

PRELUDE_PROJ = "reentry.prelude_proj.weight"


# ----------------------------------------------------------------------------- batches and losses
def _upcast(x: torch.Tensor) -> torch.Tensor:
    """Losses in at least fp32 (fp64 stays fp64: the finite-difference check needs it)."""
    return x if x.dtype == torch.float64 else x.float()


def make_batch(rows: list[dict], tokenizer, chain_weight: float = 1.0, device="cpu") -> dict:
    """Returns the tensors a training step needs for chase rows.

    Keys: input_ids, attention_mask [B, S] (left padded); candidates [B, N] token ids of the
    row's symbols; targets [B, T] index of x_t among the symbols (T = max depth; -1 past d);
    weights [B, T] (chain_weight for t < d, 1 at t = d, 0 past d); answer_ids [B]; depths [B].
    """
    from workbench.tasks.reader import candidate_ids, encode_prompts

    enc = encode_prompts(tokenizer, [r["prompt"] for r in rows])
    T = max(r["depth"] for r in rows)
    targets = torch.full((len(rows), T), -1, dtype=torch.long)
    weights = torch.zeros(len(rows), T)
    for i, r in enumerate(rows):
        d = r["depth"]
        targets[i, :d] = torch.tensor([r["symbols"].index(x) for x in r["chain"]])
        weights[i, : d - 1] = chain_weight
        weights[i, d - 1] = 1.0
    cands = torch.stack([candidate_ids(tokenizer, r["symbols"]) for r in rows])
    rows_idx = torch.arange(len(rows))
    answers = cands[rows_idx, targets[rows_idx, torch.tensor([r["depth"] - 1 for r in rows])]]  # x_d
    out = dict(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], candidates=cands,
               targets=targets, weights=weights, answer_ids=answers,
               depths=torch.tensor([r["depth"] for r in rows]))
    return {k: v.to(device) for k, v in out.items()}


def loop_nll(looped, batch: dict, loops: int | None = None) -> torch.Tensor:
    """Returns the per-row, per-loop cross-entropy over the candidate symbols, [B, T] (0 where masked)."""
    loops = loops or batch["targets"].shape[1]
    r = looped.read(batch["input_ids"], attention_mask=batch["attention_mask"], loops=loops,
                    candidates=batch["candidates"])
    logp = _upcast(r.scores[:, :, -1, :]).log_softmax(-1)                # [B, T, N]
    targets = batch["targets"][:, :loops]
    nll = -logp.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return nll * (targets >= 0)


def chain_loss(looped, batch: dict, denominator: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (weighted per-loop loss, mean nll per loop [T]) for a chain batch.

    The loss is sum(w_bt * nll_bt) / denominator (default sum of the weights), so shards of a
    global batch, each divided by the global weight sum, add up to the global loss.
    """
    nll = loop_nll(looped, batch)
    w = batch["weights"]
    denom = float(w.sum()) if denominator is None else denominator
    active = (batch["targets"] >= 0).sum(0).clamp(min=1)
    return (nll * w).sum() / denom, (nll.detach().sum(0) / active)


def answer_loss(looped, batch: dict, loops: int, denominator: float | None = None) -> torch.Tensor:
    """Language-model loss of the answer token at loop `loops`, full vocabulary (RecurTrace Stage 1)."""
    logits = looped(batch["input_ids"], attention_mask=batch["attention_mask"], loops=loops).logits[:, -1]
    nll = F.cross_entropy(_upcast(logits), batch["answer_ids"], reduction="sum")
    return nll / (len(batch["answer_ids"]) if denominator is None else denominator)


def sample_loop_counts(n: int, mean: float = 4.0, sigma: float = 0.5, max_loops: int = 8, seed: int = 0) -> np.ndarray:
    """Returns n loop counts from RecurTrace App. D's clamped log-normal Poisson.

    z ~ N(log r̄ - σ²/2, σ) with r̄ = mean - 1; r = Poisson(e^z) + 1, clamped to [1, max_loops].
    """
    rng = np.random.default_rng(seed)
    rbar = mean - 1.0
    z = rng.normal(math.log(rbar) - sigma ** 2 / 2, sigma, size=n)
    return np.clip(rng.poisson(np.exp(z)) + 1, 1, max_loops)


def halting_loss(looped, batch: dict, cfg: dict, denominator: float | None = None) -> tuple[torch.Tensor, dict]:
    """RecurTrace Stage 2 loss for the halting head from one forward to `oracle_max` loops.

    Per-depth answer losses L_1..L_T (detached) give oracle labels (`workbench.halting.oracle_labels`);
    `oracle` distils them with BCE at the probe depths; `act` / `pondernet` form the halting
    distribution q_t = p_1..p_{t-1}(1 - p_t) and pay |t - t*| (t* the oracle depth) plus an
    expected-depth cost (ACT) or a KL to a geometric prior (PonderNet).
    """
    from workbench.halting import oracle_labels

    T = cfg["oracle_max"]
    r = looped.read(batch["input_ids"], attention_mask=batch["attention_mask"], loops=T)
    logits = r.scores[:, :, -1, :].float()                                 # [B, T, V]
    with torch.no_grad():
        losses = F.cross_entropy(logits.transpose(1, 2), batch["answer_ids"].unsqueeze(1).expand(-1, T),
                                 reduction="none")                         # [B, T]
        labels = oracle_labels(losses, margin=cfg["margin"], depth_cost=cfg["depth_cost"])
    p = r.halt_probs.float().clamp(1e-6, 1 - 1e-6)                          # continue probs [B, T]
    denom = len(p) if denominator is None else denominator
    if cfg["objective"] == "oracle":
        cols = [t - 1 for t in cfg["probe_depths"] if t <= T]
        bce = F.binary_cross_entropy(p[:, cols], labels[:, cols], reduction="none").mean(1)
        return bce.sum() / denom, {"continue_rate": float(labels[:, cols].mean())}
    survive = torch.cumprod(torch.cat([torch.ones_like(p[:, :1]), p[:, :-1]], 1), 1)
    q = survive * (1 - p)
    q = torch.cat([q[:, :-1], survive[:, -1:]], 1)                           # the budget absorbs the rest
    depths = torch.arange(1, T + 1, dtype=q.dtype)
    target = (labels < 0.5).float().argmax(1) + 1                          # first depth with no gain ahead
    quality = (q * (depths - target.unsqueeze(1)).abs()).sum(1)
    if cfg["objective"] == "act":
        extra = cfg["act_cost"] * (q * depths).sum(1)
    else:
        lam = cfg["ponder_lambda"]
        prior = lam * (1 - lam) ** (depths - 1)
        prior = prior / prior.sum()
        extra = cfg["ponder_kl"] * (q * (q.clamp(min=1e-9).log() - prior.log())).sum(1)
    return (quality + extra).sum() / denom, {"mean_target": float(target.float().mean())}


# ----------------------------------------------------------------------------- preservation
@contextlib.contextmanager
def adapter_disabled(looped):
    """Runs the retrofit with its LoRA adapter switched off: loop 1 is then the frozen base exactly.

    The teacher of the preservation KL costs no memory this way (the same modules, adapter off).
    """
    from peft.tuners.lora import LoraLayer

    layers = [m for m in looped.modules() if isinstance(m, LoraLayer)]
    if not layers:
        raise WorkbenchError("adapter_disabled: this retrofit has no LoRA adapter to disable")
    for m in layers:
        m.enable_adapters(False)
    try:
        yield
    finally:
        for m in layers:
            m.enable_adapters(True)


def kl_to_base(looped, batch: dict, teacher) -> torch.Tensor:
    """Mean KL(base || model) of the next-token distribution at loop 1, over `batch["positions"]`.

    `teacher` is a context manager under which `looped` computes the frozen base (`adapter_disabled`),
    or a module with the same `read` (a frozen copy, for full-block runs). Full vocabulary, fp32
    log-softmax; only the asked positions are unembedded, so the cost is B x P rows of the head.
    """
    args = dict(attention_mask=batch["attention_mask"], loops=1, positions=batch["positions"])
    with torch.no_grad():
        if isinstance(teacher, torch.nn.Module):
            t_scores = teacher.read(batch["input_ids"], **args).scores
        else:
            with teacher():
                t_scores = looped.read(batch["input_ids"], **args).scores
    s_scores = looped.read(batch["input_ids"], **args).scores
    log_t = _upcast(t_scores[:, 0]).log_softmax(-1)                     # [B, P, V]
    log_s = _upcast(s_scores[:, 0]).log_softmax(-1)
    return (log_t.exp() * (log_t - log_s)).sum(-1).mean()


# ----------------------------------------------------------------------------- optimizer safeguards
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


def make_optimizer(looped, trainable: list[str], cfg: dict) -> torch.optim.Optimizer:
    """Returns the optimizer with one parameter group per trainable group, W_p at lr × prelude_lr_mult.

    Raises:
        WorkbenchError: a rate multiplier the optimizer cannot honour. Only AdamW's per-group
            rate is verified at the realized-update level (retrofit paper Sec. 5.1, App. E).
    """
    mult = cfg["prelude_lr_mult"]
    if cfg["name"] != "adamw" and mult != 1.0:
        raise WorkbenchError(f"optim.name = '{cfg['name']}' with optim.prelude_lr_mult = {mult}: only adamw honours "
                             "a per-group rate multiplier here; use adamw or set prelude_lr_mult = 1")
    groups, names = [], {}
    for g, params in optimizer_groups(looped, trainable):
        for n, p in params:
            p.requires_grad_(True)
            names[id(p)] = n
        lr = cfg["lr"] * (mult if g == "prelude_proj" else 1.0)
        wd = 0.0 if g == "prelude_proj" else cfg["weight_decay"]  # as the paper's Listing 3
        groups.append({"name": g, "params": [p for _, p in params], "lr": lr, "weight_decay": wd})
    if cfg["name"] == "adamw":
        opt = torch.optim.AdamW(groups, lr=cfg["lr"], betas=tuple(cfg["betas"]), eps=cfg["eps"], foreach=False)
    else:
        opt = torch.optim.SGD(groups, lr=cfg["lr"], momentum=cfg["momentum"], foreach=False)
    opt.param_names = names
    return opt


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


def liveness(looped) -> dict[str, float]:
    """Gradient RMS of the re-entry's live parameters (W_p, W_s, gate; or alpha)."""
    return {n: (0.0 if p.grad is None else float(p.grad.double().pow(2).mean().sqrt()))
            for n, p in looped.reentry.named_parameters() if n in ("prelude_proj.weight", "state_proj.weight",
                                                                    "gate", "alpha")}


# ----------------------------------------------------------------------------- evaluation
def evaluate(looped, tokenizer, rows: list[dict], batch_size: int = 16) -> tuple[dict, pd.DataFrame]:
    """Returns ({depth: {loop: active-label accuracy}} for t <= d, the reader's tidy frame)."""
    from workbench.tasks.reader import read_rows

    was_training = looped.training
    looped.eval()
    frames = []
    for depth in sorted({r["depth"] for r in rows}):  # each depth read to its own loop count only
        subset = [r for r in rows if r["depth"] == depth]
        frames.append(read_rows(looped, tokenizer, subset, loops=depth, batch_size=batch_size).frame())
    frame = pd.concat(frames, ignore_index=True)
    looped.train(was_training)
    active = frame[frame["loop"] <= frame["depth"]]
    acc = active.groupby(["depth", "loop"])["correct"].mean()
    matrix: dict[str, dict[str, float]] = {}
    for (d, t), v in acc.items():
        matrix.setdefault(str(d), {})[str(t)] = float(v)
    return matrix, frame


# ----------------------------------------------------------------------------- gradient audit
def _audit_groups(looped) -> dict[str, list[torch.nn.Parameter]]:
    named = parameter_groups(looped)
    groups = {f"reentry.{n.split('.')[1]}": [] for n, _ in named["reentry"]}
    for n, p in named["reentry"]:
        groups[f"reentry.{n.split('.')[1]}"].append(p)
    coda = tuple(f"base.model.layers.{i}." for i in range(looped.b, looped.n_layers))
    groups["block"] = [p for _, p in named["block"]]
    groups["lora"] = [p for _, p in named["lora"]]
    groups["memory"] = [p for _, p in named["memory"]]
    groups["coda"] = [p for n, p in named["base"] if n.startswith(coda)]
    return {k: v for k, v in groups.items() if v}


def gradient_audit(looped, batch, tokenizer=None, eps: float = 1e-3, seed: int = 0,
                   fd_dtype: torch.dtype = torch.float64) -> pd.DataFrame:
    """Returns the gradient-path audit of a retrofit on one batch, long format.

    Rows `check="loop_grad"`: for each loop t and parameter group (re-entry tensors, block,
    LoRA, memory, Coda), the RMS and zero fraction of d(loss at loop t)/d(params), where the
    loss at loop t is the mean cross-entropy of the rows with t <= d. Rows
    `check="finite_difference"`: the directional derivative of the whole chain loss along a
    random unit direction over the trainable parameters (the re-entry if none train), by
    autograd and by a central difference in `fd_dtype`, and their relative error (its floor is
    ~1e-4: HF eager attention takes its softmax in fp32 even in an fp64 copy).

    Args:
        looped: a LoopedLM (left unchanged: flags restored, the difference runs on a copy).
        batch: a dict from `make_batch`, or chase rows (then `tokenizer` is needed).
    """
    if isinstance(batch, list):
        batch = make_batch(batch, tokenizer)
    groups = _audit_groups(looped)
    flags = {p: p.requires_grad for p in looped.parameters()}
    trainable = [p for p in looped.parameters() if p.requires_grad] or list(looped.reentry.parameters())
    trainable_ids = [i for i, p in enumerate(looped.parameters()) if p in set(trainable)]
    records = []
    try:
        for ps in groups.values():
            for p in ps:
                p.requires_grad_(True)
        nll = loop_nll(looped, batch)
        active = batch["targets"] >= 0
        for t in range(nll.shape[1]):
            loss_t = nll[:, t].sum() / active[:, t].sum().clamp(min=1)
            for name, ps in groups.items():
                grads = torch.autograd.grad(loss_t, ps, retain_graph=True, allow_unused=True)
                g = torch.cat([(torch.zeros_like(p) if gr is None else gr).flatten() for p, gr in zip(ps, grads)])
                records += [("loop_grad", t + 1, name, "grad_rms", float(g.double().pow(2).mean().sqrt())),
                            ("loop_grad", t + 1, name, "zero_fraction", float((g == 0).double().mean()))]
    finally:
        for p, f in flags.items():
            p.requires_grad_(f)
    records += _finite_difference(looped, batch, trainable_ids, eps, seed, fd_dtype)
    return pd.DataFrame.from_records(records, columns=["check", "loop", "group", "metric", "value"])


def _finite_difference(looped, batch, ids: list[int], eps: float, seed: int, dtype) -> list[tuple]:
    model = copy.deepcopy(looped).to(dtype)
    model.eval()
    params = [p for i, p in enumerate(model.parameters()) if i in set(ids)]
    gen = torch.Generator().manual_seed(seed)
    direction = [torch.randn(p.shape, generator=gen, dtype=dtype) for p in params]
    norm = torch.sqrt(sum(d.pow(2).sum() for d in direction))
    direction = [d / norm for d in direction]
    for p in model.parameters():
        p.requires_grad_(False)
    for p in params:
        p.requires_grad_(True)
    loss = chain_loss(model, batch)[0]
    grads = torch.autograd.grad(loss, params)
    autograd = float(sum((g * d).sum() for g, d in zip(grads, direction)))
    with torch.no_grad():
        values = []
        for sign in (1, -1):
            for p, d in zip(params, direction):
                p.add_(sign * eps * d)
            values.append(float(chain_loss(model, batch)[0]))
            for p, d in zip(params, direction):
                p.sub_(sign * eps * d)
    fd = (values[0] - values[1]) / (2 * eps)
    rel = abs(fd - autograd) / max(abs(fd), abs(autograd), 1e-30)
    return [("finite_difference", 0, "trainable", "autograd", autograd),
            ("finite_difference", 0, "trainable", "finite_difference", fd),
            ("finite_difference", 0, "trainable", "rel_error", rel)]




def train(recipe_path, out=None, overrides=None, resume: bool = False, stop_after: int | None = None,
          progress: bool = True) -> dict:
    """Trains a recipe into a run directory; returns a summary dict.

    Args:
        recipe_path: a TOML recipe (see `workbench.recipes`).
        out: the run directory (default runs/<recipe name>).
        overrides: `key=value` strings (as `--set`) or a {dotted key: value} dict.
        resume: continue from the latest checkpoint in `out` (the recipe must match its recipe.toml).
        stop_after: stop after this global step, as if the process were stopped there (tests,
            time-boxed runs); the run directory is then resumable but not finished.
    Returns:
        {"run_dir", "steps", "finished", "before", "after", "wall_s"}: before / after are
        {depth: {loop: accuracy}} on the held-out rows (before is None when step 0 was not evaluated).
    """
    from workbench.recipes import load_recipe
    from workbench.trainer import Trainer

    recipe = load_recipe(recipe_path, overrides)
    run_dir = Path(out) if out is not None else Path("runs") / recipe["name"]
    return Trainer(recipe, run_dir, resume=resume, progress=progress,
                   recipe_dir=Path(recipe_path).resolve().parent).run(stop_after=stop_after)
