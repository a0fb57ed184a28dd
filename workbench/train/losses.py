"""Training losses: what one step of the retrofit minimises.

- Per-loop cross-entropy over the task's candidate symbols at the answer position, read
  through `looped.read(..., candidates=...)` (the evaluation reader's path), loops past a
  row's depth masked, intermediate loops weighted (the outcome-only anneal ramps that to 0).
- RecurTrace's answer loss at a sampled depth, and the halting stage's objectives.
- The preservation KL to the frozen base at loop 1 (the adapter switched off, or a frozen copy).
"""

from __future__ import annotations

import contextlib
import math

import numpy as np
import torch
import torch.nn.functional as F
from peft.tuners.lora import LoraLayer

from workbench.errors import WorkbenchError
from workbench.loop.halting import oracle_labels
from workbench.tasks.reader import answer_batch, answer_logprobs, encode_prompts, reads_symbol, row_candidates
from workbench.train.recipe import HaltingTable, SamplerTable


# ----------------------------------------------------------------------------- batches and losses
def _upcast(x: torch.Tensor) -> torch.Tensor:
    """Losses in at least fp32 (fp64 stays fp64: the finite-difference check needs it)."""
    return x if x.dtype == torch.float64 else x.float()


def make_batch(rows: list[dict], tokenizer, chain_weight: float = 1.0, device="cpu",
               park_loops: int | None = None, loops: int | None = None, park_depths=None) -> dict:
    """Returns the tensors a training step needs for chase or p-hop rows (single-token symbols).

    Keys: input_ids, attention_mask [B, S] (left padded); candidates [B, N] token ids of the
    row's symbols; targets [B, T] index of x_t among the symbols (T = max depth; -1 past d);
    weights [B, T] (chain_weight for t < d, 1 at t = d, 0 past d); answer_ids [B]; depths [B].
    `loops` widens T past the deepest row (masked loops: the loss is unchanged), so every rank's
    shard of a global batch runs the same number of loops (an FSDP2-sharded Coda's collectives).

    `park_loops` = T (at least the deepest row's d) makes it a *park* batch: every loop t in d..T
    targets the answer x_d with weight 1 (the answer loss only at loops T >= d), loops t < d keep
    x_t at `chain_weight`; a model trained on it holds the answer once it is reached. With `park_depths`
    only rows of those depths park; the others iterate past d (loop t targets x_t, the row's table applied
    t times, weight 1): a depth mix on which no single loop count reads every row's answer.

    Rows with multi-token answers (state tracking, arithmetic) get the reader's teacher-forced
    answer batch instead (`workbench.tasks.reader.answer_batch`: input_ids, attention_mask,
    positions, targets, valid [B, K]) plus depths and `answer_tokens` = True.
    """
    if not all(reads_symbol(r) for r in rows):
        out = {**answer_batch(tokenizer, rows), "depths": torch.tensor([r["depth"] for r in rows])}
        return {**{k: v.to(device) for k, v in out.items()}, "answer_tokens": True}
    enc = encode_prompts(tokenizer, [r["prompt"] for r in rows])
    T = max([r["depth"] for r in rows] + [loops or 0])
    if park_loops is not None:
        if park_loops < T:
            raise WorkbenchError(f"make_batch: park_loops = {park_loops} is below the deepest row's depth {T}")
        T = park_loops
    targets = torch.full((len(rows), T), -1, dtype=torch.long)
    weights = torch.zeros(len(rows), T)
    for i, r in enumerate(rows):
        d = r["depth"]
        targets[i, :d] = torch.tensor([r["symbols"].index(x) for x in r["chain"]])
        weights[i, : d - 1] = chain_weight
        weights[i, d - 1] = 1.0
        if park_loops is not None and (park_depths is None or d in park_depths):
            targets[i, d:] = targets[i, d - 1]
            weights[i, d:] = 1.0
        elif park_loops is not None and T > d:
            targets[i, d:] = torch.tensor([r["symbols"].index(x) for x in iterate_past(r, T)])
            weights[i, d:] = 1.0
    cands = row_candidates(tokenizer, rows)
    rows_idx = torch.arange(len(rows))
    answers = cands[rows_idx, targets[rows_idx, torch.tensor([r["depth"] - 1 for r in rows])]]  # x_d
    out = dict(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], candidates=cands,
               targets=targets, weights=weights, answer_ids=answers,
               depths=torch.tensor([r["depth"] for r in rows]))
    return {k: v.to(device) for k, v in out.items()}


def iterate_past(row: dict, loops: int) -> list[str]:
    """x_{d+1} .. x_loops of a chase row: its function table applied past the row's depth."""
    if "table" not in row:
        raise WorkbenchError(f"{row.get('row_id')}: iterating past its depth needs the row's function table "
                             "(chase rows carry one); give it park_depths covering every depth")
    x, out = row["chain"][-1], []
    for _ in range(row["depth"], loops):
        x = row["table"][x]
        out.append(x)
    return out


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
    """Language-model loss of the answer at loop `loops`, full vocabulary (RecurTrace Stage 1).

    One token for symbol rows; for multi-token answers the summed loss of every answer token
    (teacher forced, the end of line included), divided by the rows.
    """
    logits = looped(batch["input_ids"], attention_mask=batch["attention_mask"], loops=loops).logits
    if batch.get("answer_tokens"):
        at = batch["positions"].unsqueeze(-1).expand(-1, -1, logits.shape[-1])
        nll = F.cross_entropy(_upcast(logits.gather(1, at)).transpose(1, 2), batch["targets"], reduction="none")
        return (nll * batch["valid"]).sum() / (len(nll) if denominator is None else denominator)
    nll = F.cross_entropy(_upcast(logits[:, -1]), batch["answer_ids"], reduction="sum")
    return nll / (len(batch["answer_ids"]) if denominator is None else denominator)


