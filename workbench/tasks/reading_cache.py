"""Readings kept on disk by content: the same computation on the same machine is read back, not run again.

The capability guardrail is read at loop 1 on the base before a run, on the run at every guardrail step, and again by
the identity probe on the base and the checkpoint: 64 few-shot prompts through the whole model, about 27 s on one
core of the 2-core CPU for the 135M default. A key that matches names the same computation, so its reading is the
same bytes. The key (`reading_key`) covers what the numbers depend on:

- the model's tensors (`weights_sha256`: names, shapes, dtypes and bytes), its configuration (rope, norms, window:
  what the tensors do not hold; not the path it was read from), its retrofit settings, precision and attention
  implementation, and which LoRA adapters are active;
- the inputs: the rows' digest, their token ids and the ids of each prompt followed by its answer (so the tokenizer
  is in the key), and the batch size (padding);
- the machine and the code: device type, the CPU's kernel level (torch's `get_cpu_capability`), torch's thread count,
  the torch and transformers versions, and a digest of the workbench package's own sources.

A model that is training (dropout), or has any forward hook or pre-hook registered on it, its modules or globally,
is never keyed: a hook can change what the forward computes without changing a tensor. Nor is one of several ranks
(`several_ranks`): a sharded model reads collectively, and every rank must compute. Files:
`<cache>/readings/<kind>/<key>.json`, where <cache> is `$WORKBENCH_CACHE` or ~/.cache/workbench
(`workbench.models.bases.cache_dir`). `WORKBENCH_READING_CACHE=0` turns it off.
"""

from __future__ import annotations

import hashlib
import json
import os
from functools import cache
from pathlib import Path

import torch
import transformers
from peft.tuners.tuners_utils import BaseTunerLayer
from torch.nn.modules import module as nn_module

from workbench.io import write_bytes_atomic
from workbench.models.bases import cache_dir, weights_sha256
from workbench.tasks.manifest import rows_sha256

PACKAGE = Path(__file__).resolve().parents[1]
WHERE_FROM = ("_name_or_path", "transformers_version")   # a config's path and writer: not what the model computes


def enabled() -> bool:
    """Whether readings are kept (`WORKBENCH_READING_CACHE=0` turns it off)."""
    return os.environ.get("WORKBENCH_READING_CACHE", "1") != "0"


@cache
def code_sha256() -> str:
    """SHA-256 over the workbench package's Python sources (paths and bytes), once a process."""
    h = hashlib.sha256()
    for path in sorted(PACKAGE.rglob("*.py")):
        h.update(path.relative_to(PACKAGE).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def hooked(model: torch.nn.Module) -> bool:
    """Whether any forward hook or pre-hook is registered on `model`, its modules or globally."""
    if nn_module._global_forward_hooks or nn_module._global_forward_pre_hooks:
        return True
    return any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def several_ranks() -> bool:
    """Whether this process is one of several ranks: a sharded model reads collectively, and one rank reading a kept
    reading while another computes would leave the other waiting on a collective, so ranks always read."""
    return torch.distributed.is_available() and torch.distributed.is_initialized() and \
        torch.distributed.get_world_size() > 1


def reading_key(model, tokenizer, rows: list[dict], **settings) -> str | None:
    """SHA-256 over what a reading of `rows` by `model` depends on (the module docstring lists it), or None when the
    model cannot be keyed: the cache is off, it is not a torch module in eval mode, a hook is registered, or this
    process is one of several ranks."""
    if not enabled() or not isinstance(model, torch.nn.Module) or model.training or hooked(model) or several_ranks():
        return None
    device = next(model.parameters(), None)
    if device is None:
        return None
    device = device.device
    config = getattr(model, "retrofit_config", None)
    adapters = [(name, bool(m.disable_adapters), list(m.active_adapters)) for name, m in model.named_modules()
                if isinstance(m, BaseTunerLayer)]
    prompts = [r["prompt"] for r in rows]
    base = getattr(model, "config", None)
    base = {k: v for k, v in base.to_dict().items() if k not in WHERE_FROM} if hasattr(base, "to_dict") else None
    h = hashlib.sha256(weights_sha256(model).encode())
    h.update(json.dumps({
        "config": base,
        "settings": None if config is None else config.to_dict(),
        "precision": getattr(model, "precision", None),
        "attention": getattr(getattr(model, "config", None), "_attn_implementation", None),
        "adapters": adapters,
        "rows": rows_sha256(rows),
        "ids": [tokenizer.encode(p) for p in prompts],
        "answered": [tokenizer.encode(p + r["answer"]) for p, r in zip(prompts, rows)],
        "reading": settings,
        "device": device.type,
        "cpu": torch.backends.cpu.get_cpu_capability() if device.type == "cpu" else None,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "code": code_sha256(),
    }, sort_keys=True, default=str).encode())
    return h.hexdigest()


def path_for(kind: str, key: str) -> Path:
    return cache_dir() / "readings" / kind / f"{key}.json"


def read_kept(kind: str, key: str | None) -> dict | None:
    """The reading kept under `key`, or None when there is none (or it does not parse: then it is read again)."""
    if key is None:
        return None
    try:
        return json.loads(path_for(kind, key).read_text())
    except (OSError, ValueError):
        return None


def keep(kind: str, key: str | None, reading: dict) -> None:
    """Stores `reading` under `key`, atomically (a reader never sees half a file); nothing when `key` is None."""
    if key is None:
        return
    path = path_for(kind, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(path, json.dumps(reading, sort_keys=True).encode())
