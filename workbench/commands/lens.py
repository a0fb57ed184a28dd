"""`workbench lens`: what every loop of a looped model predicts next on your own prompts."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from workbench.commands.initial_state import INIT_SEED
from workbench.commands.output import JSON, QUIET, Output
from workbench.devices import DEVICE_HELP
from workbench.errors import WorkbenchError

MODEL_HELP = ("A run directory or a shipped keeper's name (smollm2-chase), a native looped model (an Inkling2Loop, "
              "HRM-Text, Raven/Huginn or Ouro directory; tiny-inkling2-loop, tiny-hrm-text, tiny-raven, tiny-ouro), "
              "untrained:RUN_DIR or untrained:BASE:A:B, "
              "or a base model (an HF directory, a .gguf, smollm2-135m-instruct, tiny-llama) with --block A:B.")


def read_prompts(prompt: list[str] | None, prompts_file: Path | None) -> list[str]:
    """The --prompt texts, then the --prompts file's lines (one prompt a line, `\\n` inside a line is a newline),
    read by `workbench.texts.read_lines`: a BOM dropped, CRLF read as LF, at most 64 MiB."""
    out = list(prompt or [])
    if prompts_file is not None:
        from workbench.texts import read_lines

        out += [line.replace("\\n", "\n") for _, line in read_lines(prompts_file, "--prompts")]
    from workbench.lenses import check_prompts

    return check_prompts(out)


def lens(
    model: str = typer.Argument(..., help=MODEL_HELP),
    prompt: Optional[list[str]] = typer.Option(None, "--prompt", "-p", help="A prompt (repeatable); raw text, no "
                                               "chat template."),
    prompts_file: Optional[Path] = typer.Option(None, "--prompts", help="A text file of prompts, one a line "
                                                "(write \\n for a newline inside a prompt)."),
    block: Optional[str] = typer.Option(None, "--block", help="For a base model: the layers to loop, A:B."),
    loops: Optional[int] = typer.Option(None, "--loops", help="Loops T to read (default: a native model's pass "
                                        "count, else 8 or the model's max_loops)."),
    positions: str = typer.Option("-1", "--positions", help="Positions to read: -1 (the last token), 'all', "
                                  "'0,3,-1' or '2-5' (negative counts from the end)."),
    top_k: int = typer.Option(5, "--top-k", help="Most probable tokens listed per loop and lens."),
    target: Optional[list[str]] = typer.Option(None, "--target", help="A token whose rank is listed (repeatable); "
                                               "exactly one token, e.g. ' Paris' with its leading space."),
    tuned: Optional[Path] = typer.Option(None, "--tuned", help="A tuned lens saved by workbench.lenses.save_tuned_lens."),
    html_out: Optional[Path] = typer.Option(None, "--html", help="Also write an offline HTML page: a loop x position "
                                            "map of the top token and its probability per prompt and lens."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an --html page the workbench wrote."),
    init_seed: Optional[int] = INIT_SEED,
    device: str = typer.Option("auto", "--device", help="Device: " + DEVICE_HELP),
    quiet: bool = QUIET,
    as_json: bool = JSON,
) -> None:
    """Per-loop lens on your prompts: top tokens, probabilities, entropy and KL to the last loop, every loop."""
    from workbench.devices import resolve_device
    from workbench.lenses import parse_positions, target_ids

    ui = Output(quiet, as_json)
    texts = read_prompts(prompt, prompts_file)
    asked = parse_positions(positions)          # every input checked before the model loads
    if top_k < 1:
        raise WorkbenchError(f"--top-k {top_k} must be at least 1")
    if tuned is not None and not Path(tuned).is_file():
        raise WorkbenchError(f"--tuned '{tuned}' does not exist (write one with workbench.lenses.save_tuned_lens)")
    from workbench.checkpoints import parse_model

    checkpoint = parse_model(model, block)
    run_on = resolve_device(device)
    guard = None
    if html_out is not None:
        from workbench.guard import guard_output
        from workbench.plots.prompt_lens import LENS_OUTPUT

        if Path(html_out).suffix != ".html":
            raise WorkbenchError(f"--html '{html_out}' must end in .html")
        guard = guard_output(html_out, "lens", kind=LENS_OUTPUT, overwrite=overwrite,
                             reading=[p for p in (prompts_file, tuned) if p is not None])
    from workbench.runs import load_checkpoint

    ui.step(f"loading {model}")
    looped, tok, info = load_checkpoint(checkpoint)
    from workbench.models.native.own import seed_initial_state

    seed_initial_state(looped, init_seed, f"'{model}'")
    target_ids(tok, target)                     # a target that is not one token: refused before any forward
    from workbench.lenses import check_loops
    from workbench.lenses import lens as read_lens

    T = check_loops(looped, loops)
    looped.to(run_on)
    frame = read_lens(looped, tok, texts, loops=T, positions=asked, top_k=top_k, targets=target,
                      tuned=tuned, progress=ui.progress)
    if ui.human:
        print_lens(frame)
    if guard is not None:
        from workbench.io import write_bytes_atomic
        from workbench.plots.prompt_lens import lens_page

        page = lens_page(frame, title=f"Per-loop lens: {model}")
        guard.recheck()
        Path(html_out).parent.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(Path(html_out), page.encode("utf-8"))
        ui.wrote(html_out)
    ui.result({"model": {"spec": model, "kind": info["kind"], "loops": T, "init_seed": init_seed},
               "lenses": frame.attrs["lenses"], "prompts": texts, "rows": frame.to_dict(orient="records")})


def print_lens(frame, top: int = 3) -> None:
    """Prints, per prompt and position, a table: loop, the coda lens's top tokens, entropy, KL to the last loop,
    the other lenses' top token and each target's rank."""
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    from workbench.lenses import loop_table
    from workbench.plots.terminal import console

    con = console()
    prompts = frame.attrs.get("prompts", [])
    lenses = frame.attrs.get("lenses", ["coda", "raw"])
    targets = list(dict.fromkeys(frame[frame.kind == "target"].token))
    for (i, pos), part in frame.groupby(["prompt_index", "position"], sort=True):
        text = prompts[i] if i < len(prompts) else ""
        shown = text if len(text) <= 70 else "…" + text[-69:]
        where = f"position {pos} {part.input_token.iloc[0]!r}, predicting the next token"
        table = Table(title=escape(f"prompt {i + 1}: {shown!r}\n{where}"), box=box.SIMPLE_HEAD, title_justify="left",
                      pad_edge=False)
        table.add_column("loop", justify="right")
        table.add_column(f"coda: top {top} (p)", overflow="fold")
        table.add_column("H", justify="right")
        table.add_column("KL→T", justify="right")
        for name in lenses[1:]:
            table.add_column(f"{name} top", overflow="fold")
        for t in targets:
            table.add_column(f"rank {t!r}", justify="right")
        for rec in loop_table(frame, int(i), int(pos), top=top).to_dict(orient="records"):
            cells = [str(rec["loop"]), " ".join(f"{tok!r} {_p(p)}" for tok, p in rec["coda_top"]),
                     f"{rec['coda_entropy']:.2f}", f"{rec['coda_kl']:.3f}"]
            for name in lenses[1:]:
                best = rec.get(f"{name}_top")
                cells.append(f"{best[0][0]!r} {_p(best[0][1])}" if isinstance(best, list) and best else "–")
            cells += [str(rec.get(f"coda_rank:{t}", "–")) for t in targets]
            table.add_row(*(escape(c) for c in cells))
        con.print(table)
    con.print(f"loops 1..{frame.attrs.get('loops')}; H: entropy of the coda lens (nats); KL→T: KL(p_T || p_t) to the "
              "last loop's coda reading, the model's own output; ranks: 0 = most probable")


def _p(p: float) -> str:
    """A probability in four characters or so: 0.91, 0.05, 3e-04."""
    return f"{p:.2f}" if p >= 0.01 else f"{p:.0e}"
