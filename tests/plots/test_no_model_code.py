"""Drawing a results directory loads no model code: the report, every figure and the terminal's headline table, in a
fresh interpreter, with no torch, transformers, probe, looped model, training or model loader among its modules.

tests/test_imports.py reads the import statements (and the module names a module loads by name); this looks at what
an interpreter actually loaded, which no reading of the source can miss.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import synthetic

ROOT = Path(__file__).resolve().parents[2]
MODEL_CODE = ("workbench.probes", "workbench.loop", "workbench.train", "workbench.models", "workbench.runs",
              "workbench.models.native", "workbench.selection")

RENDER = """
import io, json, sys
from rich.console import Console
from workbench.analysis.headlines import headlines_from_summary
from workbench.analysis.results import read_summary
from workbench.plots.export import export_figures
from workbench.plots.report import write_report
from workbench.plots.terminal import print_headlines

results, out = sys.argv[1], sys.argv[2]
report = write_report(results, out=out + "/report.html")
done = export_figures([results], fmt="html", out=out + "/figures")
print_headlines(headlines_from_summary(read_summary(results)), out=Console(file=io.StringIO(), width=100))
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "transformers")
               or m.startswith(tuple(sys.argv[3].split(","))))
print(json.dumps({"torch": "torch" in sys.modules, "loaded": heavy[:20], "report": report.stat().st_size,
                  "figures": sorted(p.stem for p in done.written if p.suffix == ".html")}))
"""


@pytest.mark.slow   # a fresh interpreter: what an import pulls in is only visible from a clean start
def test_rendering_a_results_directory_imports_no_torch_and_no_model_code(tmp_path):
    # written here, not in the fresh interpreter: the synthetic loop-dynamics tables come from the probes' own
    # table functions (tests/plots/synthetic.py)
    results = synthetic.write_results(tmp_path / "results")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-c", RENDER, str(results), str(tmp_path), ",".join(MODEL_CODE)],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert seen["torch"] is False and seen["loaded"] == []
    assert seen["report"] > 1_000_000   # the page, with plotly.js and every section, was written
    assert {"depth_matrix", "frontier", "loop_accuracy", "splice", "exit_rules", "paths"} <= set(seen["figures"])
    assert len(seen["figures"]) >= 20
