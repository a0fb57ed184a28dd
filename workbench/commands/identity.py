"""`workbench identity`: loop-1 identity check against the untouched base model."""

from __future__ import annotations

import typer

from workbench.identity import IDENTITY_PROMPTS, identity_report


def identity(
    model: str = typer.Option("smollm2-135m-instruct", "--model", help="HF directory, .gguf file, or embedded default name."),
    block: str = typer.Option(..., "--block", help="Layers to loop, A:B (A inclusive, B exclusive)."),
    loops: int = typer.Option(3, "--loops", help="Loops to run; loop 1 is compared with the base model."),
    attn: str = typer.Option("eager", "--attn", help="Attention implementation: eager or sdpa."),
) -> None:
    """Print max |Δlogit| between the base model and the retrofit at loop 1 (expected: 0.0)."""
    from workbench.models import load_base

    base, tok = load_base(model, attn_implementation=attn)
    rows = identity_report(base, tok, block, loops=loops)
    for r in rows:
        typer.echo(f"{r['reentry']:>6}  memory={str(r['memory']):5}  lora={str(r['lora']):5}  "
                   f"max|Δlogit| = {r['max_abs_diff']}")
    worst = max(r["max_abs_diff"] for r in rows)
    typer.echo(f"{model} block {block}: max |Δlogit| over {len(IDENTITY_PROMPTS)} prompts = {worst}")
    if worst != 0.0:
        raise typer.Exit(1)
