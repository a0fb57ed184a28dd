"""Shared fixtures for the task tests: the real SmolLM2 tokenizer (loaded once)."""

import pytest

from workbench.models import load_tokenizer


@pytest.fixture(scope="session")
def tok():
    """The embedded default's tokenizer (vocab 49,152), left padding."""
    return load_tokenizer("smollm2-135m-instruct")
