"""`workbench figures`: paper figures (PDF, SVG, PNG or HTML) at publication sizes, each with its CSV."""

from __future__ import annotations

import os
from pathlib import Path
from typing import List, Optional

import typer

from workbench.commands.output import JSON, QUIET, Output


def figures(
    results: List[Path] = typer.Option([], "--results", help="Results directory (repeatable; default: every "
                                       "directory under ./results, at any depth, that holds probe tables and "
                                       "summary.json)."),
    fmt: str = typer.Option("pdf", "--format", help="pdf, svg, png or html."),
    out: Path = typer.Option(Path("figures/out"), "--out", help="Output directory; one folder per results directory."),
    spec: Optional[str] = typer.Option(None, "--spec", help="Figure spec TOML, or a shipped one by name (paper); "
                                        "default: every registered figure at double-column width."),
    dpi: Optional[int] = typer.Option(None, "--dpi", help="PNG resolution (default: the spec's, else 300)."),
    quiet: bool = QUIET,
    as_json: bool = JSON,
) -> None:
    """Export the figures of each results directory, with the numbers each one shows as CSV beside it."""
    from workbench.errors import WorkbenchError
    from workbench.plots.export import DPI, export_figures, load_spec

    specs, spec_dpi = load_spec(spec) if spec is not None else (None, DPI)
    if not results:
        # complete results only: a staging directory (.NAME.tmpPID) or one without its summary is not one
        # at any depth (`make demo` writes results/demo/probe), skipping hidden folders on the way
        results = []
        for folder, subdirs, files in os.walk("results", followlinks=True):
            subdirs[:] = sorted(d for d in subdirs if not d.startswith("."))  # staging (.NAME.tmpPID) is not one
            if "summary.json" in files and any(f.endswith(".parquet") for f in files):
                results.append(Path(folder))
        if not results:
            raise WorkbenchError("no --results given and no directory under ./results (at any depth) holds probe "
                                 "tables and a summary.json; pass --results DIR")
        names = [p.resolve().name for p in results]  # the folder export_figures writes each to
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise WorkbenchError(f"results directories under ./results share the name '{twice[0]}' (figures go to "
                                 f"{out}/<name>/); pass --results for the ones to export")
    ui = Output(quiet, as_json)
    done = export_figures(results, fmt=fmt, out=out, spec=specs, dpi=dpi or spec_dpi, progress=ui.progress)
    images = [p for p in done.written if p.suffix != ".csv"]
    ui.say(f"wrote {len(images)} {fmt} figure(s) with CSV under {out}")
    for p in images:
        ui.wrote(p, f"  {p}")
    ui.say(*(f"  skipped {s}" for s in done.skipped))
    ui.result({"format": fmt, "skipped": done.skipped, "csv": [str(p) for p in done.written if p.suffix == ".csv"]})