def answer_losses(looped, batch: dict, loops: int):
    """(per-loop answer loss [B, T] (detached), the readout) from one read to `loops` (the halting stage's oracle)."""
    if batch.get("answer_tokens"):
        r = looped.read(batch["input_ids"], attention_mask=batch["attention_mask"], loops=loops,
                        positions=batch["positions"])
        with torch.no_grad():
            return -answer_logprobs(r.scores, batch["targets"], batch["valid"])[0], r
    r = looped.read(batch["input_ids"], attention_mask=batch["attention_mask"], loops=loops)
    with torch.no_grad():
        logits = r.scores[:, :, -1, :].float()                               # [B, T, V]
        return F.cross_entropy(logits.transpose(1, 2), batch["answer_ids"].unsqueeze(1).expand(-1, loops),
                               reduction="none"), r


def park_loop_count(deepest: int, max_loops: int, seed: int) -> int:
    """The loop count T of one park step: uniform on deepest..max_loops (hashed seed, the same on every rank)."""
    if not 1 <= deepest <= max_loops:
        raise WorkbenchError(f"park_loop_count: the deepest row's depth {deepest} must lie in 1..{max_loops}")
    return int(np.random.default_rng(seed).integers(deepest, max_loops + 1))


_SAMPLER = SamplerTable()   # the sampler's defaults, declared once: the recipe's [sampler]


def sample_loop_counts(n: int, mean: float = _SAMPLER.mean, sigma: float = _SAMPLER.sigma,
                       max_loops: int = _SAMPLER.max, seed: int = 0) -> np.ndarray:
    """Returns n loop counts from RecurTrace App. D's clamped log-normal Poisson.

    z ~ N(log r̄ - σ²/2, σ) with r̄ = mean - 1; r = Poisson(e^z) + 1, clamped to [1, max_loops].
    """
    rng = np.random.default_rng(seed)
    rbar = mean - 1.0
    z = rng.normal(math.log(rbar) - sigma ** 2 / 2, sigma, size=n)
    return np.clip(rng.poisson(np.exp(z)) + 1, 1, max_loops)


def halting_loss(looped, batch: dict, cfg: HaltingTable, denominator: float | None = None) -> tuple[torch.Tensor, dict]:
    """The halting stage's loss (RecurTrace's Stage 2) for the halting head from one forward to `oracle_max` loops.

    Per-depth answer losses L_1..L_T (detached) give oracle labels (`workbench.loop.halting.oracle_labels`);
    `oracle` distils them with BCE at the probe depths; `act` / `pondernet` form the halting
    distribution q_t = p_1..p_{t-1}(1 - p_t) and pay |t - t*| (t* the oracle depth) plus an
    expected-depth cost (ACT) or a KL to a geometric prior (PonderNet).
    """
    losses, r = answer_losses(looped, batch, cfg.oracle_max)             # [B, T]
    return halting_objective(losses, r.halt_probs, cfg, denominator)


def halting_objective(losses: torch.Tensor, probs: torch.Tensor, cfg: HaltingTable,
                      denominator: float | None = None) -> tuple[torch.Tensor, dict]:
    """The halting stage's objective of `halting_loss` from per-depth answer losses [B, T] and continue probs [B, T]."""
    T = losses.shape[1]
    labels = oracle_labels(losses, margin=cfg.margin, depth_cost=cfg.depth_cost)
    p = probs.float().clamp(1e-6, 1 - 1e-6)                                 # continue probs [B, T]
    denom = len(p) if denominator is None else denominator
    if cfg.objective == "oracle":
        cols = [t - 1 for t in cfg.probe_depths if t <= T]
        bce = F.binary_cross_entropy(p[:, cols], labels[:, cols], reduction="none").mean(1)
        return bce.sum() / denom, {"continue_rate": float(labels[:, cols].mean())}
    survive = torch.cumprod(torch.cat([torch.ones_like(p[:, :1]), p[:, :-1]], 1), 1)
    q = survive * (1 - p)
    q = torch.cat([q[:, :-1], survive[:, -1:]], 1)                           # the budget absorbs the rest
    depths = torch.arange(1, T + 1, dtype=q.dtype, device=q.device)
    target = (labels < 0.5).float().argmax(1) + 1                          # first depth with no gain ahead
    quality = (q * (depths - target.unsqueeze(1)).abs()).sum(1)
    if cfg.objective == "act":
        extra = cfg.act_cost * (q * depths).sum(1)
    else:
        lam = cfg.ponder_lambda
        prior = lam * (1 - lam) ** (depths - 1)
        prior = prior / prior.sum()
        extra = cfg.ponder_kl * (q * (q.clamp(min=1e-9).log() - prior.log())).sum(1)
    return (quality + extra).sum() / denom, {"mean_target": float(target.float().mean())}


def halting_probs(looped, z: torch.Tensor) -> torch.Tensor:
    """Continue probabilities [B, T] of the model's head on pooled states z [B, T, d] (`oracle_sweep.sweep`)."""
    proj = looped.halting.proj
    return torch.sigmoid(proj(z.to(proj.weight.dtype)).squeeze(-1))


# ----------------------------------------------------------------------------- preservation
@contextlib.contextmanager
def adapter_disabled(looped):
    """Runs the retrofit with its LoRA adapter switched off: loop 1 is then the frozen base exactly.

    The teacher of the preservation KL costs no memory this way (the same modules, adapter off).
    """
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
