"""The full-block arm's committed numbers are regenerable: its first steps, rerun from the committed recipe, give the
metrics.jsonl lines it ships (its 170 MB of trained block weights are not committed, so this is the check that the
specimen's numbers come from the code and recipe in the repository)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

SPECIMEN = Path(__file__).resolve().parents[2] / "training" / "keepers" / "smollm2-chase-full-block"
STEPS = 3


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


@pytest.mark.slow
def test_full_block_arm_first_steps_match_metrics(tmp_path):
    from workbench.precision import detect_hardware
    from workbench.train.trainer import train

    prov = json.loads((SPECIMEN / "provenance.json").read_text())
    assert prov["status"] == "finished" and not (SPECIMEN / "trainable.safetensors").exists()
    recorded = prov["precision"]
    summary = train(SPECIMEN / "recipe.toml", out=tmp_path / "run", stop_after=STEPS, progress=False)
    assert summary["steps"] == STEPS and not summary["finished"]
    fresh = _lines(tmp_path / "run" / "metrics.jsonl")
    committed = _lines(SPECIMEN / "metrics.jsonl")
    hw = detect_hardware("cpu")
    # bit-for-bit needs the same arithmetic: the same precision and the same bf16 units (AMX and AVX512-BF16
    # kernels round differently); elsewhere the same steps agree to bf16 rounding.
    same_arith = recorded["hardware"]["bf16_units"] == hw.bf16_units or recorded["used"] == "fp32"
    tol = 0.0 if same_arith else 2e-2

    def close(a, b):
        return a == b if tol == 0.0 else math.isclose(a, b, rel_tol=tol, abs_tol=1e-4)

    for kind in ("train", "guardrail", "eval"):
        ours = [r for r in fresh if r["kind"] == kind and r["step"] <= STEPS]
        theirs = [r for r in committed if r["kind"] == kind and r["step"] <= STEPS]
        assert len(ours) == len(theirs) > 0 or kind == "eval" and not theirs, kind
        for a, b in zip(ours, theirs):
            if kind == "train":
                assert a["step"] == b["step"] and a["loops"] == b["loops"]
                assert close(a["loss"], b["loss"]), (a["step"], a["loss"], b["loss"])
                assert all(close(x, y) for x, y in zip(a["loop_ce"], b["loop_ce"]))
                assert a["lr"] == b["lr"]
            elif kind == "guardrail":
                assert a["correct"] == b["correct"], (a, b)   # the base's reading, 64 questions
            else:
                assert a["acc"] == b["acc"]
