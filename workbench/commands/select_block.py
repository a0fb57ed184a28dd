"""`workbench select-block`: angular-distance curve, Kneedle span, windows ranked by untrained damage, then the
window sweep (short trainings) when asked.

Stage 1 writes DIR/block_selection.json (the curve, the span, the windows ranked by the damage an untrained
loop 2 does, the model's identity) and DIR/block_selection.html. `--window-sweep` then trains every candidate
window for the same short budget (`workbench.selection.window_sweep`): DIR/runs/<window>-seed<N>/ are ordinary run
directories (resumable with --resume, killable), DIR/readings/ their ranking reads, and DIR/window_sweep.json and
DIR/window_sweep.html the table, the figure and the recommendation with its margin. The flag's old name,
`--stage2 train` (and `--stage2 damage`, the default), is still read, with a one-line note.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from pathlib import Path

import typer

from workbench.commands.output import JSON, QUIET, Output
from workbench.defaults import EMBEDDED_DEFAULT
from workbench.devices import DEVICE_HELP
from workbench.guard import SWEEP_OUTPUT, OutputKind, guard_output, mark_output
from workbench.io import write_text_atomic

SELECTION_JSON = "block_selection.json"
SELECTION_HTML = "block_selection.html"
SWEEP_HTML = "window_sweep.html"
OLD_FLAG_VALUES = ("damage", "train")   # --stage2, the old name of --window-sweep: train is it, damage its absence

# What `select-block` writes without --window-sweep, handed to the output guard: Stage 1's directory, written whole
# and moved in (`_write_stage1_dir`); --overwrite replaces one the workbench marked. (With --window-sweep the sweep
# is written in place: `workbench.guard.in_place.SWEEP_OUTPUT`.)
SELECTION_OUTPUT = OutputKind("block selection")


def select_block(
    model: str = typer.Option(EMBEDDED_DEFAULT, "--model", help="HF directory, .gguf file, or embedded default name."),
    corpus: Path | None = typer.Option(None, "--corpus", help="Text file, one text per line (default: the built-in corpus)."),
    window: int | None = typer.Option(None, "--window", help="Layers to loop (default: max(2, round(L/5)), "
                                      "clipped to the span)."),
    sweep: bool = typer.Option(False, "--window-sweep", help="Rank the candidate windows by a short training of "
                               "each, by held-out CE (RecurTrace App. B; an hour or more on a CPU), instead of by the "
                               "loss and accuracy an untrained loop 2 costs (minutes)."),
    stage2: str | None = typer.Option(None, "--stage2", hidden=True, help="The old name of --window-sweep: 'train' "
                                      "is --window-sweep, 'damage' the default."),
    steps: int | None = typer.Option(None, "--steps", help="--window-sweep: training steps per candidate (the first "
                                     "steps of --recipe's curriculum; default 200)."),
    candidates: int | None = typer.Option(None, "--candidates", help="--window-sweep: windows spread over the span "
                                          "(Stage 1's pick among them; default 4); a late control and --include "
                                          "windows come on top."),
    include: list[str] = typer.Option([], "--include", help="--window-sweep: another window A:B to train (any size; "
                                      "repeatable), e.g. the block a specimen was trained at."),
    seeds: int | None = typer.Option(None, "--seeds", help="--window-sweep: seeds for the top two (default 2; the "
                                     "rest get one)."),
    rank_cells: str | None = typer.Option(None, "--rank-cells", help="--window-sweep: the cells the ranking CE reads: "
                                          "'all' (every loop t <= d; default) or 'iterate' (rows of depth >= 2, "
                                          "their loops 2 <= t <= d: the cells that need iterating)."),
    recipe: str | None = typer.Option(None, "--recipe", help="--window-sweep: the curriculum cut short (a recipe "
                                      "file or a shipped recipe's name; default smollm2_lora_chase)."),
    stage1: Path | None = typer.Option(None, "--stage1", help="Reuse the block_selection.json of an earlier run on "
                                       "the same model instead of computing Stage 1 again."),
    resume: bool = typer.Option(False, "--resume", help="--window-sweep: continue the sweep in --out (finished "
                                "candidates are kept, a partial one resumes from its checkpoint)."),
    out: Path = typer.Option(Path("results/select_block"), "--out", help="Output directory (must be new or empty)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Write into a non-empty --out directory that "
                                   "the workbench wrote (never a sweep's: its runs are kept)."),
    device: str = typer.Option("auto", "--device", help="Device: " + DEVICE_HELP),
    quiet: bool = QUIET,
    as_json: bool = JSON,
) -> None:
    """Find the loopable span (angular distance + Kneedle) and rank windows in it: by untrained loop-2 damage, or
    (--window-sweep) by a short training of each."""
    from workbench.devices import resolve_device
    from workbench.errors import WorkbenchError
    from workbench.models.bases import load_base
    from workbench.selection import window_sweep
    from workbench.selection.ranking import RANK_CELLS
    from workbench.selection.stage1 import load_corpus

    ui = Output(quiet, as_json)
    old = _old_flag(stage2)   # checked and noted whether or not --window-sweep is given too
    train = sweep is True or old
    for flag, value in (("--window", window), ("--steps", steps), ("--candidates", candidates), ("--seeds", seeds)):
        if value is not None and value < 1:
            raise WorkbenchError(f"{flag} {value} is not accepted; give an integer >= 1")
    given = [flag for flag, value in (("--steps", steps), ("--candidates", candidates), ("--seeds", seeds),
                                      ("--recipe", recipe), ("--include", include or None), ("--resume", resume or None),
                                      ("--rank-cells", rank_cells))
             if value is not None]
    if not train and given:
        raise WorkbenchError(f"{given[0]} belongs to --window-sweep; add --window-sweep or drop the flag")
    steps = window_sweep.DEFAULT_STEPS if steps is None else steps
    candidates = window_sweep.DEFAULT_CANDIDATES if candidates is None else candidates
    seeds = window_sweep.SEEDS if seeds is None else seeds
    recipe = window_sweep.DEFAULT_RECIPE if recipe is None else recipe
    rank_cells = "all" if rank_cells is None else rank_cells
    if rank_cells not in RANK_CELLS:
        raise WorkbenchError(f"--rank-cells {rank_cells!r} is unknown; accepted: {', '.join(RANK_CELLS)}")
    run_on = resolve_device(device)   # a device the machine lacks: one line, nothing written
    recipe_path = _recipe_path(recipe) if train else None
    guard = guard_output(out, "select-block", kind=SWEEP_OUTPUT if train else SELECTION_OUTPUT,
                         overwrite=overwrite, resume=resume, reading=[corpus, model, stage1, recipe_path])  # before any work
    texts = load_corpus(corpus)  # read before the model loads: a bad path fails fast
    have = out / SELECTION_JSON
    base, tok = load_base(model)   # the one load: Stage 1 (or its reuse check) and the sweep's untrained damage
    base.to(run_on)
    record = _stage1(ui, base, tok, model, corpus, texts, window, run_on, device,
                     reuse=have if train and resume and have.is_file() else stage1)
    if not train:
        _write_stage1_dir(guard, out, record)
        ui.wrote(out / SELECTION_JSON, _wrote_line(record, out))
        ui.wrote(out / SELECTION_HTML, "")   # named in the line above
        ui.result(record)
        return
    _window_sweep(ui, guard, out, record, model, recipe_path, steps, candidates, include, seeds, run_on, texts,
                  rank_cells, base=(base, tok))


def _old_flag(stage2: str | None) -> bool:
    """Whether --stage2 (the old name of --window-sweep) asks for the sweep; a value given is noted in one line."""
    from workbench.errors import WorkbenchError

    if not isinstance(stage2, str):   # not given (or a test calling the command as a function)
        return False
    if stage2 not in OLD_FLAG_VALUES:
        raise WorkbenchError(f"--stage2 '{stage2}' is unknown; accepted: {', '.join(OLD_FLAG_VALUES)}")
    logging.getLogger(__name__).warning("--stage2 %s read as %s (its old name)", stage2,
                                        "--window-sweep" if stage2 == "train" else "no --window-sweep")
    return stage2 == "train"


def _recipe_path(recipe: str) -> Path:
    from workbench.defaults import resolve

    return resolve("recipe", recipe)


def _stage1(ui: Output, base, tok, model: str, corpus, texts, window, run_on, device, reuse: Path | None) -> dict:
    """Stage 1's record: computed on the loaded base, or read from `reuse` (checked against its weights and corpus)."""
    from workbench.devices import device_record
    from workbench.readers import read_json
    from workbench.selection.stage1 import check_reuse, selection_record

    if reuse is not None:
        record = read_json(reuse, "block selection")
        check_reuse(record, reuse, base, texts, window)
        ui.say(f"stage 1: reusing {reuse} (same weights and corpus)")
        ui.say(*_summary(record))
        return record
    record = selection_record(base, tok, model, texts, str(corpus) if corpus else "built-in (workbench/data/corpus.txt)",
                              window, progress=ui.progress)
    record["device"] = device_record(device, run_on)
    ui.say(*_summary(record))
    return record


