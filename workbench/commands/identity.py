"""`workbench identity`: loop-1 identity of fresh retrofits against the untouched base model."""

from __future__ import annotations

from typing import Optional

import typer

from workbench.commands.output import JSON, QUIET, Output
from workbench.defaults import EMBEDDED_DEFAULT
from workbench.devices import DEVICE_HELP

ATTENTION = ("eager", "sdpa")   # the implementations --attn offers


def identity(
    model: str = typer.Option(EMBEDDED_DEFAULT, "--model", help="HF directory, .gguf file, or embedded default name."),
    block: Optional[str] = typer.Option(None, "--block", help="Layers to loop, A:B (A inclusive, B exclusive); "
                                        "not for a native looped model (its own passes are compared)."),
    loops: int = typer.Option(3, "--loops", help="Loops to run; loop 1 is compared with the base model."),
    attn: str = typer.Option("eager", "--attn", help="Attention implementation: " + " or ".join(ATTENTION) + "."),
    device: str = typer.Option("auto", "--device", help="Device: " + DEVICE_HELP),
    quiet: bool = QUIET,
    as_json: bool = JSON,
) -> None:
    """Print max |Δlogit| between the base model and fresh retrofits at loop 1 (must be 0.0)."""
    from rich import box
    from rich.table import Table

    from workbench.devices import device_record, resolve_device
    from workbench.loop.identity import IDENTITY_PROMPTS, identity_report
    from workbench.models.bases import load_base
    from workbench.models.native import native_family
    from workbench.plots.terminal import console

    ui = Output(quiet, as_json)
    if attn not in ATTENTION:
        from workbench.errors import WorkbenchError

        raise WorkbenchError(f"--attn '{attn}' is not accepted; accepted: {', '.join(ATTENTION)}")
    run_on = resolve_device(device)   # before the model loads
    if native_family(model) is not None:  # a native looped model: its adapter against transformers' own forward
        from workbench.models.native.check import exactness

        record = exactness(model)
        ui.say(f"{model} ({record['family']}), adapter vs transformers' forward at passes 1..{len(record['per_pass'])} "
               f"(native {record['native_passes']}), {record['prompts']} prompts: max |Δlogit| = {record['max_abs_diff']}")
        ui.result(record)
        if record["max_abs_diff"] != 0.0:
            raise typer.Exit(1)
        return
    if block is None:
        from workbench.errors import WorkbenchError

        raise WorkbenchError("identity needs --block A:B for a retrofit (the layers to loop)")
    from workbench.loop.config import Block

    layers = Block.parse(block, "--block")   # before the model loads
    ui.step(f"loading {model}")
    base, tok = load_base(model, attn_implementation=attn)
    rows = identity_report(base.to(run_on), tok, layers, loops=loops,   # base and retrofit on the same kernels
                           progress=ui.progress)
    worst = max(r["max_abs_diff"] for r in rows)
    ui.result({"model": model, "block": block, "loops": loops, "prompts": len(IDENTITY_PROMPTS),
               "kind": "fresh retrofit", "rows": rows, "max_abs_diff": worst, "device": device_record(device, run_on)})
    if ui.human:
        con = console()
        con.print(f"fresh retrofits of {model} at block {block} on {run_on}, loop 1 vs the base (must be 0.0):")
        table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
        for name in ("re-entry", "memory", "LoRA (B = 0)"):
            table.add_column(name)
        table.add_column("max |Δlogit|", justify="right")
        for r in rows:
            table.add_row(r["reentry"], str(r["memory"]), str(r["lora"]), str(r["max_abs_diff"]))
        con.print(table)
        typer.echo(f"{model} block {block}, fresh retrofit, loop 1 vs base: max |Δlogit| over "
                   f"{len(IDENTITY_PROMPTS)} prompts = {worst}")
    if worst != 0.0:
        raise typer.Exit(1)
