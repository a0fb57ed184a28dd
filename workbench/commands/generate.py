"""`workbench generate`: the continuation of each prompt under every loop count, side by side."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from workbench.commands.initial_state import INIT_SEED, INIT_STATE
from workbench.commands.lens import MODEL_HELP, read_prompts
from workbench.commands.output import JSON, QUIET, Output
from workbench.devices import DEVICE_HELP
from workbench.errors import WorkbenchError

SHOWN = {"\n": "⏎", "\r": "␍", "\t": "⇥"}   # how a continuation's control characters print


def generate(
    model: str = typer.Argument(..., help=MODEL_HELP),
    prompt: Optional[list[str]] = typer.Option(None, "--prompt", "-p", help="A prompt (repeatable); raw text, no "
                                               "chat template."),
    prompts_file: Optional[Path] = typer.Option(None, "--prompts", help="A text file of prompts, one a line "
                                                "(write \\n for a newline inside a prompt)."),
    block: Optional[str] = typer.Option(None, "--block", help="For a base model: the layers to loop, A:B."),
    loops: Optional[str] = typer.Option(None, "--loops", help="Loop counts, e.g. 1,2,4,8 or 1-4 (default 1,2,4,8 "
                                        "up to the model's max_loops, and a native model's own count)."),
    max_new_tokens: int = typer.Option(32, "--max-new-tokens", help="Tokens generated per prompt at most."),
    sample: bool = typer.Option(False, "--sample", help="Sample (seeded) instead of greedy decoding."),
    temperature: Optional[float] = typer.Option(None, "--temperature", help="With --sample: softmax(logits / "
                                                "temperature) (default 1.0)."),
    top_k: Optional[int] = typer.Option(None, "--top-k", help="With --sample: draw from the k most probable tokens."),
    seed: int = typer.Option(0, "--seed", help="With --sample: the seed (a private generator; the same seed gives "
                             "the same text)."),
    cache: bool = typer.Option(True, "--cache/--no-cache", help="Decode on a KV cache (default), or recompute the "
                               "whole sequence each token."),
    stop_at_eos: bool = typer.Option(True, "--stop-at-eos/--ignore-eos", help="Stop a prompt at the model's "
                                     "end-of-sequence token (default), or always run --max-new-tokens."),
    init_seed: Optional[int] = INIT_SEED,
    init_state: Optional[Path] = INIT_STATE,
    device: str = typer.Option("auto", "--device", help="Device: " + DEVICE_HELP),
    quiet: bool = QUIET,
    as_json: bool = JSON,
) -> None:
    """Continue each prompt under every loop count (greedy, or seeded sampling) and print them side by side."""
    from workbench.commands.initial_state import prompt_states, read_init_state
    from workbench.devices import resolve_device
    from workbench.generation import check_loops, check_settings, parse_loops
    from workbench.generation import generate as run_generate

    ui = Output(quiet, as_json)
    texts = read_prompts(prompt, prompts_file)
    asked = None if loops is None else parse_loops(loops)   # every input checked before the model loads
    given = [name for name, value in (("--temperature", temperature), ("--top-k", top_k)) if value is not None]
    if given and not sample:   # greedy decoding takes the most probable token: the option would do nothing
        raise WorkbenchError(f"{' and '.join(given)} shape{'s' * (len(given) == 1)} sampling; add --sample (greedy "
                             "decoding, the default, takes the most probable token)")
    temperature = 1.0 if temperature is None else temperature
    check_settings(max_new_tokens, temperature, top_k, seed, 8)
    states = prompt_states(read_init_state(init_state), len(texts))
    from workbench.checkpoints import parse_model

    checkpoint = parse_model(model, block)
    run_on = resolve_device(device)
    from workbench.runs import load_checkpoint

    ui.step(f"loading {model}")
    looped, tok, info = load_checkpoint(checkpoint)
    asked = check_loops(looped, asked)
    given = [name for name, value in (("--init-state", init_state), ("--init-seed", init_seed)) if value is not None]
    if given:
        from workbench.models.native.own import require_initial_state

        require_initial_state(looped, " and ".join(given), f"'{model}'")
    looped.to(run_on)
    frame = run_generate(looped, tok, texts, loops=asked, max_new_tokens=max_new_tokens, sample=sample,
                         temperature=temperature, top_k=top_k, seed=seed, cache=cache, stop_at_eos=stop_at_eos,
                         progress=ui.progress, init_state=states, init_seed=init_seed)
    if ui.human:
        print_generations(frame, model)
    ui.result({"model": {"spec": model, "kind": info["kind"], "max_loops": int(looped.max_loops),
                         "native_loops": frame.attrs["native_loops"]},
               "settings": {k: frame.attrs[k] for k in ("loops", "max_new_tokens", "sample", "temperature", "top_k",
                                                        "seed", "cached", "stop_at_eos")},
               "initial_state": {"init_seed": init_seed, "init_state": None if init_state is None else str(init_state)},
               "device": str(run_on), "prompts": texts, "rows": frame.to_dict(orient="records")})


def shown(text: str) -> str:
    """A continuation on one line: newlines as ⏎, tabs as ⇥, other control characters as \\xNN."""
    return "".join(SHOWN.get(c, c if c.isprintable() or c == " " else f"\\x{ord(c):02x}") for c in text)


def print_generations(frame, model: str) -> None:
    """Prints, per prompt, a table of its continuation under each loop count (within 100 columns)."""
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    from workbench.plots.terminal import console

    con = console()
    native = frame.attrs.get("native_loops")
    for i, part in frame.groupby("prompt_index", sort=True):
        text = shown(part.prompt.iloc[0])
        title = text if len(text) <= 80 else "…" + text[-79:]
        table = Table(title=escape(f"prompt {i + 1}: {title}"), box=box.SIMPLE_HEAD, title_justify="left",
                      pad_edge=False)
        table.add_column("loops", justify="right", no_wrap=True)
        table.add_column("continuation", overflow="fold", ratio=1)
        table.add_column("tokens", justify="right", no_wrap=True)
        table.add_column("stop", no_wrap=True)
        for rec in part.to_dict(orient="records"):
            mark = "*" if native is not None and rec["loops"] > native else ""
            table.add_row(f"{rec['loops']}{mark}", escape(shown(rec["text"])) or "–", str(rec["n_tokens"]),
                          rec["stopped"])
        con.print(table)
    attrs = frame.attrs
    how = "greedy" if not attrs["sample"] else (f"sampled (seed {attrs['seed']}, temperature {attrs['temperature']:g}"
                                                 + (f", top-k {attrs['top_k']}" if attrs["top_k"] else "") + ")")
    cached = "on a KV cache" if attrs["cached"] else "without a cache (the whole sequence recomputed each token)"
    con.print(f"{model}: {how}, {cached}; ⏎ is a newline" + (f"; * past the native {native} passes (never trained "
                                                              "there: docs/analyses.md)" if native is not None and
                                                              max(attrs["loops"]) > native else ""))
