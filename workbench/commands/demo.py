"""`workbench demo`: the main job on the embedded default, end to end."""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
import typer

DEMO_PROMPT = "A -> C\nB -> E\nC -> H\nD -> A\nE -> B\nF -> D\nG -> F\nH -> G\nStart at B. Apply the table 2 times.\nAnswer:"


def demo(
    out: Path = typer.Option(Path("results/demo"), "--out", help="Directory for the demo's outputs."),
    block: str = typer.Option("10:16", "--block", help="Layers to loop, A:B."),
    loops: int = typer.Option(4, "--loops", help="Loops to read for the per-loop top tokens."),
) -> None:
    """Load the embedded default, retrofit it, check loop-1 identity, show each loop's top tokens."""
    from workbench.identity import identity_report
    from workbench.models import EMBEDDED_DEFAULT, load_base
    from workbench.surgery import parameter_report, retrofit

    start = time.perf_counter()
    base, tok = load_base(EMBEDDED_DEFAULT)
    typer.echo(f"loaded {EMBEDDED_DEFAULT}: {base.config.num_hidden_layers} layers, width {base.config.hidden_size}")
    identity = identity_report(base, tok, block, loops=2, lora=False)
    worst = max(r["max_abs_diff"] for r in identity)
    typer.echo(f"loop-1 identity, block {block}, bridge/inject x memory off/on: max |Δlogit| = {worst}")
    looped = retrofit(base, block, reentry="bridge")
    report = parameter_report(looped)
    typer.echo(f"parameters: total {report['total']:,}; added by the bridge {report['added']['reentry']:,}")
    enc = tok(DEMO_PROMPT, return_tensors="pt")
    with torch.no_grad():
        scores = looped.read(enc.input_ids, enc.attention_mask, loops=loops).scores[0, :, 0]  # [T, vocab]
    probs = scores.softmax(-1)
    typer.echo("untrained retrofit, per-loop top tokens after 'Answer:' (answer: ' H'):")
    top = []
    for t in range(loops):
        p, ids = probs[t].topk(5)
        tokens = [(tok.decode(int(i)), round(float(q), 4)) for q, i in zip(p, ids)]
        top.append({"loop": t + 1, "top": tokens})
        typer.echo(f"  loop {t + 1}: " + "  ".join(f"{s!r} {q:.3f}" for s, q in tokens))
    out.mkdir(parents=True, exist_ok=True)
    summary = {"model": EMBEDDED_DEFAULT, "block": block, "identity": identity, "parameters": report,
               "prompt": DEMO_PROMPT, "per_loop_top": top, "seconds": round(time.perf_counter() - start, 1)}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    typer.echo(f"wrote {out / 'summary.json'} in {summary['seconds']} s")
    if worst != 0.0:
        raise typer.Exit(1)
