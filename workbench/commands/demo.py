"""`workbench demo`: the main job on the embedded default, end to end.

Select the block, retrofit, check loop-1 identity, probe the shipped keeper (or a short
training run when asked), and write the report; print its path and the headline numbers.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import typer

from workbench.commands.output import JSON, QUIET, Output
from workbench.defaults import DEFAULT_KEEPER, DEFAULT_RECIPE, DEMO_BATTERY, resolve, resolve_run
from workbench.devices import DEVICE_HELP
from workbench.guard import OutputKind

# What `demo` writes, handed to the output guard: one directory written whole in a staging sibling and moved in;
# --overwrite replaces one the workbench marked.
DEMO_OUTPUT = OutputKind("demo")


def _step(say, title: str) -> float:
    say(f"\n== {title}")
    return time.perf_counter()


def demo(
    out: Path = typer.Option(Path("results/demo"), "--out", help="Directory for the demo's outputs."),
    train_steps: int = typer.Option(0, "--train-steps",
                                    help="Train a short run of the default recipe with this many steps "
                                         "and probe it, instead of probing the shipped keeper."),
    eval_per_depth: int = typer.Option(16, "--eval-per-depth", min=1,
                                       help="Held-out rows per depth for --train-steps' before/after evaluation "
                                            "(the recipe's own 64 cost minutes on CPU)."),
    skip_selection: bool = typer.Option(False, "--skip-selection", help="Skip the block-selection sweep."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace a non-empty --out that the workbench wrote."),
    device: str = typer.Option("auto", "--device", help="Device: " + DEVICE_HELP),
    quiet: bool = QUIET,
    as_json: bool = JSON,
) -> None:
    """The main job on the embedded default: select, retrofit, identity, probe, report."""
    from workbench.devices import resolve_device
    from workbench.guard import guard_output, mark_output
    from workbench.io import write_json_atomic

    ui = Output(quiet, as_json)
    resolve_device(device)   # a device the machine lacks: one line, nothing written
    guard = guard_output(out, "demo", kind=DEMO_OUTPUT, overwrite=overwrite,  # before any work
                         reading=[resolve_run(DEFAULT_KEEPER)])
    # All or nothing: every part is written into a hidden sibling and moved into place at the end, so an
    # interrupt or a failure leaves `out` as it was (absent, or the previous complete demo) and no staging.
    staging = out.with_name(f".{out.name}.tmp{os.getpid()}")
    try:  # made inside the try: a signal that lands as it is made still removes it
        staging.mkdir(parents=True, exist_ok=False)
        headline, summary = _run(ui, staging, out, train_steps, eval_per_depth, skip_selection, device)
        write_json_atomic(staging / "demo.json", headline)
        mark_output(staging, "demo")
        guard.commit_dir(staging)
    except BaseException:  # Ctrl-C and SIGTERM (workbench.cli) included
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if ui.human:
        from workbench.commands.probe import print_summary

        print_summary(summary)
    ui.wrote(out / "probe" / "report.html", f"\nreport: {out / 'probe' / 'report.html'}")
    ui.wrote(out / "demo.json", f"summary: {out / 'demo.json'}  (total {headline['seconds']:.0f} s)")
    ui.result(headline)
    if headline["identity_max_abs_diff"] != 0.0:
        raise typer.Exit(1)


def _run(ui: Output, staging: Path, out: Path, train_steps: int, eval_per_depth: int, skip_selection: bool,
         device: str = "auto"):
    """The demo's steps, written into `staging` (which becomes `out`); returns (headline, battery summary)."""
    from workbench.defaults import EMBEDDED_DEFAULT
    from workbench.devices import device_record, resolve_device
    from workbench.io import write_json_atomic
    from workbench.loop.identity import identity_report
    from workbench.models import load_base
    from workbench.plots.report import write_report
    from workbench.probes.battery import run_battery
    from workbench.runs import read_retrofit
    from workbench.selection.stage1 import select_block

    say = ui.step   # the steps are the demo's progress: with --json on stderr, with --quiet nowhere
    start = time.perf_counter()
    run_on = resolve_device(device)
    base, tok = load_base(EMBEDDED_DEFAULT)
    base.to(run_on)
    say(f"loaded {EMBEDDED_DEFAULT}: {base.config.num_hidden_layers} layers, width {base.config.hidden_size}")
    headline: dict = {"model": EMBEDDED_DEFAULT, "device": device_record(device, run_on)}

    if not skip_selection:
        t0 = _step(say, "1. block selection (angular distance, Kneedle, window ablation)")
        sel = select_block(base, tok, progress=ui.progress)
        headline["selection"] = {"prelude_end": sel.prelude_end, "coda_start": sel.coda_start,
                                 "recommended": list(sel.recommended), "windows": sel.windows}
        write_json_atomic(staging / "block_selection.json", sel.to_dict())
        for line in selection_lines(sel.to_dict()):
            say(line)
        say(f"  ({time.perf_counter() - t0:.0f} s)")

    checkpoint = resolve_run(DEFAULT_KEEPER)
    shown = str(checkpoint)
    if train_steps > 0:
        from workbench.train.trainer import train

        t0 = _step(say, f"2. training the default recipe for {train_steps} steps")
        overrides = [f"stages.{i}.steps={max(1, train_steps // 3)}" for i in range(3)]
        overrides.append(f"eval.per_depth={eval_per_depth}")
        summary = train(DEFAULT_RECIPE, out=staging / "run", overrides=overrides, device=device,
                        progress=ui.progress)
        checkpoint, shown = Path(summary["run_dir"]), str(out / "run")  # where the run will be once moved
        say(f"trained {summary['steps']} steps in {time.perf_counter() - t0:.0f} s")
    block = read_retrofit(checkpoint)[1].block
    if train_steps == 0:
        for line in keeper_lines(block, headline.get("selection", {}).get("windows"), committed_sweep()):
            say(line)

    t0 = _step(say, f"3. loop-1 identity at the keeper's block {block[0]}:{block[1]}")
    rows = identity_report(base, tok, block, loops=1, lora=False)
    headline["identity_max_abs_diff"] = max(r["max_abs_diff"] for r in rows)
    say(f"fresh retrofits (bridge/inject x memory off/on), loop 1 vs base: max |Δlogit| = "
        f"{headline['identity_max_abs_diff']} (must be 0.0)  ({time.perf_counter() - t0:.0f} s)")

    def finish(probe_staging: Path) -> None:
        # the summary and report name the checkpoint where it will be after the move, not in the staging
        record = json.loads((probe_staging / "summary.json").read_text())
        record["checkpoint"]["path"] = shown
        write_json_atomic(probe_staging / "summary.json", record)
        write_report(probe_staging, shown_as=out / "probe")

    t0 = _step(say, f"4. probing {shown} with the {DEMO_BATTERY} battery")
    summary = run_battery(str(checkpoint), resolve("battery", DEMO_BATTERY), staging / "probe", finish=finish,
                          device=device, progress=ui.progress)
    summary["checkpoint"]["path"] = shown
    headline["probes"] = summary["probes"]
    say(f"probes done in {time.perf_counter() - t0:.0f} s")

    _step(say, "5. headline numbers")
    headline["seconds"] = round(time.perf_counter() - start, 1)
    return headline, summary


