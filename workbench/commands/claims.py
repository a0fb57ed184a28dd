"""`workbench claims`: the claims ledger from the committed specimens (workbench.analysis.claims)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from workbench.commands.output import JSON, QUIET, Output


def claims(
    out: Optional[Path] = typer.Option(None, "--out", help="Write LEDGER.md, ledger.html and ledger.json here "
                                       "(the committed ledger is claims/ in the repository)."),
    claims_file: Optional[Path] = typer.Option(None, "--claims", help="A claims TOML file (default: the "
                                               "packaged workbench/data/claims.toml)."),
    root: Optional[Path] = typer.Option(None, "--root", help="Where the specimens named in the claims file live "
                                        "(default: the checkout's root, or an installed package's data, which mirrors it)."),
    quiet: bool = QUIET,
    as_json: bool = JSON,
) -> None:
    """Print the claims ledger: each paper claim, the paper's number, ours, the comparison and a verdict."""
    from workbench.analysis.claims import CLAIMS_FILE, LEDGER_FILES, ROOT, VERDICTS, build_ledger, write_ledger
    from workbench.analysis.claims.ledger import LEDGER_OUTPUT
    from workbench.guard import guard_output

    guard = None if out is None else guard_output(out, "claims", kind=LEDGER_OUTPUT, names=LEDGER_FILES,
                                                  overwrite=True, reading=[claims_file or CLAIMS_FILE])  # before any work
    ui = Output(quiet, as_json)
    rows = build_ledger(claims_file or CLAIMS_FILE, root or ROOT)
    ui.say("papers: 000 = the retrofit paper (Retrofitting Recurrent Depth into a Pretrained Language Model), "
           "002 = RecurTrace (Adaptive Latent Reasoning with Loop-Time Memory); [paper section] after each id\n")
    for r in rows:
        ui.say(f"{r['verdict'].upper():<15} {r['id']}  [{r['paper']} {r['section']}]",
               f"{'':<15} paper: {r['paper_value']}",
               f"{'':<15} ours:  {r['ours']}  ({r['specimen']}, {r['rows']} rows)",
               f"{'':<15} {r['why']}")
    counts = {v: sum(r["verdict"] == v for r in rows) for v in VERDICTS}
    ui.say(", ".join(f"{n} {v}" for v, n in counts.items()))
    if guard is not None:
        guard.recheck()
        for path in write_ledger(out, rows):
            ui.wrote(path)
    ui.result({"claims": rows, "counts": counts})
