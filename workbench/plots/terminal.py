"""Tables in the terminal, drawn with rich: the Console every command prints its tables through (`console`), the
headline table and a comparison of two specimens.

The headline table's content is `workbench.analysis.headlines.headline_table`, the one the report draws as HTML
(`workbench.plots.report`); this module lays it out in at most `WIDTH` columns (`workbench probe`, and
`workbench compare` for the comparison).
"""
from __future__ import annotations

from typing import Mapping

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from workbench.analysis.headlines import Headline, Number, failed_predictions, headline_table, judged_predictions

WIDTH = 100


def console(width: int = WIDTH):
    """A rich Console that never wraps wider than `width` columns and writes plain text when piped."""
    return Console(width=width, highlight=False, soft_wrap=False)


def rich_headline_table(headlines: Mapping[str, Headline], skipped: Mapping[str, str] | None = None,
                        title: str | None = None) -> Table:
    """Returns the headline table (`headline_table`) as a rich Table: probe, quantity, value [95% interval], n; a
    probe that did not apply gets a line saying why."""
    table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, expand=False, title_justify="left")
    table.add_column("probe", style="bold", no_wrap=True)
    table.add_column("quantity", overflow="fold", ratio=1)
    table.add_column("value [95% CI]", no_wrap=True, justify="right")
    table.add_column("n", justify="right", no_wrap=True)
    for name, headline, reason in headline_table(headlines, skipped):
        rows = [(escape(n.label) + _flag(n), n.text(), "" if n.n is None else str(n.n))
                for n in (headline.numbers if headline is not None else [])]
        if reason is not None:
            rows.append((escape(f"not applicable: {reason}"), "", ""))
        for i, (label, value, n) in enumerate(rows):
            table.add_row(escape(name) if i == 0 else "", label, escape(value), n)
        table.add_section()
    return table


def _flag(n: Number) -> str:
    """After a judged number's label: a red FAILED where its prediction missed, a quiet "(holds)" where it held
    (the failed ones are listed with what was predicted under the table)."""
    if n.holds is None:
        return ""
    return " [dim](holds)[/dim]" if n.holds else " [bold red]FAILED[/bold red]"


def print_headlines(headlines: Mapping[str, Headline], skipped: Mapping[str, str] | None = None,
                    width: int = WIDTH, title: str | None = None, out=None) -> None:
    """Prints the headline table, then each probe's sentence, within `width` columns."""
    con = console(width) if out is None else out
    con.print(rich_headline_table(headlines, skipped, title=title))
    for name, h in headlines.items():
        con.print(f"[bold]{escape(name)}[/bold]: {escape(h.sentence)}")
    failed = failed_predictions(headlines)
    judged = len(judged_predictions(headlines))
    if judged:
        con.print(f"predictions judged: {judged}; failed: {len(failed)}"
                  + "".join(f"\n  [bold red]FAILED[/bold red] {escape(p)}: {escape(n.label)} = {escape(n.text())}, "
                            f"predicted {escape(n.expect)}" for p, n in failed))


def print_comparison(records: list[dict], name_a: str, name_b: str, width: int = WIDTH, out=None) -> None:
    """Prints `workbench.analysis.headlines.compare_headlines` records as a table within `width` columns."""
    con = console(width) if out is None else out
    con.print(f"A = {escape(name_a)}\nB = {escape(name_b)}\nB − A: paired bootstrap over the rows both read "
              f"(95% CI); McNemar p where the rows are 0/1, one per row. The report (`workbench report B --control A`) "
              f"gives each side's own interval.")
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("quantity", overflow="fold", ratio=1)
    table.add_column("A", justify="right", no_wrap=True)
    table.add_column("B", justify="right", no_wrap=True)
    table.add_column("B − A [95% CI]", justify="right", no_wrap=True)
    table.add_column("McNemar p", justify="right", no_wrap=True)
    probe = None
    for r in records:
        if r["probe"] != probe:
            if probe is not None:
                table.add_section()
            table.add_row(f"[bold]{escape(r['probe'])}[/bold]", "", "", "", "")
            probe = r["probe"]
        p = "" if r["p_mcnemar"] is None else f"{r['p_mcnemar']:.2g}"
        table.add_row(escape(r["label"]), escape(r["a_value"]), escape(r["b_value"]), escape(r["diff"]), p)
    con.print(table)


__all__ = ["WIDTH", "console", "print_comparison", "print_headlines", "rich_headline_table"]
