"""`workbench rows`: generate a task family and freeze it as a row manifest (JSONL + sidecar)."""

from __future__ import annotations

from pathlib import Path

import typer

from workbench.commands.output import JSON, QUIET, Output
from workbench.defaults import EMBEDDED_DEFAULT
from workbench.errors import WorkbenchError


def parse_depths(spec: str) -> list[int]:
    """Returns the depths of "1-14", "1,2,5" or a mix ("1-3,7"), in the order given.

    Raises:
        WorkbenchError: a malformed spec, an empty range, or a depth given twice.
    """
    depths: list[int] = []
    try:
        for part in spec.split(","):
            lo, _, hi = part.strip().partition("-")
            first, last = int(lo), int(hi or lo)
            if last < first:
                raise ValueError
            depths.extend(range(first, last + 1))
    except ValueError:
        raise WorkbenchError(f"depths '{spec}' is malformed; accepted: a range '1-14' or a list '1,2,5'") from None
    if len(set(depths)) != len(depths):
        raise WorkbenchError(f"depths '{spec}' names a depth twice")
    return depths


def rows(
    task: str = typer.Option("chase", "--task", help="chase, phop, state, state_query or arith."),
    alphabet: int = typer.Option(None, "--alphabet", help="Symbols N (chase: 8, 16, 24; phop: 32). Default 16 / 32."),
    depths: str = typer.Option(..., "--depths", help="'1-14' or '1,2,5'."),
    per_depth: int = typer.Option(128, "--per-depth", help="Rows at each depth."),
    seed: int = typer.Option(..., "--seed", help="Base seed, hashed with each row's key."),
    out: Path = typer.Option(..., "--out", help="The .jsonl file to write; its sidecar goes beside it."),
    surface: str = typer.Option("symbolic", "--surface", help="chase: symbolic, relay or pointer."),
    symbols: str = typer.Option(
        None, "--symbols", help="chase: letters or names (default: letters for symbolic, names for verbal)."
    ),
    permutation: bool = typer.Option(False, "--permutation", help="chase: the bijective control."),
    split: str = typer.Option("test", "--split", help="train or test (seed material; RecurTrace code pool)."),
    model: str = typer.Option(
        EMBEDDED_DEFAULT, "--model", help="Model whose tokenizer every symbol must be one token of."
    ),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing manifest and its sidecar."),
    quiet: bool = QUIET,
    as_json: bool = JSON,
) -> None:
    """Write a frozen row manifest: F.jsonl and F.manifest.json."""
    from workbench.tasks import build_rows
    from workbench.tasks.manifest import sidecar_path, write_manifest

    if Path(out).suffix != ".jsonl":
        raise WorkbenchError(f"--out '{out}' must end in .jsonl")
    from workbench.io import gate_output

    # a frozen manifest is replaced only when asked, and only one the workbench wrote: both files, before any work
    gates = [gate_output(path, "rows", kind="file", overwrite=overwrite) for path in (Path(out), sidecar_path(out))]
    tokenizer = _tokenizer(model) if task in ("chase", "phop") else None
    generated = build_rows(task, parse_depths(depths), per_depth, seed, alphabet=alphabet, tokenizer=tokenizer,
                           surface=surface, symbol_set=symbols, permutation=permutation, split=split)
    meta = {
        "task": task, "alphabet": alphabet, "depths": depths, "per_depth": per_depth, "seed": seed,
        "surface": surface, "symbols": symbols, "permutation": permutation, "split": split,
        "tokenizer": model if tokenizer is not None else None,
    }
    for gate in gates:
        gate.recheck()
    sidecar = write_manifest(generated, out, meta=meta)
    ui = Output(quiet, as_json)
    ui.wrote(out, f"{sidecar['rows']} rows -> {out} (rows_sha256 {sidecar['rows_sha256'][:16]})")
    ui.wrote(sidecar_path(out), "")   # the sidecar beside it: its own line only with --quiet
    ui.result(sidecar)


def _tokenizer(spec: str):
    from workbench.models import load_tokenizer

    return load_tokenizer(spec)
