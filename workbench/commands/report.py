"""`workbench report`: a results directory → one self-contained offline HTML report."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def report(
    results_dir: Path = typer.Argument(..., help="A results directory (probe parquet files and summary.json)."),
    out: Optional[Path] = typer.Option(None, "--out", help="HTML file to write (default RESULTS_DIR/report.html)."),
    control: Optional[Path] = typer.Option(None, "--control", help="Another results directory (the untrained control, "
                                           "or another specimen) to show beside it, with paired tests."),
) -> None:
    """Write the HTML report of a results directory: headlines with intervals (beside a control), the claims
    ledger when present, captioned figures, provenance; works offline."""
    from workbench.analysis.results import load_results
    from workbench.io import dir_inputs, gate_output
    from workbench.plots.report import REPORT, write_report

    gate = gate_output(out or results_dir / REPORT, "report", kind="file", overwrite=True,  # before any work
                       reading=dir_inputs(results_dir, control, exclude=(REPORT,)))
    path = write_report(results_dir, out, control=control, before_write=gate.recheck)
    n = len(load_results(results_dir))
    typer.echo(f"report: {path} ({path.stat().st_size / 1e6:.1f} MB, {n} tables)")
