"""Copies the committed ledger's tables into the pages that show them, so none can go stale.

    python scripts/ledger_tables.py           # rewrite README.md and docs/results/README.md from claims/LEDGER.md
    python scripts/ledger_tables.py --check   # exit 1 when a page differs from the ledger

README.md and docs/results/README.md carry the "Verdicts per paper" table; docs/results/README.md also carries
the whole claims table under "The ledger as committed". Each copy is found by its header line and replaced
line for line. A results page names the rows it discusses in a block

    <!-- ledger: claim-id other-claim-id -->
    ...generated: one line per row, its verdict, its reading and what differs...
    <!-- /ledger -->

and its prose states no verdict of its own (no bold **reproduced** and the like outside such a block), so a
regenerated ledger cannot leave a page saying what the ledger no longer says (tests/test_claims.py checks all).
"""

from __future__ import annotations

import json
import re
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


BLOCK = re.compile(r"(<!-- ledger: ([^>]*?) -->\n)(.*?)(<!-- /ledger -->)", re.S)
VERDICT = re.compile(r"\*\*(not\s+reproduced|not\s+comparable|not\s+shown|reproduced)\*\*")


def _block(rows: dict[str, dict], ids: list[str]) -> str:
    lines = []
    for cid in ids:
        r = rows[cid]
        like = "like for like" if r["like_for_like"] else "setting differs: " + "; ".join(r["differs"])
        lines.append(f"- `{cid}` ({r['paper']} {r['section']}): **{r['verdict']}**. Ours: {r['ours']} "
                     f"({r['rows']} rows). {like}.")
    return "\n".join(lines) + "\n"


def blocks(text: str, rows: dict[str, dict]) -> str:
    """A page's text with every ledger block regenerated from the ledger's rows."""
    def fill(m: re.Match) -> str:
        ids = m.group(2).split()
        unknown = [i for i in ids if i not in rows]
        if unknown:
            raise SystemExit(f"a ledger block names claims the ledger lacks: {', '.join(unknown)}")
        return m.group(1) + _block(rows, ids) + m.group(4)
    return BLOCK.sub(fill, text)


def stray_verdicts(text: str) -> list[str]:
    """Bold verdicts a page states outside its generated blocks and tables copied from the ledger."""
    bare = "\n".join(line for line in BLOCK.sub("", text).splitlines() if not line.startswith("|"))
    return [" ".join(bare[max(0, m.start() - 60):m.end()].split()) for m in VERDICT.finditer(bare)]


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
    rows = {r["id"]: r for r in json.loads((ROOT / "claims" / "ledger.json").read_text())}
    for page in sorted((ROOT / "docs" / "results").glob("*.md")):
        out[page] = blocks(out.get(page, page.read_text()), rows)
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
