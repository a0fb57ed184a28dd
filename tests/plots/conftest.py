"""Synthetic probe results for the figure tests (see synthetic.py for what they contain)."""

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest


def load_synthetic():
    """Returns tests/plots/synthetic.py as the module `synthetic`, whatever pytest's import mode."""
    if "synthetic" not in sys.modules:
        spec = importlib.util.spec_from_file_location("synthetic", Path(__file__).with_name("synthetic.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules["synthetic"] = module
        spec.loader.exec_module(module)
    return sys.modules["synthetic"]


synthetic = load_synthetic()


@pytest.fixture(scope="session")
def tables():
    """Every probe table and part, following the probe schemas (seeded)."""
    return synthetic.all_tables(seed=0)


@pytest.fixture
def rng():
    return np.random.default_rng(1)
