"""scripts/final_answers.py reads any arm's final answers and latency on a manifest, and the arms comparison pairs a
dense control with a looped arm through those files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from workbench.analysis.arms import compare_arms, load_arm
from workbench.models import load_base
from workbench.plots.arms import controls_figure
from workbench.runs import load_run
from workbench.tasks.chase import chase_rows
from workbench.tasks.manifest import write_manifest
from workbench.tasks.reader import read_rows
from workbench.train.trainer import train

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # an end-to-end run: trains two arms, runs scripts/final_answers.py
def test_final_answers_for_a_looped_and_a_direct_arm(write_recipe, tmp_path):
    lora = {"train": {"block": False}, "lora": {"enabled": True, "r": 4, "alpha": 8}}
    looped = write_recipe("looped.toml", **lora)
    direct = write_recipe("direct.toml", **lora, stages=[{"kind": "direct", "depths": [1, 2], "steps": 2}])
    for name, path in (("looped", looped), ("direct", direct)):
        train(path, out=tmp_path / name, progress=False)
    _, tok = load_base("tiny-llama")
    rows = chase_rows(4, [1, 2, 3], 3, 11, tokenizer=tok, split="test")
    write_manifest(rows, tmp_path / "m.jsonl")
    for name in ("looped", "direct"):
        out = subprocess.run([sys.executable, str(ROOT / "scripts" / "final_answers.py"), str(tmp_path / name),
                              "--out", str(tmp_path / name / "arms"), "--manifest", str(tmp_path / "m.jsonl"),
                              "--latency-rows", "1", "--repeats", "1"], capture_output=True, text=True, cwd=tmp_path)
        assert out.returncode == 0, out.stderr[-2000:]
        rec = json.loads((tmp_path / name / "arms" / "final.json").read_text())
        assert rec["kind"] == name and rec["support"] == 2 and rec["rows"] == 9
        lat = pd.read_parquet(tmp_path / name / "arms" / "latency.parquet")
        assert lat["depth"].tolist() == [1, 2, 3] and (lat["median_s"] > 0).all()
    a, b = (load_arm(tmp_path / n, tmp_path / n / "arms") for n in ("looped", "direct"))
    out = compare_arms(a, b)
    assert out["depths"]["n"].tolist() == [3, 3, 3] and a.latency is not None
    for arm in (a, b):  # every arm carries its guardrail reading (fp32, loop 1 against the base)
        assert arm.guardrail is not None and arm.guardrail["total"] == 64
        assert json.loads((arm.results_dir / "final.json").read_text())["guardrail"] == arm.guardrail
    # the looped arm's answers are its loop-d reads: the same as a depth-matrix read of the run
    f = pd.read_parquet(tmp_path / "looped" / "arms" / "final.parquet").set_index("row_id")
    model, tok2, _ = load_run(tmp_path / "looped")
    for d in (1, 2, 3):
        sub = [r for r in rows if r["depth"] == d]
        ref = read_rows(model, tok2, sub, loops=d).frame()
        ref = ref[ref["loop"] == d].set_index("row_id")
        assert (f.loc[ref.index, "predicted"] == ref["predicted"]).all()
    # the controls report pairs every arm with the first, and its figure draws the table it writes
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "dense_controls.py"), str(tmp_path / "looped"),
                          str(tmp_path / "direct"), "--out", str(tmp_path / "cmp"), "--results", "arms"],
                         capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    rec = json.loads((tmp_path / "cmp" / "controls.json").read_text())
    (pair,) = rec["pairs"].values()
    assert pair["pooled"]["all"]["n"] == 9 and pair["pooled"]["all"]["a_correct"] == int(a.final["correct"].sum())
    table = pd.DataFrame(rec["arms"])
    assert sorted(table["kind"].unique()) == ["direct", "looped"] and (table["n"] == 3).all()
    fig = controls_figure(table, support=2)
    by_depth = [t for t in fig.data if t.xaxis == "x"][0]            # panel A, the reference arm
    ref = table[table["arm"] == rec["reference"]].sort_values("depth")
    assert list(by_depth.y) == list(ref["correct"] / ref["n"])
    on_latency = [t for t in fig.data if t.xaxis == "x2"][0]         # panel B: the same accuracies against latency
    assert list(on_latency.x) == list(1e3 * ref["median_s"]) and list(on_latency.y) == list(by_depth.y)
    (shade,) = [s for s in fig.layout.shapes if s.type == "rect"]      # the trained support, in panel A
    assert (shade.xref, shade.x0, shade.x1) == ("x", 0.5, 2.5)
    assert "| d1 | d2 | d3 |" in (tmp_path / "cmp" / "CONTROLS.md").read_text()
