"""Loop-1 identity: the retrofit at loop 1 must reproduce the untouched base model exactly."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch
from peft.tuners.lora import LoraLayer
from tqdm.auto import tqdm

from workbench.errors import WorkbenchError
from workbench.loop.config import Block, RetrofitConfig
from workbench.loop.positions import position_ids
from workbench.loop.surgery import attach_lora, retrofit

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

# A small built-in prompt set: short and long, plain and chat-like, so padding is exercised.
IDENTITY_PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "A -> C\nB -> A\nC -> D\nD -> B\nStart at A. Apply the table 2 times.\nAnswer:",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "Question: What is 12 + 7?\nAnswer:",
    "Ben passes to Max. Max passes to Eve. Eve passes to Kai. Start at Ben; after 3 passes, who has it?",
)


def base_logits(base, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The untouched HF model's logits [batch, pos, vocab], with the position ids the loop uses."""
    with torch.no_grad():
        return base(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids(attention_mask)).logits


def max_abs_diff(looped, input_ids, attention_mask, reference: torch.Tensor, loops: int) -> float:
    """max |Δlogit| between the retrofit's loop-1 logits and `reference`, over real tokens only.

    `loops` > 1 also runs the later loops (and their re-entry) in the same call, through `read`,
    which must not disturb what loop 1 reads.
    """
    real = attention_mask.bool()
    wanted = reference[real]                                   # [real tokens, vocab]
    with torch.no_grad():
        diff = _largest_gap(looped(input_ids, attention_mask, loops=1).logits[real], wanted)
        if loops > 1:
            positions = torch.arange(input_ids.shape[1], device=input_ids.device).expand(input_ids.shape[0], -1)
            first = looped.read(input_ids, attention_mask, loops=loops, positions=positions).scores[:, 0]
            diff = max(diff, _largest_gap(first[real], wanted))
    return diff


def _largest_gap(got: torch.Tensor, wanted: torch.Tensor) -> float:
    """max |got - wanted|, computed in `got`'s storage (a copy made by indexing): the logits are [tokens, vocab],
    and the padded positions are left out before the subtraction rather than after it."""
    return got.sub_(wanted).abs_().max().item()


def lora_layers(model) -> list:
    """The peft LoRA layers inside `model` (empty when no adapter is attached)."""
    return [m for m in model.modules() if isinstance(m, LoraLayer)]


def adapter_state(model) -> str:
    """ "none" (no LoRA adapter), "untrained" (every lora_B is zero: the adapter changes nothing) or "trained"."""
    layers = lora_layers(model)
    if not layers:
        return "none"
    trained = any(bool(p.detach().abs().max() > 0) for m in layers for d in m.lora_B.values() for p in d.parameters())
    return "trained" if trained else "untrained"


@contextmanager
def adapters_disabled(model):
    """Runs the block with every LoRA adapter switched off (peft `enable_adapters(False)`), then back on.

    peft's re-enabling marks the adapter trainable; the parameters' `requires_grad` flags are
    restored as they were.
    """
    layers = lora_layers(model)
    flags = {id(p): p.requires_grad for m in layers for p in m.parameters()}
    for m in layers:
        m.enable_adapters(False)
    try:
        yield model
    finally:
        for m in layers:
            m.enable_adapters(True)
            for p in m.parameters():
                p.requires_grad_(flags[id(p)])


def identity_report(base: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, block: Block,
                    loops: int = 3, prompts: Sequence[str] = IDENTITY_PROMPTS,
                    designs: Sequence[str] = ("bridge", "inject"), lora: bool = True,
                    progress: bool = False) -> list[dict]:
    """Returns one dict per (re-entry, memory, lora) with `max_abs_diff` at loop 1.

    The LoRA variant (B = 0 at init) is checked last because attaching it edits the base
    model's block projections in place.
    """
    if not isinstance(loops, int) or not 1 <= loops <= 64:
        raise WorkbenchError(f"loops={loops!r} is outside 1..64 for the identity check")
    enc = tokenizer(list(prompts), return_tensors="pt", padding=True).to(next(base.parameters()).device)
    ref = base_logits(base, enc.input_ids, enc.attention_mask)
    rows = []
    variants = [(d, m, False) for d in designs for m in (False, True)]
    if lora:
        variants += [(d, m, True) for d in designs for m in (False, True)]
    for design, memory, with_lora in tqdm(variants, desc="identity", unit="retrofit", disable=not progress):
        looped = retrofit(base, RetrofitConfig(block, reentry=design, memory=memory, max_loops=max(loops, 1)))
        if with_lora and not any("lora_" in n for n, _ in base.named_parameters()):
            attach_lora(looped)
        rows.append(dict(reentry=design, memory=memory, lora=with_lora,
                         max_abs_diff=max_abs_diff(looped, enc.input_ids, enc.attention_mask, ref, loops)))
    return rows
