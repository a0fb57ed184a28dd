"""`workbench compare` labels each side with its own values: its own top head, its own null."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd

from tests.test_cli_errors import invoke

BATTERY = Path(__file__).resolve().parents[1] / "training" / "keepers" / "smollm2-chase" / "battery"


def test_each_side_is_labelled_with_its_own_top_head_and_null(capsys, monkeypatch, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(BATTERY, a)
    shutil.copytree(BATTERY, b)
    heads = pd.read_parquet(b / "heads__summary.parquet")   # B: every head renumbered, its null doubled
    heads["head"] = (heads["head"] + 1) % (heads["head"].max() + 1)
    heads["null_p95"] = heads["null_p95"] * 2
    heads.to_parquet(b / "heads__summary.parquet", index=False)
    code, out, err = invoke(capsys, monkeypatch, "compare", a, b, "--out", tmp_path / "cmp")
    assert code == 0, err
    records = {r["key"]: r for r in json.loads((tmp_path / "cmp" / "compare.json").read_text())["headlines"]}
    top = records["top_head_loop2"]
    assert "(L23H2)" in top["label_a"] and "(L23H3)" in top["label_b"] and top["a_value"] == top["b_value"]
    lines = [line.strip() for line in out.splitlines()]   # the quantity column folds a label over two lines
    shown = [" ".join(lines[i:i + 2]) for i, line in enumerate(lines) if line.startswith(("A: loop 2: rows",
                                                                                         "B: loop 2: rows"))]
    assert len(shown) == 2 and "(L23H2)" in shown[0] and "(L23H3)" in shown[1], shown
    same = records["final_d1"]   # a label with no value of its own: one line, as before
    assert same["label_a"] == same["label_b"] and not any(line.startswith("A: final") for line in lines)
    assert "rows both read: 224 of chase_n8_d1-7.jsonl" in out
