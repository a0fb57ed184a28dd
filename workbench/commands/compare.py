"""`workbench compare`: pair two results directories row by row (final answers) with exact McNemar tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from workbench.commands.output import JSON, QUIET, Output
from workbench.guard import FILES, OutputKind

WRITTEN = ("compare.json", "compare.parquet")


def compare_file(path: Path) -> bool:
    """Whether `path` is one of a comparison's files that the workbench wrote: compare.json holding the two
    results and the depths, or compare.parquet beside such a compare.json."""
    if path.name == "compare.parquet":
        return compare_file(path.parent / "compare.json")
    if path.name != "compare.json":
        return False
    try:
        record = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and {"a", "b", "depths"} <= set(record)


# What `compare` writes, handed to the output guard: WRITTEN in one directory, each replaced only when it is a
# comparison the workbench wrote.
COMPARE_OUTPUT = OutputKind("comparison", FILES, owns=compare_file)


def compare(
    results_a: Path = typer.Argument(..., help="Results directory A (the reference, e.g. the untrained control)."),
    results_b: Path = typer.Argument(..., help="Results directory B (helped = B right, A wrong)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Directory for compare.json and compare.parquet "
                                       "(default: RESULTS_B)."),
    quiet: bool = QUIET,
    as_json: bool = JSON,
) -> None:
    """Compare two probe results: final answers per depth (McNemar), then every headline number side by side
    with B − A and its paired 95% interval over the rows both read."""
    import pandas as pd

    from workbench.analysis.headlines import compare_headlines, headlines_from_tables
    from workbench.analysis.results import compare_results, load_results
    from workbench.guard import dir_inputs, guard_output
    from workbench.io import atomic_path, write_json_atomic
    from workbench.plots.terminal import console, print_comparison

    ui = Output(quiet, as_json)
    target = Path(out) if out is not None else Path(results_b)
    guard = guard_output(target, "compare", kind=COMPARE_OUTPUT, names=WRITTEN, overwrite=True,  # before any work
                         reading=dir_inputs(results_a, results_b, exclude=WRITTEN))
    table = compare_results(results_a, results_b)
    records = [{k: (None if pd.isna(v) else v) for k, v in r.items()} for r in table.to_dict("records")]
    tables = [load_results(r) for r in (results_a, results_b)]  # headlines recomputed, with per-row values
    head_a, head_b = (headlines_from_tables(t) for t in tables)
    headlines = [{**r, "label_a": _label(head_a, r), "label_b": _label(head_b, r)}
                 for r in compare_headlines(head_a, head_b)]
    rows = table.attrs.get("rows", {})
    report = {"a": str(results_a), "b": str(results_b), "rows": rows, "depths": records, "headlines": headlines}
    guard.recheck()
    target.mkdir(parents=True, exist_ok=True)
    write_json_atomic(target / "compare.json", report)
    with atomic_path(target / "compare.parquet") as tmp:
        table.to_parquet(tmp, index=False)
    if ui.human:
        con = console()
        if rows:
            con.print(f"rows both read: {rows['compared']} of {rows['manifest'] or 'the manifest'} (A read "
                      f"{rows['a']}, B read {rows['b']})")
        con.print("final answers (t = d), paired by row: helped = B right and A wrong; exact McNemar p")
        con.print(_depth_table(records))
        print_comparison([{**r, "label": _side_labels(r)} for r in headlines], str(results_a), str(results_b),
                         out=con)
    ui.wrote(target / "compare.json")
    ui.wrote(target / "compare.parquet", f"  and {target / 'compare.parquet'}")
    ui.result(report)


def _label(headlines: dict, record: dict) -> str | None:
    """The label one side gives a number (its own top head, its own null p95), or None where it lacks it."""
    h = headlines.get(record["probe"])
    return h[record["key"]].label if h is not None and record["key"] in h.keys() else None


def _side_labels(record: dict) -> str:
    """One label where both sides give the same; otherwise each side's own, A's first, so no value is
    shown under the other run's head or null."""
    a, b = record["label_a"], record["label_b"]
    return record["label"] if a is None or b is None or a == b else f"A: {a}\nB: {b}"


def _depth_table(records: list[dict]):
    """The per-depth final-answer table (rich)."""
    from rich import box
    from rich.table import Table

    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for name in ("depth", "n", "A", "B", "helped", "hurt", "tied", "McNemar p"):
        table.add_column(name, justify="right")
    for r in records:
        table.add_row("all" if r["depth"] is None else str(r["depth"]), *(str(r[k]) for k in
                      ("n", "a_correct", "b_correct", "helped", "hurt", "tied")), f"{r['p_mcnemar']:.4g}")
    return table
