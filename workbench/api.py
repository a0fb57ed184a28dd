"""One probe by name, outside a battery (the public API's `workbench.probe`), and a recipe trained as
`workbench train` trains it (`workbench.train_recipe`).

A battery (`workbench.run_battery`) runs several probes on a checkpoint and writes a results
directory; `probe` runs one on a model already in memory and returns its tables, so a notebook
or a script can look at one question without writing anything.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from workbench.probes import PROBES
from workbench.probes.battery import run_probe
from workbench.selection.stage1 import resolve_block
from workbench.train.trainer import train

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from workbench.loop.looped import LoopedLM


def probe_names() -> list[str]:
    """The names `probe` and a battery's `[probes.<name>]` accept, in the order a battery runs them."""
    return list(PROBES)


def probe(name: str, model: LoopedLM, tokenizer: PreTrainedTokenizerBase, rows: list[dict],
          **options: Any) -> dict[str, pd.DataFrame]:
    """Runs probe `name` on `model` over `rows` and returns its tables, {table name: DataFrame}.

    Args:
        name: one of `probe_names()` ("depth_matrix", "logit_lens", ...).
        model: a `LoopedLM` (from `retrofit` or `load_run`).
        tokenizer: the base model's tokenizer.
        rows: manifest rows (`build_rows`, or `read_manifest(path).rows`).
        **options: the probe's own options, as in a battery file (`loops=8`, `seed=0`, ...); the
            probe's module docstring lists them and their defaults.
    Raises:
        WorkbenchError: an unknown probe name or option (the message lists the accepted ones).
        NotApplicable: the probe's question does not apply to this model or these rows.
    """
    return run_probe(name, model, tokenizer, rows, options, {})


def train_recipe(recipe_path: str | Path, out: str | Path | None = None, **options: Any) -> dict:
    """Trains a recipe into a run directory as `workbench train` does and returns its summary: the trainer
    (`workbench.train.trainer.train`, whose arguments `options` are) handed Stage 1 block selection for a recipe's
    block = "auto" (`workbench.selection.stage1.resolve_block`)."""
    return train(recipe_path, out, choose_block=resolve_block, **options)
