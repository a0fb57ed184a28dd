"""Fixtures for the probe tests: the real tokenizer, small chase row sets, tiny looped models."""

from __future__ import annotations

import pytest

from workbench.loop.config import Block, RetrofitConfig
from workbench.loop.surgery import retrofit
from workbench.models import load_base, load_tokenizer
from workbench.tasks import build_rows


@pytest.fixture(scope="session")
def tok():
    """The embedded default's tokenizer (left padding)."""
    return load_tokenizer("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def rows(tok):
    """N = 8 chase rows, depths 1-4, 8 per depth (all prompts 50 tokens)."""
    return build_rows("chase", [1, 2, 3, 4], 8, 11, alphabet=8, tokenizer=tok)


@pytest.fixture(scope="module")
def tiny_looped():
    """A fresh tiny-llama retrofit at block 2:4 (bridge at init: re-entry passes h through), and its tokenizer."""
    model, tok = load_base("tiny-llama")
    looped = retrofit(model, RetrofitConfig(Block(2, 4), max_loops=10)).eval()
    for p in looped.parameters():
        p.requires_grad_(False)
    return looped, tok
