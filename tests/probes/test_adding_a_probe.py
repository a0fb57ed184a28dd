"""A probe with a headline and a section of its own: its compute module, its headline, its section, its test and its
battery entry, nothing else (a probe with neither is one module: tests/probes/test_one_module_probe.py).

This file is a whole probe, declared the way docs/adding-a-probe.md says: a compute (`run`, `summarize`, `SPEC`), a
headline (`headline`) and a section with a figure and its caption (`SECTIONS`), which in the package live in three
modules named after the probe, each found by name. A test hands the three to `PROBES`, `HEADLINE_MODULES` and
`SECTION_MODULES` (as each side's `discover` does for a module of the package) and finds the probe in the battery, the
report and `workbench figures` without any registry being edited; a second test shows a module dropped into a probes
folder is found by its SPEC.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
import pytest
import typer
from typer.testing import CliRunner

from workbench.analysis.headlines import HEADLINE_MODULES, Headline, proportion
from workbench.commands.figures import figures as figures_command
from workbench.plots.registry import SECTION_MODULES, Figure, Section
from workbench.plots.report import write_report
from workbench.probes import PROBES
from workbench.probes.battery import run_battery
from workbench.probes.common import read_final
from workbench.probes.options import Count, probe_options
from workbench.probes.spec import ProbeSpec
from workbench.tasks import build_rows
from workbench.tasks.manifest import write_manifest

UNTRAINED = "untrained:tiny-llama:2:4"
TITLE = "First-loop answers"
CAPTION = "Final-answer accuracy per depth after one loop. Predicted: falling with depth, one step per loop."


def run(model, tokenizer, rows: list[dict], batch_size: int = 16, progress: bool = False) -> pd.DataFrame:
    """Returns each row's final answer after one loop: row_id, depth, correct."""
    read = read_final(model, tokenizer, rows, 1, batch_size, progress)
    return pd.DataFrame({"row_id": [r["row_id"] for r in rows], "depth": [int(r["depth"]) for r in rows],
                         "correct": read.correct[:, 0]})


def headline(tables: dict[str, pd.DataFrame]) -> Headline:
    number = proportion("loop_1", "final answer at loop 1", tables["first_loop"].set_index("row_id")["correct"])
    return Headline("first_loop", [number], f"After one loop the final answer reads {number.text()}.")


def summarize(tables: dict[str, pd.DataFrame]) -> dict:
    return {"rows": len(tables["first_loop"]), "headline": headline(tables).to_dict()}


def first_loop_figure(first_loop: pd.DataFrame) -> go.Figure:
    accuracy = first_loop.groupby("depth")["correct"].mean()
    return go.Figure(go.Bar(x=accuracy.index.tolist(), y=accuracy.tolist(), name="loop 1"))


@probe_options
class Options:
    batch_size: Count = 16
    progress: bool = False


SPEC = ProbeSpec(name="first_loop", run=run, summarize=summarize, options=Options)

SECTIONS = {"first_loop": Section(title=TITLE, about="The final answer read after a single loop, per depth.",
                                  figures=(Figure(first_loop_figure, CAPTION),))}


def test_a_probe_declared_in_its_module_reaches_the_battery_the_report_and_the_figures(monkeypatch, tmp_path, tok):
    monkeypatch.setitem(PROBES, "first_loop", __name__)  # what discover() does for a module inside the package
    monkeypatch.setitem(HEADLINE_MODULES, "first_loop", __name__)  # and the headlines' discover()
    monkeypatch.setitem(SECTION_MODULES, "first_loop", __name__)  # and the plots' discover()
    manifest = tmp_path / "rows.jsonl"
    write_manifest(build_rows("chase", [1, 2, 3], 4, 5, alphabet=4, tokenizer=tok), manifest)
    out = tmp_path / "results"
    summary = run_battery(UNTRAINED, None, out, rows=str(manifest), only=["first_loop"], progress=False,
                          finish=lambda staging: write_report(staging, shown_as=out))

    table = pd.read_parquet(out / "first_loop.parquet")  # the battery ran it and wrote its table
    assert len(table) == 12 and sorted(table["depth"].unique()) == [1, 2, 3]
    assert summary["probes"]["first_loop"]["rows"] == 12
    assert summary["probes"]["first_loop"]["headline"]["numbers"][0]["value"] == pytest.approx(table["correct"].mean())

    page = (out / "report.html").read_text()  # its section, its headline and its figure with the caption
    assert f"<h2 id='first_loop'>{TITLE}</h2>" in page and f"<a href='#first_loop'>{TITLE}</a>" in page
    assert "After one loop the final answer reads" in page
    assert 'id="fig-first_loop"' in page and f"data-figure='first_loop'>{CAPTION}</p>" in page

    app = typer.Typer()
    app.command()(figures_command)
    figs = tmp_path / "figs"
    res = CliRunner().invoke(app, ["--results", str(out), "--format", "html", "--out", str(figs)])
    assert res.exit_code == 0, res.output
    assert (figs / "results" / "first_loop.html").is_file()
    drawn = pd.read_csv(figs / "results" / "first_loop.csv")  # the numbers the exported figure shows
    expected = table.groupby("depth")["correct"].mean()
    assert drawn["x"].tolist() == expected.index.tolist() and drawn["y"].tolist() == expected.tolist()



def test_the_guide_quotes_real_declarations():
    """docs/adding-a-probe.md shows the loop-accuracy probe's SPEC, its headline and its section; each must be what
    its module holds."""
    root = Path(__file__).resolve().parents[2]
    guide = (root / "docs" / "adding-a-probe.md").read_text()
    for start, module, lines in (("SPEC = ProbeSpec(", "probes/loop_accuracy.py", 2),
                                 ("def headline(", "analysis/headlines/loop_accuracy.py", 10),
                                 ("SECTIONS = {", "plots/loop_accuracy.py", 10)):
        quoted = guide[guide.index("```python\n" + start) + len("```python\n"):].split("\n```", 1)[0]
        assert quoted.count("\n") > lines and quoted in (root / "workbench" / module).read_text(), module


def test_a_module_that_declares_a_spec_is_found_without_an_entry(tmp_path):
    """`discover` lists a probes folder's modules by their top-level `SPEC = ProbeSpec(`: the shipped ones in the
    probe order (`workbench.defaults.PROBE_ORDER`), a new one after them, and a helper module (no SPEC, or a SPEC
    only mentioned in a docstring) not at all."""
    from workbench.defaults import PROBE_ORDER
    from workbench.probes import discover

    shipped = Path(__file__).resolve().parents[2] / "workbench" / "probes"
    assert list(discover(shipped)) == list(PROBE_ORDER) == list(PROBES)
    for name in ("depth_matrix", "overshoot"):
        (tmp_path / f"{name}.py").write_text((shipped / f"{name}.py").read_text())
    (tmp_path / "first_loop.py").write_text(Path(__file__).read_text())
    (tmp_path / "common.py").write_text('"""helpers; a probe declares\nSPEC = ProbeSpec(...) at its top level"""\n')
    (tmp_path / "_private.py").write_text("SPEC = ProbeSpec(name='x')\n")
    assert discover(tmp_path) == {"depth_matrix": "workbench.probes.depth_matrix",
                                  "overshoot": "workbench.probes.overshoot", "first_loop": "workbench.probes.first_loop"}
