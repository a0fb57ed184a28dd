"""Multi-process engines under `accelerate launch`: which one a preset asks for, and the FSDP2 plan.

The trainer sums gradients over ranks itself (`reduce_grads`), so DDP needs no wrapper:
N processes compute what one process computes on the same global batch. FSDP2 here shards the
*frozen* base: every decoder layer outside the looped block becomes its own `fully_shard` unit,
all-gathered for its one visit per forward and resharded after it. The looped block, the
re-entry, memory, halting head, embeddings and LM head stay whole on every rank: the block is
visited T times per forward (a resharding unit would be all-gathered again at each visit, and its
gradient would be reduced once per visit), the trained tensors are then plain tensors that the
trainer reduces and saves exactly as in one process, and the tied embedding / LM head is never
split (consolidated checkpoints that lose tied parameters cannot happen: none is sharded).

Presets live in `training/accelerate/` (docs/gpu.md). DeepSpeed is driven at ZeRO stage 2 only
(`workbench.train.zero2`: the gradients and AdamW state of the trained tensors partitioned over the
ranks, the trainer's own AdamW and records kept); another stage, offload, or a DeepSpeed JSON
config file of the user's is refused with one line (`check_deepspeed`).
"""

from __future__ import annotations

import importlib.util
import os

import torch

from workbench.errors import WorkbenchError


def _flag(name: str) -> bool:
    return os.environ.get(name, "false").lower() in ("1", "true", "yes")


def check_deepspeed(where: str, stage, offload_optimizer=None, offload_param=None, config_file=None) -> None:
    """Refuses, in one line, a DeepSpeed setting this trainer does not drive: it drives ZeRO stage 2 without offload,
    from its own config (`workbench.train.zero2`). `where` names what was given (the preset)."""
    if importlib.util.find_spec("deepspeed") is None:
        raise WorkbenchError(f"{where} asks for DeepSpeed, which is not installed here (pip install deepspeed==0.19.8; "
                             "or use training/accelerate/ddp.yaml or fsdp2.yaml)")
    if config_file not in (None, "", "none"):
        raise WorkbenchError(f"{where} gives a DeepSpeed config file ({config_file}); this trainer builds its own "
                             "ZeRO-2 config: use deepspeed_config with zero_stage: 2 (training/accelerate/zero2.yaml)")
    if str(stage) != "2":
        raise WorkbenchError(f"{where} asks for DeepSpeed ZeRO stage {stage}; this trainer drives stage 2 only "
                             "(training/accelerate/zero2.yaml)")
    for name, value in (("offload_optimizer_device", offload_optimizer), ("offload_param_device", offload_param)):
        if str(value or "none").lower() != "none":
            raise WorkbenchError(f"{where} asks for DeepSpeed {name}: {value}; this trainer drives ZeRO-2 without "
                                 "offload (none)")


def requested_engine(num_processes: int) -> str:
    """The engine `accelerate launch` set up for this process: none (one process), ddp, fsdp2 or zero2.

    Raises:
        WorkbenchError: DeepSpeed other than ZeRO-2 without offload, Megatron or FSDP version 1 (not driven by
            this trainer), or an engine whose package is not installed.
    """
    if _flag("ACCELERATE_USE_DEEPSPEED"):
        env = os.environ.get
        check_deepspeed("the accelerate preset", env("ACCELERATE_DEEPSPEED_ZERO_STAGE", "2"),
                        env("ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE"),
                        env("ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE"), env("ACCELERATE_DEEPSPEED_CONFIG_FILE"))
        return "zero2" if num_processes > 1 else "none"
    if _flag("ACCELERATE_USE_MEGATRON_LM"):
        raise WorkbenchError("the accelerate preset asks for Megatron-LM, which this trainer does not drive; "
                             "use training/accelerate/ddp.yaml, fsdp2.yaml or zero2.yaml")
    if _flag("ACCELERATE_USE_FSDP"):
        if os.environ.get("FSDP_VERSION", "1") != "2":
            raise WorkbenchError("the accelerate preset asks for FSDP version 1, whose frozen parameters used "
                                 "several times per forward are resharded twice; use fsdp_version: 2 "
                                 "(training/accelerate/fsdp2.yaml)")
        return "fsdp2" if num_processes > 1 else "none"
    return "ddp" if num_processes > 1 else "none"


def shard_frozen_base(looped) -> dict:
    """Applies the FSDP2 plan above to a retrofit in place; returns its record for provenance.

    Raises:
        WorkbenchError: a layer outside the block holds a trained tensor (it would be sharded).
    """
    # Here, not at the top: a torch built without distributed support (torch.distributed.is_available() False)
    # has no torch.distributed.fsdp, and only an fsdp2 launch reaches this line.
    from torch.distributed.fsdp import fully_shard  # noqa: PLC0415 - the reason: the comment above

    layers = looped.base.model.layers
    sharded = [i for i in range(len(layers)) if not looped.a <= i < looped.b]
    for i in sharded:
        trained = [n for n, p in layers[i].named_parameters() if p.requires_grad]
        if trained:
            raise WorkbenchError(f"fsdp2: layer {i} outside the looped block trains '{trained[0]}'; only frozen "
                                 "layers are sharded")
        fully_shard(layers[i], reshard_after_forward=True)
    return {"engine": "fsdp2", "sharded_layers": sharded, "whole": {"block": [looped.a, looped.b],
            "also": "embeddings, final norm, LM head, re-entry, memory, halting head, LoRA"},
            "world_size": torch.distributed.get_world_size()}


def full(t: torch.Tensor) -> torch.Tensor:
    """A sharded tensor's full value (a collective: every rank calls it), any other tensor as it is."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def reduce_grads(acc, params: list[torch.Tensor], loss: torch.Tensor, device) -> torch.Tensor:
    """Sums the gradients of `params` (in place) and `loss` over the ranks of `acc`; returns the summed loss.

    Each rank's loss is its shard's divided by the global normaliser, so the sums are what one process computes on
    the whole batch. A tensor no rank touched (a memory gate on a one-loop step) keeps grad None, as in one process.
    `acc` is an `accelerate.Accelerator` (or anything with `num_processes` and `reduce(tensor, reduction="sum")`).
    """
    if acc.num_processes == 1:
        return loss
    touched = acc.reduce(torch.tensor([float(p.grad is not None) for p in params], device=device),
                         reduction="sum")  # NCCL reduces GPU tensors only
    flat = torch.cat([(torch.zeros_like(p) if p.grad is None else p.grad).flatten() for p in params])
    flat = acc.reduce(flat, reduction="sum")
    offset = 0
    for p, hit in zip(params, touched.tolist()):
        p.grad = flat[offset: offset + p.numel()].view_as(p).clone() if hit else None
        offset += p.numel()
    return acc.reduce(loss, reduction="sum")


def any_rank(acc, value: bool, device) -> bool:
    """Whether `value` is true on any rank of `acc` (a collective: every rank calls it)."""
    if acc.num_processes == 1:
        return value
    return bool(acc.reduce(torch.tensor([float(value)], device=device), reduction="sum").item() > 0)
