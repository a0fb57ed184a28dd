"""`workbench probe`: run a probe battery on a checkpoint into a results directory."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from workbench.commands.initial_state import INIT_SEED
from workbench.commands.output import JSON, QUIET, Output
from workbench.defaults import EMBEDDED_DEFAULT, shipped
from workbench.devices import DEVICE_HELP


def probe(
    checkpoint: str = typer.Option(..., "--checkpoint", help="A run directory or a shipped keeper's name "
                                   "(smollm2-chase), a native looped model (a transformers Inkling2Loop or "
                                   "HRM-Text directory, a Raven/Huginn or Ouro directory; tiny-inkling2-loop, "
                                   "tiny-hrm-text, tiny-raven, tiny-ouro), "
                                   "untrained:RUN_DIR (that run's "
                                   "architecture, untrained), or untrained:BASE:A:B (e.g. "
                                   f"untrained:{EMBEDDED_DEFAULT}:10:16) for an untrained retrofit control."),
    battery: Optional[str] = typer.Option(None, "--battery", help="A battery TOML file, or a shipped battery: "
                                          f"{', '.join(shipped('battery'))} (workbench/data/probes/); default: "
                                          "native for a native looped model, else default."),
    rows: Optional[str] = typer.Option(None, "--rows", help="A row manifest (.jsonl), or a shipped one by name "
                                       "(chase_n8_d1-7), replacing every probe's rows."),
    only: Optional[str] = typer.Option(None, "--only", help="Comma list of probes to run (e.g. depth_matrix,splice)."),
    out: Path = typer.Option(..., "--out", help="Results directory: <probe>.parquet, summary.json, report.html."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace a results directory that is not empty."),
    seed: int = typer.Option(0, "--seed", help="Seed of row splits, pairings and null draws."),
    precision: str = typer.Option("fp32", "--precision", help="fp32 (exact) or bf16 (frozen weights in bf16, "
                                  "autocast; about 1.75x faster reads on a CPU with bf16 units). identity and "
                                  "gradient_audit always run in fp32."),
    init_seed: Optional[int] = INIT_SEED,
    device: str = typer.Option("auto", "--device", help="Device: " + DEVICE_HELP),
    quiet: bool = QUIET,
    as_json: bool = JSON,
) -> None:
    """Run the probe battery on a checkpoint: one parquet per probe table, summary.json, report.html."""
    from workbench.plots.report import write_report
    from workbench.probes import parse_only
    from workbench.probes.battery import run_battery

    ui = Output(quiet, as_json)
    summary = run_battery(checkpoint, battery, out, rows=rows, only=parse_only(only), overwrite=overwrite, seed=seed,
                          precision=precision, finish=lambda staging: write_report(staging, shown_as=out), device=device,
                          init_seed=init_seed,
                          progress=ui.progress,
                          announce=lambda skipped: ui.say(*(f"not applicable: {n}: {r}" for n, r in skipped.items())))
    if ui.human:
        print_summary(summary)
    ui.wrote(out, f"results: {out} ({summary['wall_s']:.0f} s)")
    ui.result(summary)


def print_summary(summary: dict) -> None:
    """Prints a battery summary: each probe's headline as one table within 100 columns."""
    import textwrap

    from workbench.analysis.headlines import headlines_from_summary
    from workbench.plots.terminal import print_headlines

    skipped = {n: p["reason"] for n, p in summary["probes"].items() if p.get("status") == "not_applicable"}
    print_headlines(headlines_from_summary(summary), skipped)
    from workbench.analysis.readings import battery_notes

    for note in battery_notes(summary):
        typer.echo(textwrap.fill(f"note: {note}", 100))
    walls = ", ".join(f"{n} {p['wall_s']:.0f}" for n, p in summary["probes"].items() if "wall_s" in p)
    typer.echo(textwrap.fill(f"seconds per probe: {walls}", 100))
