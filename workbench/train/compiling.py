"""torch.compile for a training run: the recompile limit it needs, and reaching it as one line, not a silent fallback.

All decoder layers share one forward and a run meets about 11 variants of it; torch's default recompile limit (8)
is reached in the first steps, after which torch runs the rest eager with a log line only. A compiled run raises
the limit for its own duration, and reaching it stops the run with a WorkbenchError; torch's settings are restored
afterwards.
"""

from __future__ import annotations

import contextlib

import torch
import torch._dynamo
from torch._dynamo.exc import FailOnRecompileLimitHit

from workbench.errors import WorkbenchError

COMPILE_RECOMPILE_LIMIT = 64


@contextlib.contextmanager
def compile_limits(enabled: bool):
    """The run's torch.compile settings: the recompile limit raised, and reaching it a one-line WorkbenchError."""
    if not enabled:
        yield
        return
    try:
        with torch._dynamo.config.patch(recompile_limit=COMPILE_RECOMPILE_LIMIT, fail_on_recompile_limit_hit=True):
            yield
    except FailOnRecompileLimitHit as e:
        raise WorkbenchError(f"[train] compile = true: torch recompiled the decoder layers' forward "
                             f"{COMPILE_RECOMPILE_LIMIT} times, its limit for this run; rather than run the rest "
                             "eager unannounced the run stops (TORCH_LOGS=recompiles lists why; "
                             "set train.compile=false to train eager)") from e
