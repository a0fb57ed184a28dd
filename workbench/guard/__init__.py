"""The one output guard every writing command asks before any work: what it refuses and why is in docs/outputs.md.

`guard_output(path, command, kind=...)` decides whether `--out` may be written or replaced, holds a lock on it for
the command's life, and re-checks at the moment of the write or the move (`Guard.recheck`, `Guard.commit_dir`).
tests/test_guard.py enumerates the CLI's commands and fails on a writer that does not reach it.

One module a job: `kinds` (what a writer declares of its output, `OutputKind`), `in_place` (the directories the
workbench writes in place, a run and a window sweep, declared once: `IN_PLACE_KINDS`), `marker` (how the workbench
tells a directory it wrote), `lock` (the locks the guard holds and reads, `workbench.io.HeldLock`) and `policy` (the
decision, `Guard`, and `guard_output`).

The guard imports no writer (tests/test_imports.py). Each writer declares what it writes as an `OutputKind` beside
the code that writes it (probe results in `workbench.probes.battery`, the figures in `workbench.plots.export`, ...)
and hands it to the guard: how its output is laid out (a directory written whole, a directory written in place and
continued, or files), how to tell an output of its own, and, for a directory written in place, which names inside it
are its own and the words of its refusals.

The directories written in place, a training run and a window sweep, are the guard's own declaration
(`IN_PLACE_KINDS`, over the run format's names in `workbench.places`): every guard asks each of them to recognise its
own directory, whatever the writer and whatever it hands, so that directory is never replaced, nor written into
under a name it keeps, and no writer can forget one. Nothing is registered by importing a module: what a guard asks
is that tuple, the writer's own kind, and what the writer hands `beside` (a kind declared outside the package).
"""

from workbench.guard.in_place import IN_PLACE_KINDS, RUN_OUTPUT, SWEEP_OUTPUT
from workbench.guard.kinds import EVERY_NAME, FILES, IN_PLACE, WHOLE, Continued, OutputKind
from workbench.guard.lock import lock_dir, output_lock_file, training_lock_holder
from workbench.guard.marker import OUTPUT_MARKER, dir_inputs, is_workbench_output, mark_output, marked_by
from workbench.guard.policy import Guard, guard_output, safe_child

__all__ = ["EVERY_NAME", "FILES", "IN_PLACE", "IN_PLACE_KINDS", "OUTPUT_MARKER", "RUN_OUTPUT", "SWEEP_OUTPUT", "WHOLE",
           "Continued", "Guard", "OutputKind", "dir_inputs", "guard_output", "is_workbench_output", "lock_dir",
           "mark_output", "marked_by", "output_lock_file", "safe_child", "training_lock_holder"]
