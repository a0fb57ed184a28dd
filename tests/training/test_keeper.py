"""The shipped keeper (training/keepers/smollm2-chase) loads strictly and reproduces its numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

KEEPER = Path(__file__).resolve().parents[2] / "training" / "keepers" / "smollm2-chase"


@pytest.mark.specimen
def test_keeper_loads_and_reproduces_its_held_out_accuracy():
    from workbench.runs import base_sha256, load_run
    from workbench.tasks.chase import chase_rows
    from workbench.train.evaluate import evaluate

    looped, tok, info = load_run(KEEPER, precision="recorded")  # its evaluations ran in the training precision
    assert info["provenance"]["base_unchanged"] is True
    # load_run checked the base's SHA-256 in fp32 before casting it to the recorded precision
    assert info["provenance"]["precision"]["used"] == "bf16" and base_sha256(looped.base) != ""
    evals = [json.loads(x) for x in (KEEPER / "metrics.jsonl").read_text().splitlines() if '"eval"' in x]
    final = evals[-1]
    assert final["step"] == info["provenance"]["steps"]
    e, t = info["recipe"]["eval"], info["recipe"]["task"]
    rows = chase_rows(t["alphabet"], [1, 2], e["per_depth"], e["seed"], tokenizer=tok, split="test")
    held = info["provenance"]["manifests"]["heldout"]
    assert held["depths"] == e["depths"] and held["rows"] == e["per_depth"] * len(e["depths"])
    matrix, _ = evaluate(looped, tok, rows, batch_size=e["batch_size"])
    assert matrix == {d: final["acc"][d] for d in ("1", "2")}  # the same rows, the same reader, same numbers
