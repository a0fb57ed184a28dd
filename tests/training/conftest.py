"""Tiny recipes for trainer tests: tiny-llama, a 4-symbol chase, a few steps."""

from __future__ import annotations

import copy

import pytest
import tomli_w

TINY_RECIPE = {
    "name": "tiny",
    "seed": 3,
    "model": {"base": "tiny-llama", "block": "2:4", "max_loops": 4},
    "task": {"alphabet": 4},
    "optim": {"lr": 1e-3, "batch_size": 4},
    "eval": {"every": 1000, "per_depth": 4, "depths": [1, 2]},
    "checkpoint": {"every": 2, "keep": 2},
    # A random tiny model's arithmetic reading moves by chance: the guardrail tests turn it on themselves.
    "guardrail": {"enabled": False},
    "stages": [{"name": "primitive", "depths": [1], "steps": 2},
               {"name": "two-step", "depths": [1, 2], "steps": 4}],
}


def merge(base: dict, extra: dict) -> dict:
    """Returns base with extra merged in, table by table (lists replaced)."""
    out = copy.deepcopy(base)
    for k, v in extra.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


@pytest.fixture
def write_recipe(tmp_path):
    """write_recipe(**tables) -> path of a TOML recipe: TINY_RECIPE with the given tables merged."""

    def write(name: str = "recipe.toml", **extra) -> str:
        path = tmp_path / name
        path.write_text(tomli_w.dumps(merge(TINY_RECIPE, extra)))
        return str(path)

    return write
