"""The directories the workbench writes in place, a training run and a window sweep: the plain declaration every
guard asks (`IN_PLACE_KINDS`).

A directory written in place is trained (or swept) where it stands and continued with --resume, so it is never
replaced, and no other output is written into it under a name it keeps. Every guard asks each kind declared here to
recognise its own directory, whatever the writer and whatever it hands, so no writer can forget one. The names these
kinds read (a run's files, a sweep's plan) are the run format's, declared in `workbench.places`, below every writer;
a kind declared anywhere else is asked only when a writer hands it (`beside`).
"""

from __future__ import annotations

from workbench.guard.kinds import EVERY_NAME, IN_PLACE, Continued, OutputKind
from workbench.io import LOCK
from workbench.places import METRICS, RECIPE, RUN_ENTRIES, SWEEP, holds_run, holds_sweep

# What `train` and `launch` write: a run directory written in place, new or empty, or with --resume one holding its
# recipe.toml to continue. Asked by every guard: a directory holding a run is never replaced, and no output takes one
# of the run's own names inside it.
RUN_OUTPUT = OutputKind("run", IN_PLACE, owns=holds_run, continued=Continued(
    entry=RECIPE,
    what="a training run",
    keeps=(*RUN_ENTRIES, METRICS, LOCK),
    not_a_directory="run directory '{p}' exists and is not a directory",
    holds_another=f"run directory '{{p}}' is not empty and holds no run (no {RECIPE}); training writes only into a "
                  "new or empty directory or a run it can resume",
    holds_one="run directory '{p}' already holds a run; pass --resume or another --out"))

# What `select-block --window-sweep` writes: a directory written in place (its runs are trained where they stand),
# new or empty, or with --resume one holding its plan to continue. Asked by every guard: a sweep is never replaced,
# and nothing else is written into it.
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

IN_PLACE_KINDS = (RUN_OUTPUT, SWEEP_OUTPUT)   # every guard asks each of these, whatever the writer hands
