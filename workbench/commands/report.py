"""`workbench report`: a results directory → one self-contained offline HTML report."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from workbench.commands.output import JSON, QUIET, Output
from workbench.guard import FILES, OutputKind


def report_file(path: Path) -> bool:
    """Whether `path` is a page the workbench generated, as a report (`workbench.plots.report`) is: HTML whose
    generator tag names the workbench, or, written before the tag, carrying the report's render-status line."""
    if not path.name.endswith(".html"):
        return False
    try:
        page = path.read_bytes()  # a report is a few MB: read whole
    except OSError:
        return False
    return b"name='generator' content='workbench" in page or b"id='render-status'" in page


# What `report` writes, handed to the output guard: one HTML file, replaced only when it is such a page.
REPORT_OUTPUT = OutputKind("report", FILES, owns=report_file)


def report(
    results_dir: Path = typer.Argument(..., help="A results directory (probe parquet files and summary.json)."),
    out: Optional[Path] = typer.Option(None, "--out", help="HTML file to write (default RESULTS_DIR/report.html)."),
    control: Optional[Path] = typer.Option(None, "--control", help="Another results directory (the untrained control, "
                                           "or another specimen) to show beside it, with paired tests."),
    quiet: bool = QUIET,
    as_json: bool = JSON,
) -> None:
    """Write the HTML report of a results directory: headlines with intervals (beside a control), the claims
    ledger when present, captioned figures, provenance; works offline."""
    from workbench.analysis.results import load_results
    from workbench.errors import WorkbenchError
    from workbench.guard import dir_inputs, guard_output
    from workbench.plots.report import REPORT, write_report

    guard = guard_output(out or results_dir / REPORT, "report", kind=REPORT_OUTPUT, overwrite=True,  # before any work
                         reading=dir_inputs(results_dir, control, exclude=(REPORT,)))
    if out is not None and out.suffix != ".html":  # after the guard's own refusals; never a name a run keeps
        raise WorkbenchError(f"--out '{out}' must end in .html: the report is one HTML page")
    ui = Output(quiet, as_json)
    path = write_report(results_dir, out, control=control, before_write=guard.recheck, progress=ui.progress)
    n = len(load_results(results_dir))
    ui.wrote(path, f"report: {path} ({path.stat().st_size / 1e6:.1f} MB, {n} tables)")
    ui.result({"report": str(path), "bytes": path.stat().st_size, "tables": n})
