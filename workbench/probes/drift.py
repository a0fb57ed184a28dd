"""Subspace drift (retrofit paper Sec. 12): how the loop states' principal subspace moves with the loop index.

States h_t are pooled per loop over the rows' real positions ("all", subsampled to
`max_samples` with `seed`) or their read positions ("read"), from one forward per row batch.

(a) Principal angles between the top-`k` PCA subspaces of consecutive loops (t-1, t) and of
    loop t against loop 1.
(b) The concentration test: the residual of loop t's states outside loop 1's PCA envelope
    (centred on loop 1's mean, minus the projection onto loop 1's top-k components); its
    energy share in each attention head's output subspace (orthonormal basis by QR of the
    head's column block of the last block layer's o_proj); the top-3 share against the same
    statistic for random orthogonal partitions of R^d into subspaces of the heads' size
    (95th percentile and mean over `n_null` draws). Head subspaces of a real o_proj overlap,
    so energies are normalised to shares that sum to 1.

Tables:
    drift: loop, comparison ("consecutive" | "vs_loop1"), angle_index (0 = smallest), angle_deg
    drift__concentration: loop, top3_share, null_p95, null_mean, residual_frac
    drift__heads: loop, layer, head, share
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import pandas as pd
import torch
from scipy.linalg import subspace_angles
from threadpoolctl import threadpool_limits
from tqdm.auto import tqdm

from workbench.analysis.headlines.drift import headline
from workbench.devices import device_of
from workbench.errors import WorkbenchError
from workbench.loop.hooks import hook_name
from workbench.loop.positions import last_real_token
from workbench.probes.common import batches, check_loops, default_loops
from workbench.probes.options import Count, probe_options
from workbench.probes.spec import ProbeSpec

POSITIONS = ("all", "read")


def run(model, tokenizer, rows: list[dict], loops: int | None = None, k: int = 8, positions: str = "all",
        max_samples: int = 4096, layer: int | None = None, n_null: int = 100, batch_size: int = 16,
        seed: int = 0, progress: bool = False) -> dict[str, pd.DataFrame]:
    """Returns {"drift", "drift__concentration", "drift__heads"} (see the module docstring).

    Args:
        loops: T (default the rows' max depth, at least 2; `common.default_loops` when a row gives none).
        k: PCA components per loop.
        positions: "all" real positions or the "read" position of each row.
        layer: the block layer whose o_proj defines the head subspaces (default the last).
        n_null: random orthogonal partitions.
    """
    if positions not in POSITIONS:
        raise WorkbenchError(f"drift positions '{positions}' is unknown; accepted: {', '.join(POSITIONS)}")
    layer = model.b - 1 if layer is None else int(layer)
    if not model.a <= layer < model.b:
        raise WorkbenchError(f"drift layer {layer} is not a block layer; accepted: {model.a}..{model.b - 1}")
    T = check_loops(model, loops or default_loops(model, rows, at_least=2))
    states = collect_states(model, tokenizer, rows, T, positions, max_samples, batch_size, seed, progress)
    if min(len(s) for s in states) <= k:
        raise WorkbenchError(f"drift needs more than k={k} pooled states per loop, got {min(len(s) for s in states)}")
    bases = head_bases(model, layer)
    with threadpool_limits(1):  # hundreds of mid-sized products: extra BLAS threads only spin-wait
        conc, heads = concentration_test(states, bases, k, n_null, seed)
    return {"drift": principal_angles(states, k), "drift__concentration": conc,
            "drift__heads": heads.assign(layer=layer)[["loop", "layer", "head", "share"]]}


@torch.no_grad()
def collect_states(model, tokenizer, rows, T, positions, max_samples, batch_size, seed, progress) -> list[np.ndarray]:
    """Returns the pooled states of loops 1..T, each float64 [N, D] (the same samples at every loop)."""
    device = device_of(model)
    pooled: list[list[np.ndarray]] = [[] for _ in range(T)]
    for idx, enc in tqdm(list(batches(tokenizer, rows, batch_size, device)), disable=not progress, desc="drift"):
        mask = enc["attention_mask"].bool()
        if positions == "read":
            keep = torch.zeros_like(mask)
            keep[torch.arange(len(idx)), last_real_token(mask)] = True
            mask = keep

        def grab(t):
            def hook(x, hook):
                pooled[t - 1].append(x[mask].double().cpu().numpy())
            return hook

        with model.hooks(fwd_hooks=[(hook_name("state", t), grab(t)) for t in range(1, T + 1)]):
            model(enc["input_ids"], attention_mask=enc["attention_mask"], loops=T)
    states = [np.concatenate(p) for p in pooled]
    if len(states[0]) > max_samples:
        pick = np.sort(np.random.default_rng(seed).choice(len(states[0]), max_samples, replace=False))
        states = [s[pick] for s in states]
    return states


def pca_basis(X: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Returns (mean [D], top-k principal directions [D, k]) of the rows of X."""
    mean = X.mean(0)
    _, _, vt = np.linalg.svd(X - mean, full_matrices=False)
    return mean, vt[:k].T


def principal_angles(states: list[np.ndarray], k: int) -> pd.DataFrame:
    """Returns loop, comparison, angle_index, angle_deg for loops 2..T."""
    bases = [pca_basis(X, k)[1] for X in states]
    records = []
    for t in range(2, len(states) + 1):
        for comparison, ref in (("consecutive", t - 1), ("vs_loop1", 1)):
            angles = np.sort(np.degrees(subspace_angles(bases[t - 1], bases[ref - 1])))
            records += [(t, comparison, i, float(a)) for i, a in enumerate(angles)]
    return pd.DataFrame.from_records(records, columns=["loop", "comparison", "angle_index", "angle_deg"])


@torch.no_grad()
def head_bases(model, layer: int) -> list[np.ndarray]:
    """Orthonormal bases [D, head_dim] of each head's output subspace: QR of o_proj's column blocks.

    The effective weight is read by applying o_proj to the identity (so a LoRA delta is included).
    """
    cfg = model.config
    attn = model.layers[layer].self_attn
    n_heads = getattr(attn, "num_heads", None) or cfg.num_attention_heads   # per layer where layer kinds differ
    head_dim = getattr(attn, "head_dim", None) or getattr(cfg, "head_dim", None) or cfg.hidden_size // n_heads
    o_proj = getattr(attn.o_proj, "linear", attn.o_proj)  # a gated output projection (Inkling): its linear map
    p = next(o_proj.parameters())
    eye = torch.eye(n_heads * head_dim, dtype=p.dtype, device=p.device)
    W = (o_proj(eye) - o_proj(torch.zeros_like(eye[:1]))).T.double().cpu().numpy()  # [D, H*dh]
    return [np.linalg.qr(W[:, h * head_dim:(h + 1) * head_dim])[0] for h in range(n_heads)]


def energy_shares(cov: np.ndarray, bases: list[np.ndarray]) -> np.ndarray:
    """Shares of trace(Q_h^T C Q_h) over the subspaces, summing to 1."""
    Q = np.concatenate(bases, axis=1)                                        # [D, sum of sizes]
    per_column = np.sum((cov @ Q) * Q, axis=0)
    edges = np.cumsum([0] + [b.shape[1] for b in bases])
    e = np.array([per_column[a:b].sum() for a, b in zip(edges[:-1], edges[1:])])
    return e / e.sum() if e.sum() > 0 else e


def random_partition(D: int, head_dim: int, n_heads: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Random orthonormal bases of n_heads subspaces of size head_dim: a random orthogonal basis cut in
    blocks when they fit in R^D, else independent random subspaces."""
    if head_dim * n_heads <= D:
        q, r = np.linalg.qr(rng.standard_normal((D, head_dim * n_heads)))
        q = q * np.sign(np.diag(r))
        return [q[:, h * head_dim:(h + 1) * head_dim] for h in range(n_heads)]
    return [np.linalg.qr(rng.standard_normal((D, head_dim)))[0] for _ in range(n_heads)]


def top3(shares: np.ndarray) -> float:
    """Sum of the three largest shares."""
    return float(np.sort(shares)[::-1][:3].sum())


def concentration_test(states: list[np.ndarray], bases: list[np.ndarray], k: int, n_null: int,
                       seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Returns (loop, top3_share, null_p95, null_mean, residual_frac) and (loop, head, share) for loops 2..T."""
    rng = np.random.default_rng(seed)
    mean1, U1 = pca_basis(states[0], k)
    D, head_dim = bases[0].shape
    covs, conc, heads = {}, [], []
    for t in range(2, len(states) + 1):
        X = states[t - 1] - mean1
        R = X - (X @ U1) @ U1.T
        covs[t] = (R.T @ R, float((R ** 2).sum() / max((X ** 2).sum(), 1e-30)))
    null = np.full((n_null, len(covs)), np.nan)
    for n in range(n_null):  # one partition per draw, shared by every loop
        q = random_partition(D, head_dim, len(bases), rng)
        null[n] = [top3(energy_shares(cov, q)) for cov, _ in covs.values()]
    for j, (t, (cov, residual_frac)) in enumerate(covs.items()):
        shares = energy_shares(cov, bases)
        column = null[:, j] if n_null else np.array([np.nan])
        conc.append((t, top3(shares), float(np.percentile(column, 95)), float(column.mean()), residual_frac))
        heads += [(t, h, float(s)) for h, s in enumerate(shares)]
    return (pd.DataFrame.from_records(conc, columns=["loop", "top3_share", "null_p95", "null_mean", "residual_frac"]),
            pd.DataFrame.from_records(heads, columns=["loop", "head", "share"]))


def summarize(tables: dict[str, pd.DataFrame]) -> dict:
    """Headline numbers: mean principal angle per loop (consecutive, vs loop 1) and the concentration test."""
    angles = tables["drift"].groupby(["comparison", "loop"])["angle_deg"].agg(["mean", "max"])
    out = {c: {str(int(t)): {"mean_deg": round(float(r["mean"]), 2), "max_deg": round(float(r["max"]), 2)}
               for (cc, t), r in angles.iterrows() if cc == c} for c in ("consecutive", "vs_loop1")}
    out["concentration"] = {str(int(r.loop)): {"top3_share": round(r.top3_share, 4), "null_p95": round(r.null_p95, 4),
                                               "above_null": bool(r.top3_share > r.null_p95),
                                               "residual_frac": round(r.residual_frac, 4)}
                            for r in tables["drift__concentration"].itertuples()}
    return {**out, "headline": headline(tables).to_dict()}


@probe_options
class Options:
    """The drift probe's options (`run`'s keywords), checked before any probe of a battery runs."""

    loops: int | None = None
    k: int = 8
    positions: Literal[POSITIONS] = "all"
    max_samples: int = 4096
    layer: int | None = None
    n_null: int = 100
    batch_size: Count = 16
    seed: int = 0
    progress: bool = False


SPEC = ProbeSpec(
    name="drift", parts=("concentration", "heads"), run=run, summarize=summarize,
    needs=("prompt",),
    options=Options,
)
