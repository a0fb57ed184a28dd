"""The shipped keeper (training/keepers/smollm2-chase) loads strictly and reproduces its numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

KEEPER = Path(__file__).resolve().parents[2] / "training" / "keepers" / "smollm2-chase"


def first_batch(rows: list[dict], tok, batch_size: int) -> list[dict]:
    """Each depth's rows that the held-out reading put in its first batch: the reader orders a depth's rows by
    token length (stable) and reads them `batch_size` at a time, so these rows read alone form the same batch."""
    out = []
    for depth in sorted({r["depth"] for r in rows}):
        subset = [r for r in rows if r["depth"] == depth]
        order = sorted(range(len(subset)), key=lambda i: len(tok.encode(subset[i]["prompt"])))  # sorted() is stable
        out += [subset[i] for i in sorted(order[:batch_size])]
    return out


@pytest.mark.specimen
def test_keeper_loads_and_reproduces_its_held_out_accuracy():
    """The keeper, loaded strictly in its recorded precision, reads its held-out rows as its last evaluation did.
    That evaluation was right on every row at depths 1-2 (accuracy 1.0 at every loop), so each of those rows is a
    claim this test can check alone: it reads the rows of each depth's first batch (16 of 64; the same batch, so
    the same arithmetic where the CPU matches the recording), a quarter of the reads (bf16 emulated on a CPU
    without bf16 units took 269 s for all 128)."""
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
    recorded = {d: final["acc"][d] for d in ("1", "2")}
    assert recorded == {"1": {"1": 1.0}, "2": {"1": 1.0, "2": 1.0}}  # every row right: any of them can be read alone
    e, t = info["recipe"]["eval"], info["recipe"]["task"]
    rows = chase_rows(t["alphabet"], [1, 2], e["per_depth"], e["seed"], tokenizer=tok, split="test")
    held = info["provenance"]["manifests"]["heldout"]
    assert held["depths"] == e["depths"] and held["rows"] == e["per_depth"] * len(e["depths"])
    first = first_batch(rows, tok, e["batch_size"])
    assert len(first) == 2 * e["batch_size"]
    matrix, frame = evaluate(looped, tok, first, batch_size=e["batch_size"])
    assert matrix == recorded, frame[~frame["correct"]]  # the same rows, the same reader, the same answers
