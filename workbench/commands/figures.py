"""`workbench figures`: paper figures (PDF, SVG, PNG or HTML) at publication sizes, each with its CSV."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer


def figures(
    results: List[Path] = typer.Option([], "--results", help="Results directory (repeatable; default: every "
                                       "directory under ./results that holds probe tables and summary.json)."),
    fmt: str = typer.Option("pdf", "--format", help="pdf, svg, png or html."),
    out: Path = typer.Option(Path("figures/out"), "--out", help="Output directory; one folder per results directory."),
    spec: Optional[str] = typer.Option(None, "--spec", help="Figure spec TOML, or a shipped one by name (paper); "
                                        "default: every registered figure at double-column width."),
    dpi: Optional[int] = typer.Option(None, "--dpi", help="PNG resolution (default: the spec's, else 300)."),
) -> None:
    """Export the figures of each results directory, with the numbers each one shows as CSV beside it."""
    from workbench.errors import WorkbenchError
    from workbench.figures import DPI, export_figures, load_spec

    specs, spec_dpi = load_spec(spec) if spec is not None else (None, DPI)
    if not results:
        # complete results only: a staging directory (.NAME.tmpPID) or one without its summary is not one
        results = sorted(p for p in Path("results").glob("*") if p.is_dir() and not p.name.startswith(".")
                         and (p / "summary.json").is_file() and any(p.glob("*.parquet")))
        if not results:
            raise WorkbenchError("no --results given and no directory under ./results holds probe tables; "
                                 "pass --results DIR")
    done = export_figures(results, fmt=fmt, out=out, spec=specs, dpi=dpi or spec_dpi)
    images = [p for p in done.written if p.suffix != ".csv"]
    typer.echo(f"wrote {len(images)} {fmt} figure(s) with CSV under {out}")
    for p in images:
        typer.echo(f"  {p}")
    for s in done.skipped:
        typer.echo(f"  skipped {s}")
