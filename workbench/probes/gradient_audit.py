"""Gradient-path audit (retrofit paper Sec. 5.1): does each loop's loss reach the re-entry, block and Coda?

Wraps the trainer's `workbench.train.audit.gradient_audit` on a small batch of rows: per loop t
and parameter group, the RMS and zero fraction of d(loss at loop t)/d(params); and a
finite-difference check of the whole chain loss along a random unit direction over the
trainable parameters (the re-entry's when nothing trains, as for a loaded checkpoint), in float64.

Tables:
    gradient_audit: loop, group ("reentry.prelude_proj", "reentry.state_proj", ..., "block", "lora",
        "memory", "coda"), grad_rms, zero_fraction
    gradient_audit__fd: direction ("random"), autograd, finite_difference, rel_error
"""

from __future__ import annotations

import pandas as pd

from workbench.analysis.headlines.gradient_audit import headline
from workbench.errors import WorkbenchError
from workbench.probes.common import FUNCTION_TABLE, require_chase
from workbench.probes.options import Count, probe_options
from workbench.probes.spec import ProbeSpec
from workbench.train.audit import gradient_audit


def run(model, tokenizer, rows: list[dict], n_rows: int = 4, eps: float = 1e-3, seed: int = 0) -> dict[str, pd.DataFrame]:
    """Returns {"gradient_audit": per (loop, group), "gradient_audit__fd": the finite-difference check}.

    Args:
        n_rows: rows in the audit batch, taken round-robin over the depths, deepest first.
        eps: finite-difference step (the eager softmax runs in fp32 even in the fp64 copy: its
            rounding, divided by eps, sets a floor on the relative error of about 1e-2 on tiny models).
        seed: the random direction.
    """
    require_chase(rows)
    batch = spread(rows, n_rows)
    if max(r["depth"] for r in batch) < 2:
        raise WorkbenchError("the gradient audit needs rows of depth >= 2 (loop 1 never reaches the re-entry)")
    audit = gradient_audit(model, batch, tokenizer=tokenizer, eps=eps, seed=seed)
    grads = audit[audit["check"] == "loop_grad"].pivot_table(index=["loop", "group"], columns="metric",
                                                             values="value").reset_index()
    grads.columns.name = None
    fd = audit[audit["check"] == "finite_difference"].set_index("metric")["value"]
    fd_table = pd.DataFrame([{"direction": "random", "autograd": fd["autograd"],
                              "finite_difference": fd["finite_difference"], "rel_error": fd["rel_error"]}])
    return {"gradient_audit": grads[["loop", "group", "grad_rms", "zero_fraction"]], "gradient_audit__fd": fd_table}


def spread(rows: list[dict], n: int) -> list[dict]:
    """Returns up to n rows taken round-robin over the depths (deepest first), so the batch spans depths."""
    by_depth: dict[int, list[dict]] = {}
    for r in rows:
        by_depth.setdefault(r["depth"], []).append(r)
    queues = [by_depth[d] for d in sorted(by_depth, reverse=True)]
    out = []
    while len(out) < n and any(queues):
        for q in queues:
            if q and len(out) < n:
                out.append(q.pop(0))
    return out


def summarize(tables: dict[str, pd.DataFrame]) -> dict:
    """Headline numbers: gradient RMS per group at loop 2 (where re-entry first acts) and the FD error."""
    g = tables["gradient_audit"]
    fd = tables["gradient_audit__fd"].iloc[0]
    at2 = g[g["loop"] == 2] if (g["loop"] == 2).any() else g[g["loop"] == g["loop"].max()]
    return {"grad_rms_loop2": {r.group: float(r.grad_rms) for r in at2.itertuples()},
            "fd_rel_error": float(fd["rel_error"]), "fd_autograd": float(fd["autograd"]),
            "fd_finite_difference": float(fd["finite_difference"]), "headline": headline(tables).to_dict()}


@probe_options
class Options:
    """The gradient audit's options (`run`'s keywords), checked before any probe of a battery runs."""

    n_rows: Count = 4
    eps: float = 1e-3
    seed: int = 0


SPEC = ProbeSpec(
    name="gradient_audit", parts=("fd",), run=run, summarize=summarize,
    needs=("prompt", "answer", "symbols", "chain", "depth", "table", "start", FUNCTION_TABLE),
    requires=("trained_adapters",),
    options=Options,
)
