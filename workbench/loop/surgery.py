"""Surgery: split a decoder at (a, b) into Prelude / looped Block / Coda and close the loop.

Each step is one small function a reader can check against the papers: validate the split,
build the re-entry, optionally add Loop Memory Attention and a halting head, optionally put
a LoRA adapter on the block. Nothing here copies a base weight.
"""

from __future__ import annotations

import torch
from torch import nn

from workbench.errors import WorkbenchError
from workbench.loop.halting import HaltingHead
from workbench.loop.looped import LoopedLM
from workbench.loop.memory import LoopMemoryAttention
from workbench.loop.reentry import make_reentry

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def parse_block(block: str | tuple[int, int] | list[int]) -> tuple[int, int]:
    """Returns (a, b) from "A:B" or a pair."""
    if isinstance(block, str):
        parts = block.split(":")
        if len(parts) != 2 or not all(p.strip().lstrip("-").isdigit() for p in parts):
            raise WorkbenchError(f"block '{block}' is not of the form A:B (e.g. 10:16)")
        return int(parts[0]), int(parts[1])
    a, b = block
    return int(a), int(b)


def check_block(block: tuple[int, int], n_layers: int) -> tuple[int, int]:
    """Returns the block if 0 <= a < b <= n_layers, else raises naming the accepted range."""
    a, b = block
    if not (0 <= a < b <= n_layers):
        raise WorkbenchError(
            f"block {a}:{b} is invalid for a model with {n_layers} layers; need 0 <= a < b <= {n_layers}"
        )
    return a, b


def retrofit(model: nn.Module, block: tuple[int, int] | str, reentry: str = "bridge",
             memory: bool = False, max_loops: int = 16, memory_window: int = 3,
             memory_heads: int = 4, halting: bool = False, halting_pooling: str = "mean") -> LoopedLM:
    """Returns a LoopedLM over `model` (weights shared) with fresh re-entry at their paper inits.

    Args:
        model: a HF causal LM of a supported family (see `workbench.models`).
        block: (a, b) or "a:b": layers a..b-1 are looped.
        reentry: "bridge" (retrofit paper's split bridge) or "inject" (RecurTrace additive).
        memory: add Loop Memory Attention before each block layer (window, heads as given).
        max_loops: hook points are allocated for loops 1..max_loops.
        halting: add a halting head reading the pooled loop state.
    """
    n_layers = len(model.model.layers)
    a, b = check_block(parse_block(block), n_layers)
    if not isinstance(max_loops, int) or max_loops < 1:
        raise WorkbenchError(f"max_loops={max_loops!r} must be an integer >= 1")
    d = model.config.hidden_size
    ref = next(model.parameters())
    mem = None
    if memory:
        mem = nn.ModuleDict({str(i): LoopMemoryAttention(d, n_heads=memory_heads) for i in range(a, b)})
    looped = LoopedLM(
        model, (a, b), make_reentry(reentry, d), memory=mem, memory_window=memory_window,
        halting=HaltingHead(d, halting_pooling) if halting else None, max_loops=max_loops,
    )
    for part in (looped.reentry, looped.memory, looped.halting):
        if part is not None:
            part.to(device=ref.device, dtype=ref.dtype)
    looped.settings = dict(block=[a, b], reentry=reentry, memory=memory, max_loops=max_loops,
                           memory_window=memory_window, memory_heads=memory_heads,
                           halting=halting, halting_pooling=halting_pooling)
    return looped


def attach_lora(looped: LoopedLM, r: int = 16, alpha: int = 32, dropout: float = 0.0,
                targets: tuple[str, ...] = LORA_TARGETS, init_lora_weights: bool = True) -> LoopedLM:
    """Puts one peft LoRA adapter on the block's projections (shared by every loop), in place.

    With `init_lora_weights=True`, B = 0 so the retrofit is unchanged. Base weights are frozen.
    """
    from peft import LoraConfig, inject_adapter_in_model

    config = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=list(targets),
                        layers_to_transform=list(range(looped.a, looped.b)), layers_pattern="layers",
                        init_lora_weights=init_lora_weights)
    inject_adapter_in_model(config, looped.base)
    for name, param in looped.base.named_parameters():
        param.requires_grad_("lora_" in name)
    looped.settings["lora"] = dict(r=r, alpha=alpha, dropout=dropout, targets=list(targets))
    return looped


def parameter_groups(looped: LoopedLM) -> dict[str, list[tuple[str, torch.nn.Parameter]]]:
    """Named parameters by group: base (outside the block), block, lora, reentry, memory, halting."""
    groups: dict[str, list] = {k: [] for k in ("base", "block", "lora", "reentry", "memory", "halting")}
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
        "added": {g: count(groups[g]) for g in ("reentry", "memory", "halting", "lora")},
        "trainable": trainable,
        "trainable_total": sum(trainable.values()),
    }
