"""Copies the committed ledger's tables into the pages that show them, so none can go stale.

    python scripts/ledger_tables.py           # rewrite README.md and docs/results/README.md from claims/LEDGER.md
    python scripts/ledger_tables.py --check   # exit 1 when a page differs from the ledger

README.md and docs/results/README.md carry the "Verdicts per paper" table; docs/results/README.md also carries
the whole claims table under "The ledger as committed". Each copy is found by its header line and replaced
line for line (tests/test_claims.py checks the same copies).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COUNTS, CLAIMS = "| paper | reproduced | not reproduced | not comparable |", "| claim |"


def _table(lines: list[str], start: int) -> tuple[int, int]:
    end = next(k for k in range(start, len(lines) + 1) if k == len(lines) or not lines[k].startswith("|"))
    return start, end


def _replace(lines: list[str], header: str, new: list[str], after: str | None = None) -> list[str]:
    begin = 0 if after is None else next(k for k, line in enumerate(lines) if line.startswith(after))
    out, k = list(lines), begin
    while True:
        hits = [i for i in range(k, len(out)) if out[i].startswith(header)]
        if not hits:
            return out
        s, e = _table(out, hits[0])
        out[s:e] = new
        k = s + len(new)
        if after is not None:
            return out


def pages() -> dict[Path, str]:
    ledger = (ROOT / "claims" / "LEDGER.md").read_text().splitlines()
    counts = ledger[slice(*_table(ledger, next(k for k, line in enumerate(ledger) if line.startswith(COUNTS))))]
    claims = ledger[slice(*_table(ledger, next(k for k, line in enumerate(ledger) if line.startswith(CLAIMS))))]
    out = {}
    for page in ("README.md", "docs/results/README.md"):
        lines = (ROOT / page).read_text().splitlines()
        lines = _replace(lines, COUNTS, counts)
        if page == "docs/results/README.md":
            lines = _replace(lines, CLAIMS, claims, after="The ledger as committed")
        out[ROOT / page] = "\n".join(lines) + "\n"
    return out


def main(argv: list[str]) -> int:
    stale = [p for p, text in pages().items() if p.read_text() != text]
    if "--check" in argv:
        for p in stale:
            print(f"{p.relative_to(ROOT)} differs from claims/LEDGER.md: run python scripts/ledger_tables.py")
        return 1 if stale else 0
    for p, text in pages().items():
        p.write_text(text)
    print(f"rewrote {len(stale)} page(s) from claims/LEDGER.md")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
