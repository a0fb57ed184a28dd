"""Capability guardrail: a fixed 64-row single-digit arithmetic battery scored at loop 1.

The retrofit paper's 64-row "Tier-1 arithmetic check" with its hard stop: a drop of more
than 3 points (60/64 -> 58/64 stopped a run; 59/64 against 60/64 passed). Each row is a few-shot
prompt ending in "= ", and the ten digits are the candidates: SmolLM2 (like Qwen2.5 and
Llama 3) writes " 7" as a space token then a digit token, so after a trailing space the
digit is one token. Rows are scored through the one reader (`read_rows`, loops=1).
The embedded SmolLM2 (4-bit, dequantized) scores 49/64 on it, so there is room to lose.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from workbench.analysis.stats import paired_counts
from workbench.defaults import MAX_DROP_POINTS
from workbench.errors import WorkbenchError
from workbench.guardrail_set import (  # noqa: F401  (the rows are declared there, without torch; re-exported)
    DIGITS,
    GUARDRAIL_ROWS,
    GUARDRAIL_SEED,
    GUARDRAIL_VERSION,
    SHOTS,
    guardrail_rows,
)
from workbench.tasks.manifest import rows_sha256
from workbench.tasks.reader import read_rows
from workbench.tasks.reading_cache import keep, read_kept, reading_key

log = logging.getLogger(__name__)
KEPT = "guardrail"   # the reading cache's folder for guardrail readings

# MAX_DROP_POINTS, the allowed drop (3.0), is stated once in workbench.defaults: the recipe's guardrail.max_drop
# reads it there without importing this module (and torch).


@dataclass(frozen=True)
class GuardrailCounts:
    """Battery result: `correct` of `total`, per-row correctness, and the battery's digest."""

    correct: int
    total: int
    per_row: dict[str, bool]
    battery_sha256: str


@dataclass(frozen=True)
class GuardrailComparison:
    """Before/after counts with the exact paired McNemar test on row-paired correctness."""

    before: int
    after: int
    total: int
    helped: int  # wrong before, right after
    hurt: int  # right before, wrong after
    p_value: float

    @property
    def drop_points(self) -> float:
        """Accuracy lost, in percentage points (negative when it rose)."""
        return 100.0 * (self.before - self.after) / self.total


def guardrail_counts(model, tokenizer, batch_size: int = 16) -> GuardrailCounts:
    """Returns the battery scored at loop 1 through `model.read` (for a retrofit, loop 1 is the base).

    A reading of the same computation on this machine is read back from the reading cache
    (`workbench.tasks.reading_cache`: the model's tensors, settings, inputs, machine and code in its key).
    """
    rows = guardrail_rows()
    key = reading_key(model, tokenizer, rows, loops=1, batch_size=batch_size)
    kept = read_kept(KEPT, key)
    if kept is not None and list(kept.get("per_row", {})) == [r["row_id"] for r in rows]:
        log.info("guardrail: the reading kept under %s", key[:16])
        per_row = {k: bool(v) for k, v in kept["per_row"].items()}
        return GuardrailCounts(sum(per_row.values()), len(rows), per_row, rows_sha256(rows))
    result = read_rows(model, tokenizer, rows, loops=1, batch_size=batch_size)
    frame = result.frame()
    per_row = {row: bool(c) for row, c in zip(frame["row_id"], frame["correct"])}
    keep(KEPT, key, {"per_row": per_row})
    return GuardrailCounts(sum(per_row.values()), len(rows), per_row, rows_sha256(rows))


def guardrail_compare(before: GuardrailCounts, after: GuardrailCounts) -> GuardrailComparison:
    """Returns the paired comparison of two battery results.

    Raises:
        WorkbenchError: the two were computed on different batteries.
    """
    if before.battery_sha256 != after.battery_sha256 or before.per_row.keys() != after.per_row.keys():
        raise WorkbenchError("refusing to compare guardrail results from different batteries")
    c = paired_counts([before.per_row[r] for r in before.per_row], [after.per_row[r] for r in before.per_row])
    return GuardrailComparison(before.correct, after.correct, before.total, c.helped, c.hurt, c.p_mcnemar)


def passes(before: GuardrailCounts, after: GuardrailCounts, max_drop: float = MAX_DROP_POINTS) -> bool:
    """Returns whether the battery lost at most `max_drop` percentage points (training's hard stop)."""
    return guardrail_compare(before, after).drop_points <= max_drop
