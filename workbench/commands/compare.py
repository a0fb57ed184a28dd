"""`workbench compare`: pair two results directories row by row (final answers) with exact McNemar tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer


def compare(
    results_a: Path = typer.Argument(..., help="Results directory A (the reference, e.g. the untrained control)."),
    results_b: Path = typer.Argument(..., help="Results directory B (helped = B right, A wrong)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Directory for compare.json and compare.parquet "
                                       "(default: RESULTS_B)."),
    as_json: bool = typer.Option(False, "--json", help="Print compare.json instead of the tables."),
) -> None:
    """Compare two probe results: final answers per depth (McNemar), then every headline number side by side
    with B − A and its paired 95% interval over the rows both read."""
    import pandas as pd

    from workbench.analysis.headlines import compare_headlines, console, headlines_from_tables, print_comparison
    from workbench.analysis.results import compare_results, load_results
    from workbench.io import atomic_path, dir_inputs, gate_output, write_json_atomic
    from workbench.probes import PROBES, get_probe

    target = Path(out) if out is not None else Path(results_b)
    written = ("compare.json", "compare.parquet")
    gate = gate_output(target, "compare", kind="file", names=written, overwrite=True,  # before any work
                       reading=dir_inputs(results_a, results_b, exclude=written))
    table = compare_results(results_a, results_b)
    records = [{k: (None if pd.isna(v) else v) for k, v in r.items()} for r in table.to_dict("records")]
    tables = [load_results(r) for r in (results_a, results_b)]  # headlines recomputed, with per-row values
    headlines = compare_headlines(*(headlines_from_tables(t, {n: get_probe(n).headline for n in PROBES if n in t})
                                    for t in tables))
    rows = table.attrs.get("rows", {})
    report = {"a": str(results_a), "b": str(results_b), "rows": rows, "depths": records, "headlines": headlines}
    gate.recheck()
    target.mkdir(parents=True, exist_ok=True)
    write_json_atomic(target / "compare.json", report)
    with atomic_path(target / "compare.parquet") as tmp:
        table.to_parquet(tmp, index=False)
    if as_json:
        typer.echo(json.dumps(report, indent=1, default=str))
        return
    con = console()
    if rows:
        con.print(f"rows both read: {rows['compared']} of {rows['manifest'] or 'the manifest'} (A read {rows['a']}, "
                  f"B read {rows['b']})")
    con.print("final answers (t = d), paired by row: helped = B right and A wrong; exact McNemar p")
    con.print(_depth_table(records))
    print_comparison(headlines, str(results_a), str(results_b), out=con)
    typer.echo(f"wrote {target / 'compare.json'}\n  and {target / 'compare.parquet'}")


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
