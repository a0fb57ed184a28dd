"""The per-pass read the loop-dynamics probes share: everything they need from one forward per row batch.

`read_passes` runs `model.read` once per batch to T loops and catches, on hook points, what each
pass leaves at the read position (the last real token): the candidate scores, the state h_t, the
Coda readout vector (`loop.{t}.hook_readout`), each asked block layer's residual
(`loop.{t}.block.{i}.hook_resid_post`), the read position's attention row of every head
(`loop.{t}.block.{i}.attn.hook_pattern`, reduced to the divergence between consecutive passes
inside the batch so the patterns are never kept), and the continue probabilities of the model's
halting head and of any extra heads. Nothing is rerun per pass (`lens_agreement`, `dynamics` and
`exit_rules` read it; see docs/analyses.md).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch
from tqdm.auto import tqdm

from workbench.devices import device_of
from workbench.loop.hooks import hook_name
from workbench.loop.positions import last_real_token
from workbench.probes.common import _extra_heads, batches, row_candidates, shared_candidates


@dataclass
class Passes:
    """What `read_passes` returns; every array is over the rows in their given order, loop 1 first.

    scores [R, T, C] candidate scores (the model's own read); states [R, T, D] h_t; readouts
    [R, T, D] the Coda readout vectors (when asked); layers {layer: [R, T, D]}; pattern_js
    {layer: [R, T-1, H]} Jensen-Shannon divergence (nats) between passes t and t+1 of each head's
    read-position attention row (when asked); halt_probs {head name: [R, T]} ("head" is the
    model's own); wall_s the seconds the reads took.
    """

    scores: np.ndarray
    states: np.ndarray
    readouts: np.ndarray | None = None
    layers: dict[int, np.ndarray] = field(default_factory=dict)
    pattern_js: dict[int, np.ndarray] = field(default_factory=dict)
    halt_probs: dict[str, np.ndarray] = field(default_factory=dict)
    wall_s: float = 0.0


def js_divergence(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Jensen-Shannon divergence in nats over the last dimension (0 <= JS <= ln 2); inputs are distributions."""
    p, q = p.double(), q.double()
    m = 0.5 * (p + q)

    def kl(a, b):
        return torch.where(a > 0, a * (a.clamp_min(1e-300).log() - b.clamp_min(1e-300).log()), 0.0).sum(-1)

    return (0.5 * kl(p, m) + 0.5 * kl(q, m)).clamp_min(0.0)


@torch.no_grad()
def read_passes(model, tokenizer, rows: list[dict], loops: int, batch_size: int = 16, progress: bool = False,
                readout: bool = False, layers=(), patterns: bool = False, heads: dict | None = None,
                desc: str = "passes") -> Passes:
    """Returns a `Passes` from one `model.read` per row batch to `loops` (see the module docstring).

    Args:
        readout: catch the Coda readout vector of every pass.
        layers: block layers (absolute indices) whose read-position residual to catch.
        patterns: reduce the read-position attention rows of `layers` to consecutive-pass divergences.
        heads: {name: HaltingHead} read on every pass's state beside the model's own head.
    """
    T, R = loops, len(rows)
    device = device_of(model)
    layers = [int(i) for i in layers]
    out: dict = {"scores": None, "states": None, "readouts": None}
    caught_layers: dict[int, np.ndarray] = {}
    js: dict[int, np.ndarray] = {}
    halts: dict[str, np.ndarray] = {}
    readouts = {hook_name("readout", t) for t in range(1, T + 1)}  # [B, P, D]: the last read position is ours
    start = time.perf_counter()
    for idx, enc in tqdm(list(batches(tokenizer, rows, batch_size, device)), disable=not progress, desc=desc):
        mask = enc["attention_mask"]
        read_pos = last_real_token(mask)
        batch = torch.arange(len(idx), device=mask.device)
        got: dict[str, torch.Tensor] = {}

        def at_read(x, hook):  # [B, S, D] residuals and [B, P, D] readouts
            got[hook.name] = (x[:, -1] if hook.name in readouts else x[batch, read_pos]).double().cpu()

        def pattern_row(x, hook):  # [B, H, q, k] -> the read position's row, [B, H, k]
            got[hook.name] = x[batch, :, read_pos, :].double().cpu()

        fwd = [(hook_name("readout", t), at_read) for t in range(1, T + 1)] if readout else []
        fwd += [(hook_name("block_resid", t, i), at_read) for t in range(1, T + 1) for i in layers]
        if patterns:
            fwd += [(hook_name("pattern", t, i), pattern_row) for t in range(1, T + 1) for i in layers]
        cands = shared_candidates(row_candidates(tokenizer, [rows[i] for i in idx]).to(device))
        with _extra_heads(model, heads or {}, mask, T) as seen, model.hooks(fwd_hooks=fwd):
            r = model.read(enc["input_ids"], attention_mask=mask, loops=T, candidates=cands, return_states=True)
        scores = r.scores[:, :, -1].double().cpu().numpy()
        states = r.states[:, :, -1].double().cpu().numpy()
        if out["scores"] is None:
            out["scores"] = np.zeros((R, T, scores.shape[-1]))
            out["states"] = np.zeros((R, T, states.shape[-1]))
        out["scores"][idx], out["states"][idx] = scores, states
        if readout:
            if out["readouts"] is None:
                out["readouts"] = np.zeros((R, T, states.shape[-1]))
            out["readouts"][idx] = torch.stack([got[hook_name("readout", t)] for t in range(1, T + 1)], 1).numpy()
        for i in layers:
            v = torch.stack([got[hook_name("block_resid", t, i)] for t in range(1, T + 1)], 1).numpy()
            caught_layers.setdefault(i, np.zeros((R, T, v.shape[-1])))[idx] = v
            if patterns:
                rows_ = [got[hook_name("pattern", t, i)] for t in range(1, T + 1)]
                d = torch.stack([js_divergence(rows_[t], rows_[t + 1]) for t in range(T - 1)], 1).numpy()
                js.setdefault(i, np.zeros((R, T - 1, d.shape[-1])))[idx] = d
        own = {"head": r.halt_probs} if getattr(r, "halt_probs", None) is not None else {}
        for name, p in {**own, **seen}.items():
            halts.setdefault(name, np.zeros((R, T)))[idx] = p.double().cpu().numpy()
    return Passes(out["scores"], out["states"], out["readouts"], caught_layers, js, halts,
                  time.perf_counter() - start)
