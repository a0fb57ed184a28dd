"""`workbench select-block`: angular-distance sweep, Kneedle span and window ablation before surgery.

Writes DIR/block_selection.json (the curve, the span, the ranked windows, the recommendation
and the model's identity) and DIR/block_selection.html (the figure, self-contained offline).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path

import typer

from workbench.defaults import EMBEDDED_DEFAULT
from workbench.devices import DEVICE_HELP
from workbench.io import gate_output, mark_output, write_text_atomic

SELECTION_JSON = "block_selection.json"
SELECTION_HTML = "block_selection.html"


def select_block(
    model: str = typer.Option(EMBEDDED_DEFAULT, "--model", help="HF directory, .gguf file, or embedded default name."),
    corpus: Path | None = typer.Option(None, "--corpus", help="Text file, one text per line (default: the built-in corpus)."),
    window: int | None = typer.Option(None, "--window", help="Layers to loop (default: max(2, round(L/5)), "
                                      "clipped to the span)."),
    out: Path = typer.Option(Path("results/select_block"), "--out", help="Output directory (must be new or empty)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Write into a non-empty --out directory that "
                                   "the workbench wrote."),
    device: str = typer.Option("auto", "--device", help="Device: " + DEVICE_HELP),
) -> None:
    """Find the loopable span (angular distance + Kneedle) and rank windows in it by loop-2 damage."""
    from workbench.block_selection import load_corpus
    from workbench.block_selection import select_block as run_selection
    from workbench.devices import device_record, resolve_device
    from workbench.models import load_base, weights_sha256
    from workbench.plots.selection import angular_distance_figure

    run_on = resolve_device(device)   # a device the machine lacks: one line, nothing written
    gate = gate_output(out, "select-block", overwrite=overwrite, reading=[corpus, model])  # before any work
    texts = load_corpus(corpus)  # read before the model loads: a bad path fails fast
    start = time.perf_counter()
    base, tok = load_base(model)
    selection = run_selection(base.to(run_on), tok, texts=texts, window=window)
    record = {
        **selection.to_dict(),
        "model": model,
        "weights_sha256": weights_sha256(base),
        "corpus": str(corpus) if corpus else "built-in (workbench/data/corpus.txt)",
        "corpus_sha256": hashlib.sha256("\n".join(texts).encode()).hexdigest(),
        "seconds": round(time.perf_counter() - start, 1),
        "device": device_record(device, run_on),
    }
    html = angular_distance_figure(record).to_html(include_plotlyjs=True, full_html=True)
    staging = out.with_name(f".{out.name}.tmp{os.getpid()}")  # both files or neither, old ones kept until then
    try:  # made inside the try: a signal that lands as it is made still removes it
        staging.mkdir(parents=True, exist_ok=False)
        write_text_atomic(staging / SELECTION_JSON, json.dumps(record, indent=2))
        write_text_atomic(staging / SELECTION_HTML, html)
        mark_output(staging, "select-block")
        gate.commit_dir(staging)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    _summary(selection, out, record["seconds"])


def _summary(selection, out: Path, seconds: float) -> None:
    knees = selection.knees
    typer.echo(f"{selection.model}: {selection.n_layers} layers; span {selection.prelude_end}:{selection.coda_start}")
    for key in ("prelude_end", "coda_start"):
        typer.echo(f"  {key}: {knees[key]['reason']}")
    typer.echo(f"windows of {selection.window} layers (stride {selection.stride}), lowest damage first:")
    for w in selection.windows[:5]:
        a, b = w["block"]
        typer.echo(f"  {a:>2}:{b:<2} damage {w['damage']:.4f}  (Δloss {w['loss_increase']:+.4f} nats, "
                   f"accuracy {w['accuracy_loop1']:.3f} -> {w['accuracy_loop2']:.3f})")
    a, b = selection.recommended
    typer.echo(f"recommended block {a}:{b}; wrote {out / SELECTION_JSON} and {out / SELECTION_HTML} in {seconds} s")
