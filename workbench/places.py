"""The names of the directories the workbench writes in place, declared once: a training run's files and a Stage 2
sweep's plan, and how a directory is told to be one (`holds_run`, `holds_sweep`).

They stand below every writer and below the output guard, which declares these two directories' output kinds
(`workbench.guard.in_place`) and asks them before any output; this module imports nothing of the workbench,
and no torch. The run format's owner is `workbench.runs` (it reads runs, `workbench.train.rundir` writes them) and the
sweep's is `workbench.selection.window_sweep`; both import their names from here, and every importer may keep importing
them from there.
"""

from __future__ import annotations

from pathlib import Path

# ----------------------------------------------------------------------------- a training run
# The files of a run directory (the run format is described in `workbench.runs`).
TRAINABLE = "trainable.safetensors"   # the trained tensors only, never the base again
RETROFIT = "retrofit.json"            # base spec + SHA-256 of its weights, split, re-entry, the retrofit's settings
RECIPE = "recipe.toml"                # the resolved recipe, overrides included: what --resume continues
PROVENANCE = "provenance.json"        # SHA-256 of every file, code and package versions, seeds: a finished run
METRICS = "metrics.jsonl"             # one JSON object per logged step / evaluation
CHECKPOINTS = "checkpoints"           # a run in progress (`workbench.train.rundir` writes them)
RUN_FILES = (TRAINABLE, RETROFIT, RECIPE, METRICS)   # the files provenance.json records
FORMAT = "workbench-run-v2"            # the format provenance.json names (v2: a continued run's tensors may be a delta)
RUN_ENTRIES = (RECIPE, RETROFIT, TRAINABLE, PROVENANCE, CHECKPOINTS)  # any one of them makes a directory a run


def holds_run(path: Path) -> bool:
    """Whether directory `path` is a training run (finished, in progress, or exported): it holds one of RUN_ENTRIES."""
    return any((Path(path) / name).exists() for name in RUN_ENTRIES)


# ----------------------------------------------------------------------------- a window sweep
SWEEP = "sweep.json"                    # the sweep's plan (what a --resume must match)


def holds_sweep(path: Path) -> bool:
    """Whether directory `path` is a window sweep (its plan is there), finished or not."""
    return (Path(path) / SWEEP).exists()
