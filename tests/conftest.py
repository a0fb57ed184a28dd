"""Shared fixtures: tiny random models built from configs (nothing downloads)."""

import pytest
import torch

from workbench.models import load_base

TINY = ("tiny-llama", "tiny-qwen2", "tiny-qwen3")
PROMPTS = [
    "The capital of France is",
    "A -> C\nB -> A\nC -> D\nD -> B\nStart at A. Apply the table 2 times.\nAnswer:",
    "Hello there, how are you doing today, my good friend?",
]


@pytest.fixture
def tiny():
    """A fresh tiny-llama and its tokenizer (fresh: LoRA tests edit the base in place)."""
    return load_base("tiny-llama")


@pytest.fixture
def batch(tiny):
    """A left-padded batch of three prompts of different lengths."""
    _, tok = tiny
    return tok(PROMPTS, return_tensors="pt", padding=True)


def perturb(module: torch.nn.Module, scale: float = 0.05, seed: int = 0) -> None:
    """Moves every parameter of `module` off its init so later loops differ from loop 1."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))
