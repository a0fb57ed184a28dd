"""How to read a battery's numbers: chance for its rows, and whether the battery is a demo (too few rows to cite).

`chance(rows)` is what guessing among each row's candidate symbols scores; `battery_notes(summary)` turns a
battery's summary.json into the lines `workbench probe` and `workbench demo` print under the headlines.
"""

from __future__ import annotations

from pathlib import Path

CITABLE_PER_DEPTH = 32  # fewer rows per depth than this: a look at the mechanism, not a number for a paper


def chance(rows: list[dict]) -> float | None:
    """The mean of 1 / (number of candidate symbols) over rows whose answer is one of their symbols, else None."""
    if not rows or not all(r.get("symbols") and r.get("answer") in r["symbols"] for r in rows):
        return None
    return sum(1 / len(r["symbols"]) for r in rows) / len(rows)


def battery_notes(summary: dict) -> list[str]:
    """One line per note: chance of the rows read, and a demo warning when any probe read few rows per depth."""
    notes = []
    runs = summary.get("probe_runs", {})
    chances = sorted({round(r["rows"]["chance"], 4) for r in runs.values() if r.get("rows", {}).get("chance")})
    if chances:
        notes.append(f"chance (guessing among each row's symbols): {' / '.join(f'{c:.3g}' for c in chances)}; "
                     "every accuracy above reads against it")
    small = {name: r["rows"]["per_depth"] for name, r in runs.items()
             if isinstance(r.get("rows", {}).get("per_depth"), int) and r["rows"]["per_depth"] < CITABLE_PER_DEPTH}
    battery = Path(str(summary.get("battery", ""))).stem
    if small or battery == "demo":
        fewest = min(small.values()) if small else None
        rows = f"as few as {fewest} rows per depth ({', '.join(sorted(small))}); " if small else ""
        notes.append(f"a demo battery: {rows}for looking at the mechanism, not numbers to cite "
                     "(run --battery default for those)")
    return notes
