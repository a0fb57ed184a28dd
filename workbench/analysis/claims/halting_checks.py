"""What the halting rows lean on: the constant-depth envelope a stopping policy must beat, and what a Stage 2
head's own training record says of it (live gradients, movement from its initialisation)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from workbench.analysis.claims.ledger import Missing


def constant_envelope(acc_by_k: dict[int, float], loops: float) -> tuple[float, str]:
    """The best accuracy a constant-depth policy reaches with at most `loops` mean loops, and which policy.

    A constant policy stops every row at one loop k; mixing two of them (a share of rows at k1, the rest at k2)
    reaches any mean in between, so the bar at a head's mean loops m is the upper envelope of the fixed-depth
    curve at m: the best of every k <= m and of every mix k1 <= m <= k2 with mean exactly m.
    """
    best, label, _ = envelope_mix(acc_by_k, loops)
    return best, label


def envelope_mix(acc_by_k: dict[int, float], loops: float) -> tuple[float, str, dict[int, float]]:
    """`constant_envelope` with the policy's mix {k: share of rows stopped at k}."""
    ks = sorted(acc_by_k)
    best, label, mix = -math.inf, "none", {}
    for k in ks:
        if k <= loops + 1e-12 and acc_by_k[k] > best:
            best, label, mix = acc_by_k[k], f"k = {k}", {k: 1.0}
    for k1 in ks:
        for k2 in ks:
            if k1 < loops < k2:
                w = (loops - k1) / (k2 - k1)
                v = (1 - w) * acc_by_k[k1] + w * acc_by_k[k2]
                if v > best + 1e-12:
                    best, label, mix = v, f"k = {k1} / {k2} mixed {1 - w:.0%} / {w:.0%}", {k1: 1 - w, k2: w}
    return best, label, mix


def _envelope_interval(a: pd.Series, fixed_rows: pd.DataFrame, mix: dict[int, float]) -> tuple[float, float, float]:
    """Head minus the constant-depth envelope policy, row by row (the policy's expected correctness on each row:
    its mix of fixed depths), with a normal 95% interval over rows: (mean, low, high)."""
    env = sum(w * fixed_rows[k] for k, w in mix.items())
    d = a.astype(float).to_numpy() - env.to_numpy()
    se = float(d.std(ddof=1) / math.sqrt(len(d))) if len(d) > 1 else math.inf
    return float(d.mean()), float(d.mean() - 1.96 * se), float(d.mean() + 1.96 * se)


MOVED = 0.1   # a head has trained when its summed per-step movement reaches this share of its initial RMS


def head_moved(run: Path) -> tuple[bool, str]:
    """Whether a Stage 2 head moved from its initialisation: the sum over steps of its logged per-step movement
    (move_rms, metrics.jsonl) against the RMS its projection starts at (torch's default Linear initialisation,
    uniform in +-1/sqrt(fan_in): RMS 1/sqrt(3 fan_in), fan_in from the tensor shapes in retrofit.json). Read
    from the run's records alone, so it holds where the tensors are not shipped (an installed wheel)."""
    for name in ("metrics.jsonl", "retrofit.json"):
        if not (run / name).is_file():
            raise Missing(f"{run} has no {name} to read its head's movement from")
    steps = [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r.get("kind") == "train"]
    moved = sum(float(r.get("move_rms", {}).get("halting", 0.0)) for r in steps)
    shape = json.loads((run / "retrofit.json").read_text()).get("tensors", {}).get("halting.proj.weight")
    if not shape:
        raise Missing(f"{run}/retrofit.json records no halting.proj.weight")
    rms = 1.0 / math.sqrt(3 * shape[-1])
    return moved >= MOVED * rms, f"moved {moved:.2g} in all against its initialisation's RMS {rms:.2g}"



VANISHED = 1e-6   # a head's gradient is gone when its last steps' median norm is under this share of its first


def gradients_alive(run: Path, last: int = 20) -> tuple[bool, str]:
    """Whether a Stage 2 run's gradients stayed alive: the median gradient norm of its last `last` training steps
    against its first step's (metrics.jsonl), alive above `VANISHED` of it."""
    path = run / "metrics.jsonl"
    if not path.is_file():
        raise Missing(f"{run} has no metrics.jsonl to read its gradients from")
    steps = [r for r in map(json.loads, path.read_text().splitlines()) if r.get("kind") == "train"]
    if len(steps) < 2:
        raise Missing(f"{run}'s metrics.jsonl records fewer than two training steps")
    first = float(steps[0]["grad_norm"])
    tail = sorted(float(r["grad_norm"]) for r in steps[-last:])
    med = tail[len(tail) // 2]
    alive = first > 0 and med > VANISHED * first
    return alive, f"gradient norm {first:.3g} at step 1, median {med:.2g} over the last {len(tail)} steps"
