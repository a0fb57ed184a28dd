"""Surgery: split a decoder at (a, b) into Prelude / looped Block / Coda and close the loop.

Each step is one small function a reader can check against the papers: validate the split,
build the re-entry, optionally add Loop Memory Attention and a halting head, optionally put
a LoRA adapter on the block. Nothing here copies a base weight.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
from peft import LoraConfig, inject_adapter_in_model
from torch import nn

from workbench.errors import WorkbenchError
from workbench.loop.config import LoraSettings, RetrofitConfig
from workbench.loop.halting import HaltingHead
from workbench.loop.looped import LoopedLM
from workbench.loop.memory import LoopMemoryAttention
from workbench.loop.reentry import LoopCodes, make_reentry


def check_block(block: tuple[int, int], n_layers: int) -> tuple[int, int]:
    """Returns the block if 0 <= a < b <= n_layers, else raises naming the accepted range."""
    a, b = block
    if not (0 <= a < b <= n_layers):
        raise WorkbenchError(
            f"block {a}:{b} is invalid for a model with {n_layers} layers; need 0 <= a < b <= {n_layers}"
        )
    return a, b


def retrofit(model: nn.Module, config: RetrofitConfig) -> LoopedLM:
    """Returns a LoopedLM over `model` (weights shared) with fresh re-entry at their paper inits.

    This is the one place a retrofit is built: fresh (`retrofit(base, RetrofitConfig(Block(10, 16)))`), or rebuilt
    from a run's retrofit.json (`retrofit(base, RetrofitConfig.from_dict(record["settings"]))`).

    Args:
        model: a HF causal LM of a supported family (see `workbench.models`).
        config: the retrofit's architecture: its `Block` and re-entry, memory, halting head, loop codes, LoRA.
    When the config holds `lora`, the adapter is attached last (`attach_lora`; B = 0, so the
    retrofit is unchanged).
    """
    if not isinstance(config, RetrofitConfig):
        raise WorkbenchError(f"retrofit(model, config): config is a {type(config).__name__}, not a RetrofitConfig; "
                             "e.g. retrofit(base, RetrofitConfig(Block(10, 16), reentry='bridge'))")
    n_layers = len(model.model.layers)
    a, b = check_block(config.block, n_layers)
    d = model.config.hidden_size
    ref = next(model.parameters())
    mem = None
    if config.memory:
        mem = nn.ModuleDict({str(i): LoopMemoryAttention(d, n_heads=config.memory_heads) for i in range(a, b)})
    reentry = make_reentry(config.reentry, d)  # built in this order: each draws from the torch RNG
    halting = HaltingHead(d, config.halting_pooling) if config.halting else None
    codes = LoopCodes(config.max_loops, d, device=ref.device) if config.loop_codes else None
    looped = LoopedLM(model, replace(config, lora=None), reentry, memory=mem, halting=halting, loop_codes=codes)
    for part in (looped.reentry, looped.memory, looped.halting, looped.loop_codes):
        if part is not None:
            part.to(device=ref.device, dtype=ref.dtype)
    if config.lora is not None:
        attach_lora(looped, config.lora)
    return looped


def attach_lora(looped: LoopedLM, lora: LoraSettings | None = None, init_lora_weights: bool = True,
                **settings: Any) -> LoopedLM:
    """Puts one peft LoRA adapter on the block's projections (shared by every loop), in place.

    `lora` is a `LoraSettings`, or give its fields (r, alpha, dropout, targets) as keywords.
    With `init_lora_weights=True`, B = 0 so the retrofit is unchanged. Base weights are frozen.
    The model's `retrofit_config` records the adapter.
    """
    if lora is None:
        lora = LoraSettings(**settings)
    elif settings:
        raise WorkbenchError(f"attach_lora: LoraSettings given with extra options {sorted(settings)}")
    if looped.retrofit_config.lora is not None:
        raise WorkbenchError("attach_lora: this retrofit already has a LoRA adapter")
    config = LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=list(lora.targets),
                        layers_to_transform=list(range(looped.a, looped.b)), layers_pattern="layers",
                        init_lora_weights=init_lora_weights)
    inject_adapter_in_model(config, looped.base)
    for name, param in looped.base.named_parameters():
        param.requires_grad_("lora_" in name)
    looped.retrofit_config = replace(looped.retrofit_config, lora=lora)
    return looped


def parameter_groups(looped: LoopedLM) -> dict[str, list[tuple[str, torch.nn.Parameter]]]:
    """Named parameters by group: base (outside the block), block, lora, reentry, memory, halting, loop_codes."""
    groups: dict[str, list] = {k: [] for k in ("base", "block", "lora", "reentry", "memory", "halting", "loop_codes")}
    block_prefixes = tuple(f"base.model.layers.{i}." for i in range(looped.a, looped.b))
    for name, param in looped.named_parameters(remove_duplicate=True):
        if "lora_" in name:
            groups["lora"].append((name, param))
        elif name.startswith("reentry."):
            groups["reentry"].append((name, param))
        elif name.startswith("memory."):
            groups["memory"].append((name, param))
        elif name.startswith("halting."):
            groups["halting"].append((name, param))
        elif name.startswith("loop_codes."):
            groups["loop_codes"].append((name, param))
        elif name.startswith(block_prefixes):
            groups["block"].append((name, param))
        else:
            groups["base"].append((name, param))
    return groups


def parameter_report(looped: LoopedLM) -> dict:
    """Parameter accounting as the retrofit paper reports it (Sec. 3.5).

    `total` counts unique tensors once (a tied embedding / LM head once); `forward_active`
    counts what a forward at T >= 2 touches (everything here: no dormant tensors are kept);
    `trainable` is per group, counting parameters with requires_grad.
    """
    groups = parameter_groups(looped)
    count = lambda ps: sum(p.numel() for _, p in ps)  # noqa: E731
    trainable = {g: sum(p.numel() for _, p in ps if p.requires_grad) for g, ps in groups.items()}
    total = sum(count(ps) for ps in groups.values())
    return {
        "total": total,
        "forward_active": total,
        "base": count(groups["base"]) + count(groups["block"]),
        "added": {g: count(groups[g]) for g in ("reentry", "memory", "halting", "lora")}
        | ({"loop_codes": count(groups["loop_codes"])} if looped.loop_codes is not None else {}),
        "trainable": trainable,
        "trainable_total": sum(trainable.values()),
    }
