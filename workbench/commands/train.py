"""`workbench train`: train a recipe into a run directory (docs/architecture.md)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import List, Optional

import typer

from workbench.commands.output import JSON, QUIET, Output
from workbench.devices import DEVICE_HELP


def _matrix_lines(matrix: dict) -> list[str]:
    lines = []
    for d in sorted(matrix, key=int):
        cells = "  ".join(f"t{t}={matrix[d][t]:.3f}" for t in sorted(matrix[d], key=int))
        lines.append(f"  depth {d}: {cells}")
    return lines


def train(
    recipe: str = typer.Argument(..., help="A TOML recipe file, or a shipped recipe by name (e.g. "
                                 "smollm2_lora_chase, support/smollm2_chase_s2; workbench/data/training/)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Run directory (default runs/<recipe name>)."),
    overrides: List[str] = typer.Option([], "--set", help="Override a recipe key: key=value (repeatable), "
                                        "e.g. --set optim.lr=3e-4 --set stages.0.steps=50."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the run directory's latest checkpoint."),
    device: str = typer.Option("auto", "--device", help="Device: " + DEVICE_HELP),
    quiet: bool = QUIET,
    as_json: bool = JSON,
) -> None:
    """Train a recipe; print the held-out depth x loop accuracy before and after."""
    from workbench.selection.stage1 import resolve_block
    from workbench.train.trainer import train as run_training

    # under `workbench launch` every rank runs this command; only the main one prints
    ui = Output(quiet, as_json, silent=os.environ.get("RANK", "0") != "0")
    summary = run_training(recipe, out=out, overrides=overrides, resume=resume, device=device, progress=ui.progress,
                           choose_block=resolve_block)
    ui.wrote(summary["run_dir"], f"run: {summary['run_dir']}  steps: {summary['steps']}  wall: {summary['wall_s']:.0f} s")
    g = summary.get("guardrail")
    if g:
        ui.say(f"guardrail at loop 1: base {g['base']}/{g['total']}, readings (step, correct): "
               + ", ".join(f"({s}, {c})" for s, c in g["readings"]))
    for label in ("before", "after"):
        if summary[label]:
            ui.say(f"held-out active-label accuracy {label}:", *_matrix_lines(summary[label]))
    ui.result(summary)
    if summary.get("status") == "stopped_by_guardrail":
        typer.echo(f"stopped by the capability guardrail at step {summary['steps']}: loop 1 lost more than "
                   f"{g['max_drop']} points against the base ({g['final']}/{g['total']} vs {g['base']}/{g['total']}); "
                   "no trained tensors were exported (exit status 3)", err=True)
        raise typer.Exit(3)
