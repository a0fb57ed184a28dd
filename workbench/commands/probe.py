"""`workbench probe`: run a probe battery on a checkpoint into a results directory."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def probe(
    checkpoint: str = typer.Option(..., "--checkpoint", help="A run directory, untrained:RUN_DIR (that run's "
                                   "architecture, untrained), or untrained:BASE:A:B (e.g. "
                                   "untrained:smollm2-135m-instruct:10:16) for an untrained retrofit control."),
    battery: Path = typer.Option(Path("probes/default.toml"), "--battery", help="Battery TOML file."),
    rows: Optional[Path] = typer.Option(None, "--rows", help="A row manifest (.jsonl) replacing every probe's rows."),
    only: Optional[str] = typer.Option(None, "--only", help="Comma list of probes to run (e.g. depth_matrix,splice)."),
    out: Path = typer.Option(..., "--out", help="Results directory: <probe>.parquet, summary.json, report.html."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace a results directory that is not empty."),
    seed: int = typer.Option(0, "--seed", help="Seed of row splits, pairings and null draws."),
) -> None:
    """Run the probe battery on a checkpoint: one parquet per probe table, summary.json, report.html."""
    from workbench.probes import parse_only
    from workbench.probes.battery import run_battery

    summary = run_battery(checkpoint, battery, out, rows=None if rows is None else str(rows),
                          only=parse_only(only), overwrite=overwrite, seed=seed)
    for name, numbers in summary["probes"].items():
        if numbers.get("status") == "not_applicable":
            typer.echo(f"{name:>15}: not applicable ({numbers['reason']})")
        else:
            typer.echo(f"{name:>15}: {numbers['wall_s']:7.1f} s  {_headline(name, numbers)}")
    typer.echo(f"results: {out} ({summary['wall_s']:.0f} s)")


def _headline(name: str, n: dict) -> str:
    """One line of the probe's key numbers."""
    if name == "depth_matrix":
        return f"diagonal {n['diagonal']}  frontier@0.71 {n['frontier']['0.71']}  support {n['support']}"
    if name == "overshoot":
        s = n["split"]
        return " ".join(f"{c} {s[c]['count']}/{n['extra_loops']}" for c in ("iterate", "park", "other"))
    if name == "splice":
        return "  ".join(f"{k}: {v['verdict']}" for k, v in n["verdicts"].items())
    if name == "identity":
        return "  ".join(f"{k} {v}" for k, v in n.items() if k != "wall_s")
    return ""