def selection_lines(selection: dict, top: int = 3) -> list[str]:
    """The block selection's result as the demo prints it: the span, why, and the best windows with their numbers."""
    lines = [f"span {selection['prelude_end']}:{selection['coda_start']} of {selection['n_layers']} layers "
             "(angular distance between layers, Kneedle knees)"]
    lines += [f"  {key}: {selection['knees'][key]['reason']}" for key in ("prelude_end", "coda_start")
              if key in selection.get("knees", {})]
    lines.append(f"windows of {selection['window']} layers ranked by loop-2 damage of an untrained retrofit "
                 "(relative loss increase + accuracy lost when the window runs twice), lowest first:")
    for w in selection["windows"][:top]:
        a, b = w["block"]
        lines.append(f"  {a:>2}:{b:<2} damage {w['damage']:.4f}  (Δloss {w['loss_increase']:+.4f} nats, "
                     f"accuracy {w['accuracy_loop1']:.3f} -> {w['accuracy_loop2']:.3f})")
    a, b = selection["recommended"]
    lines.append(f"recommended window {a}:{b} by untrained damage (Stage 1; `select-block --window-sweep` ranks "
                 "windows by a short training each)")
    return lines


SWEEP = Path("training") / "selection" / "smollm2-135m-instruct-stage2"   # the committed window sweep


