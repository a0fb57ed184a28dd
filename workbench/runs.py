"""Loading a finished run (or a shipped keeper) for probing, without the trainer.

`load_run(run_dir)` rebuilds a run's `LoopedLM` from its directory, strictly checked (every
file's SHA-256 against provenance.json, the base's weights against retrofit.json, every tensor
present and of its shape); `read_retrofit` reads the retrofit record alone, and
`resolve_run` turns a shipped keeper's name (`smollm2-chase`) into its directory. The run
directory's format is described in `workbench.train.rundir`, which writes it; this module is
the reading side that probes, notebooks and the public API (`workbench.load_run`) use, so that
none of them imports the training loop, its recipes or its optimizer.
"""

from __future__ import annotations

from workbench.defaults import resolve_run
from workbench.train.rundir import (
    PROVENANCE,
    RECIPE,
    RETROFIT,
    TRAINABLE,
    base_sha256,
    load_run,
    read_retrofit,
    verify_files,
)

__all__ = ["PROVENANCE", "RECIPE", "RETROFIT", "TRAINABLE", "base_sha256", "load_run", "read_retrofit",
           "resolve_run", "verify_files"]
