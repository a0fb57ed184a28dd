"""The gradient audit of a retrofit: per-loop gradient RMS by parameter group and a finite-difference check."""

from __future__ import annotations

import copy

import pandas as pd
import torch

from workbench.loop.surgery import parameter_groups
from workbench.train.losses import chain_loss, loop_nll, make_batch


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
        batch = make_batch(batch, tokenizer, device=next(looped.parameters()).device)
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
    # drawn on the host (the same direction on every device), then moved to the parameters
    direction = [torch.randn(p.shape, generator=gen, dtype=dtype).to(p.device) for p in params]
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