def committed_sweep() -> tuple[Path, dict] | None:
    """(where, its table) of the committed window sweep on the embedded default (a checkout's, or
    WORKBENCH_DATA's, or the wheel's copy of its tables); None when none is here."""
    from workbench.defaults import OLD_SWEEP_TABLE, SWEEP_TABLE, data_dirs
    from workbench.readers import read_json, under_old_name

    for root in data_dirs():
        path = under_old_name(root / SWEEP, SWEEP_TABLE, OLD_SWEEP_TABLE)
        if path.is_file():
            return SWEEP, read_json(path, "window sweep table")
    return None


def keeper_lines(block: tuple[int, int], windows: list[dict] | None, sweep: tuple[Path, dict] | None = None) -> list[str]:
    """Says which block the shipped keeper loops and why: Stage 1's rank of it when it is one of its windows, and
    the committed window sweep's reading of it (`select-block --window-sweep`), with that sweep's table."""
    from workbench.selection.window_sweep import table_lines

    a, b = block
    ranked = next((w for w in windows or [] if tuple(w["block"]) == (a, b)), None)
    where = (f"Stage 1 ranked it {ranked['rank']} of {len(windows)} (damage {ranked['damage']:.4f})" if ranked
             else "it is not among Stage 1's windows (another window size)" if windows else "")
    lines = [f"the keeper probed below loops block {a}:{b}, its recipe's choice (training/smollm2_lora_chase.toml)"
             + (f"; {where}" if where else "")]
    if sweep is None:
        return lines + ["no committed window sweep here (workbench select-block --window-sweep ranks windows by a "
                        "short training each)"]
    folder, record = sweep
    row = next((r for r in record["table"] if r["window"] == f"{a}:{b}"), None)
    lines.append(f"the committed window sweep ({folder}) trained each candidate briefly; "
                 + (f"{a}:{b} ranks {row['rank']} of {len(record['table'])} there" if row else
                    f"{a}:{b} was not among its candidates"))
    lines += table_lines(record)
    return lines + validation_lines(record.get("recommended"), (a, b))


def validation_lines(winner: str | None, block: tuple[int, int]) -> list[str]:
    """The full training of the sweep's winner against the keeper (training/keepers/smollm2-chase-A-B/versus-keeper,
    `workbench compare`), final answers per depth: why the keeper keeps its block."""
    from workbench.defaults import data_dirs
    from workbench.readers import read_json

    if winner is None or winner == "{}:{}".format(*block):
        return []
    name = "smollm2-chase-" + winner.replace(":", "-")
    found = [root / "training" / "keepers" / name / "versus-keeper" / "compare.json" for root in data_dirs()]
    found = [p for p in found if p.is_file()]
    if not found:
        return [f"the sweep's winner {winner} has no full training here to check it against the keeper"]
    cells = read_json(found[0], "comparison")["depths"]
    per = ", ".join(f"{'all' if c['depth'] is None else 'd' + str(c['depth'])} {c['b_correct']}/{c['n']} vs "
                    f"{c['a_correct']}" for c in cells)
    return [f"why the keeper keeps {block[0]}:{block[1]}: {winner} trained with the keeper's recipe reads, final answer "
            f"per depth against the keeper's: {per} (training/keepers/{name}/versus-keeper)"]
