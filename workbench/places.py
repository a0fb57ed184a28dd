"""The directories the workbench writes in place, declared once: a training run and a window sweep.

A directory written in place is trained (or swept) where it stands and continued with --resume, so it is never
replaced, and no other output is written into it under a name it keeps. Its `OutputKind` (layout IN_PLACE) is
declared here, below every writer, so that declaring it registers it with the output gate
(`workbench.gate.in_place_kinds`) and the gate asks every such kind to recognise its own directory whatever the
writer: no writer hands these kinds, and none can forget one. `workbench/__init__.py` imports this module, so the
registration is complete before any gate runs, whatever a user imported first; it is cheap (no torch), standing on
the gate and `workbench.io` alone.

The run format's owner is `workbench.runs` (it reads runs, `workbench.train.rundir` writes them) and the sweep's is
`workbench.selection.window_sweep`; both import their names from here, and every importer may keep importing them from
there.
"""

from __future__ import annotations

from pathlib import Path

from workbench.gate import EVERY_NAME, IN_PLACE, Continued, OutputKind
from workbench.io import LOCK

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


# What `train` and `launch` write, handed to the output gate: a run directory written in place, new or empty, or with
# --resume one holding its recipe.toml to continue. Declared, it is asked by the gate for every output: a directory
# holding a run is never replaced, and no output takes one of the run's own names inside it.
RUN_OUTPUT = OutputKind("run", IN_PLACE, owns=holds_run, continued=Continued(
    entry=RECIPE,
    what="a training run",
    keeps=(*RUN_ENTRIES, METRICS, LOCK),
    not_a_directory="run directory '{p}' exists and is not a directory",
    holds_another=f"run directory '{{p}}' is not empty and holds no run (no {RECIPE}); training writes only into a "
                  "new or empty directory or a run it can resume",
    holds_one="run directory '{p}' already holds a run; pass --resume or another --out"))


# ----------------------------------------------------------------------------- a window sweep
SWEEP = "sweep.json"                    # the sweep's plan (what a --resume must match)


def holds_sweep(path: Path) -> bool:
    """Whether directory `path` is a window sweep (its plan is there), finished or not."""
    return (Path(path) / SWEEP).exists()


# What `select-block --window-sweep` writes, handed to the output gate: a directory written in place (its runs are
# trained where they stand), new or empty, or with --resume one holding its plan to continue. Declared, it is asked
# by the gate for every output: a sweep is never replaced, and nothing else is written into it.
SWEEP_OUTPUT = OutputKind("sweep", IN_PLACE, owns=holds_sweep, continued=Continued(
    entry=SWEEP,
    what="a window sweep",
    keeps=EVERY_NAME,
    not_a_directory="output '{p}' exists and is not a directory",
    holds_another=f"output directory '{{p}}' is not empty and holds no window sweep ({SWEEP}); a sweep writes into a "
                  "new or empty directory or one it can resume",
    holds_one="output directory '{p}' holds a window sweep; pass --resume to continue it or choose another --out "
              "(its training runs are never replaced)",
    nothing_to_resume="--resume: '{p}' holds no window sweep to continue; drop --resume to start one"))
