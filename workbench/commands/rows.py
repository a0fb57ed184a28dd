"""`workbench rows`: generate a task family, or check a user's own rows, and freeze them as a row manifest.

`--task` names a built-in family (chase, phop, state, state_query, arith: `--depths` and `--seed`
required) or a user's generator function `module:function`; `--from FILE.jsonl` reads a user's
rows (`workbench.tasks.user`: every row checked against `--model`'s tokenizer, the first bad one
named in one line, nothing written).
"""

from __future__ import annotations

from pathlib import Path

import typer

from workbench.commands.output import JSON, QUIET, Output
from workbench.defaults import EMBEDDED_DEFAULT
from workbench.errors import WorkbenchError

PER_DEPTH = 128  # --per-depth of the built-in tasks


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
    task: str = typer.Option(None, "--task", help="chase (the default), phop, state, state_query, arith, or "
                             "module:function (your generator of rows in the --from format)."),
    source: Path = typer.Option(None, "--from", help="Your own rows: a .jsonl of prompt, answer and optional "
                                "candidates, depth, chain, id, answer_prefix, answer_end (docs/cli.md), each "
                                "checked. An answer not read among candidates is read exactly: the model answers A when "
                                "greedy decoding writes A, then the row's answer_end, or anything that does not "
                                "continue A's last word ('Paris.', 'Paris is' answer Paris; 'Parisian' does not)."),
    alphabet: int = typer.Option(None, "--alphabet", help="Symbols N (chase: 8, 16, 24; phop: 32). Default 16 / 32."),
    depths: str = typer.Option(None, "--depths", help="'1-14' or '1,2,5' (required for the built-in tasks)."),
    per_depth: int = typer.Option(None, "--per-depth", help=f"Rows at each depth (built-in tasks: {PER_DEPTH})."),
    seed: int = typer.Option(None, "--seed", help="Base seed, hashed with each row's key (required for the "
                             "built-in tasks)."),
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
    ui = Output(quiet, as_json)
    from workbench.tasks import TASKS, build_rows
    from workbench.tasks.manifest import ROWS_OUTPUT, sidecar_path, write_manifest

    if Path(out).suffix != ".jsonl":
        raise WorkbenchError(f"--out '{out}' must end in .jsonl")
    from workbench.guard import guard_output

    user = source is not None or (task is not None and ":" in task)
    if source is not None and task is not None:
        raise WorkbenchError("give --from FILE or --task, not both (--from reads your rows; --task generates them)")
    task = task or "chase"
    if user:
        given = {"--alphabet": alphabet is not None, "--surface": surface != "symbolic", "--symbols": symbols is not None,
                 "--permutation": permutation, "--split": split != "test"}
        if source is not None:
            given.update({"--depths": depths is not None, "--per-depth": per_depth is not None, "--seed": seed is not None})
        extra = next((k for k, v in given.items() if v), None)
        if extra is not None:
            raise WorkbenchError(f"{extra} is an option of the built-in tasks ({', '.join(TASKS)}); "
                                 f"{'--from' if source is not None else f'--task {task}'} takes none")
    else:
        for name, value in (("--depths", depths), ("--seed", seed)):
            if value is None:
                raise WorkbenchError(f"--task {task} needs {name} (e.g. --depths 1-7 --seed 1)")
    wanted = parse_depths(depths) if depths is not None else None
    # a frozen manifest is replaced only when asked, and only one the workbench wrote: both files, before any work;
    # never a file a run keeps (its metrics.jsonl, say, before its first step wrote one) nor one inside a Stage 2
    # sweep: the guard asks every directory written in place (`workbench.places`)
    guards = [guard_output(path, "rows", kind=ROWS_OUTPUT, overwrite=overwrite) for path in (Path(out), sidecar_path(out))]
    if user:
        from workbench.tasks.user import Deferred, read_user_rows, task_rows

        loaded = Deferred(lambda: _tokenizer_and_config(model))   # loaded once every row's form is checked
        tokenizer, config = Deferred(lambda: loaded.get()[0]), Deferred(lambda: loaded.get()[1])
        made = (read_user_rows(source, tokenizer, config) if source is not None
                else task_rows(task, tokenizer, seed=seed, depths=wanted, per_depth=per_depth, config=config))
        generated, meta = made.rows, {**made.meta, "tokenizer": model}
    else:
        per_depth = PER_DEPTH if per_depth is None else per_depth
        tokenizer = _tokenizer(model) if task in ("chase", "phop") else None
        generated = build_rows(task, wanted, per_depth, seed, alphabet=alphabet, tokenizer=tokenizer,
                               surface=surface, symbol_set=symbols, permutation=permutation, split=split)
        meta = {
            "task": task, "alphabet": alphabet, "depths": depths, "per_depth": per_depth, "seed": seed,
            "surface": surface, "symbols": symbols, "permutation": permutation, "split": split,
            "tokenizer": model if tokenizer is not None else None,
        }
    for guard in guards:
        guard.recheck()
    sidecar = write_manifest(generated, out, meta=meta)
    ui.wrote(out, f"{sidecar['rows']} rows -> {out} (rows_sha256 {sidecar['rows_sha256'][:16]})")
    ui.wrote(sidecar_path(out), "")   # the sidecar beside it: its own line only with --quiet
    ui.result(sidecar)


def _tokenizer_and_config(spec: str):
    """The model's tokenizer and config: the config's positions bound a row's length (`workbench.texts`)."""
    from workbench.models.bases import tokenizer_and_config
    from workbench.models.native import load_looped, native_family

    if native_family(spec) is not None:
        looped, tok = load_looped(spec)[:2]
        return tok, looped.config
    return tokenizer_and_config(spec)


def _tokenizer(spec: str):
    from workbench.models.bases import load_tokenizer
    from workbench.models.native import load_looped, native_family, require_tokenizer

    return require_tokenizer(load_looped(spec)[1], spec) if native_family(spec) is not None else load_tokenizer(spec)
