"""The halting stage's oracle sweep (`sweep`), kept on disk so that heads trained on one frozen model read one sweep.

The oracle sweep is each row's forward through every loop count 1..T of the frozen model: its per-loop losses (the
oracle's labels) and the head's pooled inputs. RecurTrace App. E computes it once, in one frozen forward over the
halting stage's rows; a set of heads (oracle, ACT and PonderNet at three strengths, two poolings) on one Stage 1
model would otherwise compute that same forward once per head, and it is nearly all of a head's cost (163 s of 174
on the 2-core CPU for 1,024 rows to 8 loops). The cache is keyed by everything the sweep's numbers depend on: the
frozen model's tensors (every tensor but the halting head's own projection, which the sweep does not read), its
retrofit settings (the head's pooling among them), the rows, the loops, the batch size (padding), the precision,
the device type and the torch version. A key that matches is the same computation; anything else is a miss,
computed and stored.

Files: `<cache>/halting-sweeps/<key>.safetensors` (`losses` [N, T] and `z` [N, T, d], fp32), where <cache> is
`$WORKBENCH_CACHE` or ~/.cache/workbench (`workbench.models.bases.cache_dir`). Each run records whether its sweep
was read or computed and the key (`halting_sweep` in metrics.jsonl). `WORKBENCH_SWEEP_CACHE=0` turns it off.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load, save

from workbench.errors import WorkbenchError
from workbench.io import write_bytes_atomic
from workbench.models.bases import cache_dir, weights_sha256
from workbench.tasks.manifest import rows_sha256
from workbench.train.losses import answer_losses

HEAD_OWN = "halting.proj."   # the head's projection (after any prefix): trained by the halting stage, unread


@torch.no_grad()
def sweep(looped, batches, loops: int, progress=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The oracle sweep (RecurTrace App. E's offline sweep): one frozen forward to `loops` per batch.

    Returns (answer losses [N, T], the halting head's pooled input z_t [N, T, d]), both fp32. The head
    is linear on z_t, so `halting_probs(looped, z)` gives exactly the p_t a forward would; the halting stage
    then trains on it instead of re-running the frozen model every step (`[halting] sweep`).
    """
    head = looped.halting
    if head is None:
        raise WorkbenchError("the oracle sweep needs a model with a halting head")
    pooled: list[torch.Tensor] = []
    hook = head.register_forward_pre_hook(lambda mod, args: pooled.append(mod.pool(*args).float()))
    all_losses, all_z = [], []
    try:
        for batch in batches:
            pooled.clear()
            losses, _ = answer_losses(looped, batch, loops)
            if len(pooled) != loops:
                raise WorkbenchError(f"the oracle sweep: the head ran {len(pooled)} times in {loops} loops")
            all_losses.append(losses.float())
            all_z.append(torch.stack(pooled, 1))
            if progress is not None:
                progress(len(losses))
    finally:
        hook.remove()
    return torch.cat(all_losses), torch.cat(all_z)


def enabled() -> bool:
    """Whether the sweep cache is on (`WORKBENCH_SWEEP_CACHE=0` turns it off)."""
    return os.environ.get("WORKBENCH_SWEEP_CACHE", "1") != "0"


def sweep_key(looped, rows: list[dict], loops: int, batch_size: int, precision: str, device: torch.device) -> str:
    """SHA-256 over what the sweep's numbers depend on (the module docstring lists it)."""
    h = hashlib.sha256(weights_sha256(looped, skip=lambda name: HEAD_OWN in name).encode())
    h.update(json.dumps({"settings": looped.retrofit_config.to_dict(), "rows": rows_sha256(rows), "loops": loops,
                         "batch_size": batch_size, "precision": precision, "device": torch.device(device).type,
                         "torch": torch.__version__}, sort_keys=True, default=str).encode())
    return h.hexdigest()


def path_for(key: str) -> Path:
    return cache_dir() / "halting-sweeps" / f"{key}.safetensors"


def read_sweep(key: str, n: int, loops: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The cached (losses, z) of `key`, or None when absent or not of the expected shape (then recomputed)."""
    path = path_for(key)
    if not path.is_file():
        return None
    try:
        got = load(path.read_bytes())
    except (OSError, SafetensorError):
        return None
    losses, z = got.get("losses"), got.get("z")
    if losses is None or z is None or tuple(losses.shape) != (n, loops) or tuple(z.shape[:2]) != (n, loops):
        return None
    return losses, z


def write_sweep(key: str, losses: torch.Tensor, z: torch.Tensor) -> None:
    """Stores (losses, z) under `key`, atomically (a reader never sees half a file)."""
    path = path_for(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(path, save({"losses": losses.detach().float().cpu().contiguous(),
                                   "z": z.detach().float().cpu().contiguous()}))
