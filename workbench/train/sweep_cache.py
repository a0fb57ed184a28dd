"""Stage 2's offline oracle sweep kept on disk, so that heads trained on one frozen model read one sweep.

RecurTrace App. E computes the oracle losses once, in one frozen forward over the Stage 2 rows; a sweep of heads
(oracle, ACT and PonderNet at three strengths, two poolings) on one Stage 1 model would otherwise compute that
same forward once per head, and it is nearly all of a head's cost (163 s of 174 on the 2-core CPU for 1,024 rows
to 8 loops). The cache is keyed by everything the sweep's numbers depend on: the frozen model's tensors (every
tensor but the halting head's own projection, which the sweep does not read), its retrofit settings (the head's
pooling among them), the rows, the loops, the batch size (padding), the precision, the device type and the torch
version. A key that matches is the same computation; anything else is a miss, computed and stored.

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

from workbench.io import write_bytes_atomic
from workbench.models.bases import cache_dir, weights_sha256
from workbench.tasks.manifest import rows_sha256

HEAD_OWN = "halting.proj."   # (any prefix before it) the head's projection: trained by Stage 2, never read by the sweep


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
