"""The run's capability guardrail: loop 1 scored against the base (`workbench.tasks.guardrail`), judged and recorded.

`read_guardrail` scores a model (eval mode, no gradient, its training mode restored); `judge_guardrail` compares a
reading with the base's and returns whether the run may go on with the metrics.jsonl record saying why;
`guardrail_provenance` gathers a run's readings from its metrics.jsonl for provenance.json. Each takes plain
arguments, so a test calls it on a tiny model without a recipe.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from workbench.tasks.guardrail import GuardrailCounts, guardrail_compare, guardrail_counts


def read_guardrail(looped, tokenizer) -> GuardrailCounts:
    """Returns the guardrail's counts of `looped` at loop 1, read in eval mode; the model's mode is restored."""
    was_training = looped.training
    looped.eval()
    with torch.no_grad():
        counts = guardrail_counts(looped, tokenizer)
    looped.train(was_training)
    return counts


def judge_guardrail(base: GuardrailCounts, now: GuardrailCounts, max_drop: float, step: int) -> tuple[bool, dict]:
    """Returns (whether the run may go on: at most `max_drop` points below the base, the metrics.jsonl record)."""
    cmp = guardrail_compare(base, now)
    passed = cmp.drop_points <= max_drop
    return passed, {"kind": "guardrail", "step": step, "correct": now.correct, "total": now.total,
                    "base": cmp.before, "drop_points": round(cmp.drop_points, 4), "helped": cmp.helped,
                    "hurt": cmp.hurt, "p_value": cmp.p_value, "max_drop": max_drop, "passed": passed}


def guardrail_provenance(base: GuardrailCounts | None, metrics: Path, max_drop: float) -> dict | None:
    """The guardrail readings of a run, from its metrics.jsonl (the base's and every later one); None when off."""
    if base is None:
        return None
    readings = [json.loads(line) for line in metrics.read_text().splitlines() if '"guardrail"' in line]
    readings = [r for r in readings if r.get("kind") == "guardrail"]
    return {"battery_sha256": base.battery_sha256, "base": base.correct, "total": base.total, "max_drop": max_drop,
            "final": readings[-1]["correct"] if readings else None,
            "readings": [[r["step"], r["correct"]] for r in readings]}