def _figure_html(record: dict) -> str:
    from workbench.plots.selection import angular_distance_figure

    return angular_distance_figure(record).to_html(include_plotlyjs=True, full_html=True)


def _write_stage1_dir(guard, out: Path, record: dict) -> None:
    staging = out.with_name(f".{out.name}.tmp{os.getpid()}")  # both files or neither, old ones kept until then
    html = _figure_html(record)
    try:  # made inside the try: a signal that lands as it is made still removes it
        staging.mkdir(parents=True, exist_ok=False)
        write_text_atomic(staging / SELECTION_JSON, json.dumps(record, indent=2))
        write_text_atomic(staging / SELECTION_HTML, html)
        mark_output(staging, "select-block")
        guard.commit_dir(staging)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _window_sweep(ui: Output, guard, out: Path, record: dict, model: str, recipe_path: Path, steps: int,
                  n_candidates: int, include: list[str], seeds: int, run_on, texts: list[str],
                  cells: str = "all", base=None) -> None:
    from workbench.plots.selection import sweep_figure
    from workbench.selection import window_sweep

    # every bad option (a window outside the model, a budget the recipe lacks, a span too narrow) before a write
    cands = window_sweep.candidates(record, n_candidates, include)
    raw = window_sweep.base_recipe(recipe_path)
    for c in cands:
        window_sweep.sweep_recipe(raw, model, c, steps, 0)
    ui.say(f"window sweep: {len(cands)} windows ({', '.join(f'{c.name} {c.role}' for c in cands)}), {steps} steps each, "
           f"the top two with {seeds} seeds, ranked on {'every cell' if cells == 'all' else 'the loop >= 2 cells'}")
    guard.recheck()
    out.mkdir(parents=True, exist_ok=True)
    if not (out / SELECTION_JSON).is_file():
        write_text_atomic(out / SELECTION_JSON, json.dumps(record, indent=2))
        write_text_atomic(out / SELECTION_HTML, _figure_html(record))
    start = time.perf_counter()
    result = window_sweep.sweep(out, record, model, recipe_path, steps, n_candidates, include, seeds,
                                progress=ui.progress, device=run_on, say=ui.step, texts=texts, cells=cells,
                                base=base)
    result["seconds"] = round(time.perf_counter() - start, 1)
    write_text_atomic(out / window_sweep.TABLE, json.dumps(result, indent=2))
    write_text_atomic(out / SWEEP_HTML, sweep_figure(result).to_html(include_plotlyjs=True, full_html=True))
    guard.wrote()
    ui.say(*window_sweep.table_lines(result))
    ui.wrote(out / window_sweep.TABLE, f"wrote {out / window_sweep.TABLE} and {out / SWEEP_HTML} "
             f"({result['seconds']:.0f} s of training and reading)")
    ui.wrote(out / SWEEP_HTML, "")
    ui.result(result)


def _wrote_line(record: dict, out: Path) -> str:
    a, b = record["recommended"]
    return (f"recommended block {a}:{b} (by untrained loop-2 damage; --window-sweep ranks by training); wrote "
            f"{out / SELECTION_JSON} and {out / SELECTION_HTML} in {record['seconds']} s")


def _summary(selection: dict) -> list[str]:
    """The selection for a person: the span and why, then the five least damaging windows."""
    knees = selection["knees"]
    lines = [f"{selection['model']}: {selection['n_layers']} layers; span {selection['prelude_end']}:"
             f"{selection['coda_start']}"]
    lines += [f"  {key}: {knees[key]['reason']}" for key in ("prelude_end", "coda_start")]
    lines.append(f"windows of {selection['window']} layers (stride {selection['stride']}), by the damage an untrained "
                 "loop 2 does, lowest first:")
    for w in selection["windows"][:5]:
        a, b = w["block"]
        lines.append(f"  {a:>2}:{b:<2} damage {w['damage']:.4f}  (Δloss {w['loss_increase']:+.4f} nats, "
                     f"accuracy {w['accuracy_loop1']:.3f} -> {w['accuracy_loop2']:.3f})")
    return lines
