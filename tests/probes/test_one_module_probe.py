"""Adding a probe is one new module: dropped into a copy of the package, it reaches the battery, the report and
`workbench figures`, with nothing else edited.

The copy is the real package (`workbench/`, copied to a temporary folder, its data links pointing back at the
repository's data) with one file added, `workbench/probes/first_loop.py`: a compute (`run`, `summarize`, `SPEC`) and
nothing else. It declares no headline module and no section; the report shows it as its table's section and
`workbench figures` exports its table figure (`workbench.plots.registry.table_section`). The commands run in fresh
interpreters on that copy, as a contributor's checkout would.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]

FIRST_LOOP = '''"""first_loop: the final answer read after one loop, per row.

Tables:
    first_loop    row_id, depth, correct    one row per row
"""

import pandas as pd

from workbench.probes.common import read_final
from workbench.probes.options import Count, probe_options
from workbench.probes.spec import ProbeSpec


def run(model, tokenizer, rows: list[dict], batch_size: int = 16, progress: bool = True) -> pd.DataFrame:
    """Returns each row's final answer after one loop: row_id, depth, correct."""
    read = read_final(model, tokenizer, rows, 1, batch_size, progress)
    return pd.DataFrame({"row_id": [r["row_id"] for r in rows], "depth": [int(r["depth"]) for r in rows],
                         "correct": read.correct[:, 0]})


def summarize(tables: dict[str, pd.DataFrame]) -> dict:
    return {"rows": len(tables["first_loop"]), "accuracy": float(tables["first_loop"]["correct"].mean())}


@probe_options
class Options:
    batch_size: Count = 16
    progress: bool = True


SPEC = ProbeSpec(name="first_loop", run=run, summarize=summarize, needs=("prompt", "answer", "symbols", "depth"),
                 options=Options)
'''

MANIFEST = """
from workbench.models import load_tokenizer
from workbench.tasks import build_rows
from workbench.tasks.manifest import write_manifest
write_manifest(build_rows("chase", [1, 2, 3], 4, 5, alphabet=4, tokenizer=load_tokenizer()), "rows.jsonl")
"""


def copy_package(dest: Path) -> Path:
    """Copies workbench/ under `dest`; its data links (workbench/data/probes, training, figures) point back at the
    repository's folders. Returns the copy's root (the folder holding `workbench/`)."""
    shutil.copytree(ROOT / "workbench", dest / "workbench", symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__"))
    for link in (dest / "workbench").rglob("*"):
        if link.is_symlink():
            target = ((ROOT / "workbench" / link.relative_to(dest / "workbench")).parent / os.readlink(link)).resolve()
            link.unlink()
            link.symlink_to(target)
    return dest


@pytest.mark.slow  # four fresh interpreters on a copy of the package: about a minute; `make test` runs it
def test_a_probe_dropped_into_the_package_reaches_the_battery_the_report_and_the_figures(tmp_path):
    pkg = copy_package(tmp_path / "checkout")
    (pkg / "workbench" / "probes" / "first_loop.py").write_text(FIRST_LOOP)
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": str(pkg)}

    def run(*args: str) -> str:
        done = subprocess.run([sys.executable, *args], cwd=work, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout

    where = run("-c", "import workbench, workbench.probes as p; print(workbench.__file__); print(list(p.PROBES)[-1])")
    assert where.split() == [str(pkg / "workbench" / "__init__.py"), "first_loop"]  # the copy, with the new probe
    run("-c", MANIFEST)
    run("-m", "workbench", "probe", "--checkpoint", "untrained:tiny-llama:2:4", "--rows", "rows.jsonl",
        "--only", "first_loop", "--out", "results", "-q")

    table = pd.read_parquet(work / "results" / "first_loop.parquet")  # the battery ran it and wrote its table
    assert len(table) == 12 and sorted(table["depth"].unique()) == [1, 2, 3]
    summary = json.loads((work / "results" / "summary.json").read_text())
    assert summary["probes"]["first_loop"]["rows"] == 12
    assert summary["probes"]["first_loop"]["accuracy"] == float(table["correct"].mean())

    page = (work / "results" / "report.html").read_text()  # its section, with its table drawn
    assert "<h2 id='first_loop'>first_loop</h2>" in page and "<a href='#first_loop'>first_loop</a>" in page
    assert 'id="fig-first_loop"' in page and "data-figure='first_loop'>The probe&#x27;s main table" in page

    run("-m", "workbench", "figures", "--results", "results", "--format", "html", "--out", "figs", "-q")
    assert (work / "figs" / "results" / "first_loop.html").is_file()
    drawn = pd.read_csv(work / "figs" / "results" / "first_loop.csv")  # the numbers the exported figure shows
    assert drawn["row_id"].tolist() == table["row_id"].tolist()
    assert drawn["correct"].tolist() == table["correct"].tolist()


def test_the_battery_refuses_a_table_the_spec_does_not_declare(monkeypatch, tmp_path, tok):
    """A probe's SPEC lists the tables it writes (its main one and its `parts`); a table it returns beyond them is
    refused by name, before anything is written, so a results directory holds only declared tables."""
    import dataclasses
    import importlib

    import pytest

    from workbench.errors import WorkbenchError
    from workbench.probes import PROBES, get_probe
    from workbench.probes.battery import run_battery
    from workbench.tasks import build_rows
    from workbench.tasks.manifest import write_manifest

    spec = get_probe("loop_accuracy")
    assert spec.tables == ("loop_accuracy",) and get_probe("logit_lens").tables == ("logit_lens", "logit_lens__top")
    def run(*args, **kwargs):
        table = spec.run(*args, **kwargs)
        return {"loop_accuracy": table, "loop_accuracy__extra": table}

    monkeypatch.setattr(importlib.import_module(PROBES["loop_accuracy"]), "SPEC", dataclasses.replace(spec, run=run))
    write_manifest(build_rows("chase", [1, 2], 2, 5, alphabet=4, tokenizer=tok), tmp_path / "rows.jsonl")
    with pytest.raises(WorkbenchError, match="loop_accuracy__extra; declared: loop_accuracy "):
        run_battery("untrained:tiny-llama:2:4", None, tmp_path / "out", rows=str(tmp_path / "rows.jsonl"),
                    only=["loop_accuracy"], progress=False)
    assert not (tmp_path / "out").exists()
