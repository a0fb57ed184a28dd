"""scripts/memory_vs_plain.py pairs two loop_accuracy results row by row at every loop count."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pandas as pd
import pytest

from workbench.errors import WorkbenchError

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "memory_vs_plain.py"


def _script():
    spec = importlib.util.spec_from_file_location("memory_vs_plain", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _results(folder: Path, correct) -> Path:
    folder.mkdir(parents=True)
    rows = [(f"r{i}", 2 + i % 2, t, "A", correct(i, t)) for i in range(10) for t in (1, 2, 3)]
    pd.DataFrame(rows, columns=["row_id", "depth", "loop", "predicted", "correct"]).to_parquet(
        folder / "loop_accuracy.parquet")
    return folder


def test_memory_vs_plain_counts_helped_and_hurt_per_loop_and_at_each_depth(tmp_path):
    plain = _results(tmp_path / "plain", lambda i, t: (i + t) % 2 == 0)        # half right at every loop
    memory = _results(tmp_path / "memory", lambda i, t: t >= 2)                # right from loop 2 on
    _script().main([str(plain), str(memory), "--out", str(tmp_path / "out")])
    rec = json.loads((tmp_path / "out" / "memory_vs_plain.json").read_text())
    loop1, loop2 = rec["per_loop"][0], rec["per_loop"][1]
    assert (loop1["plain"], loop1["memory"], loop1["helped"], loop1["hurt"]) == (5, 0, 0, 5)
    assert (loop2["plain"], loop2["memory"], loop2["helped"], loop2["hurt"]) == (5, 10, 5, 0)
    assert loop2["p_mcnemar"] == pytest.approx(2 / 2 ** 5)                      # exact, two-sided
    # at loops = depth: depth-2 rows (even i) read at loop 2, depth-3 rows (odd i) at loop 3
    at = {r["depth"]: r for r in rec["at_depth"]}
    assert at[2]["n"] == 5 and at[2]["memory"] == 5 and at[3]["memory"] == 5
    assert "| 2 | 10 | 5 (0.500) | 10 (1.000) | 5 | 0 | 0.0625 |" in (tmp_path / "out" / "MEMORY_VS_PLAIN.md").read_text()


def test_results_on_other_rows_are_refused(tmp_path):
    plain = _results(tmp_path / "plain", lambda i, t: True)
    other = tmp_path / "other"
    other.mkdir()
    pd.DataFrame([("x", 2, 1, "A", True)], columns=["row_id", "depth", "loop", "predicted", "correct"]).to_parquet(
        other / "loop_accuracy.parquet")
    with pytest.raises(WorkbenchError, match="same rows and loops"):
        _script().main([str(plain), str(other), "--out", str(tmp_path / "out")])
