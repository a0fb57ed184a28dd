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
    """One line per note: chance of the rows read; a demo battery, or any probe that read few rows per depth, said so.

    A probe whose rows give no depth (`depth_not_given` = n: a user's rows) read all n of them, per_depth aside.
    """
    notes = []
    runs = summary.get("probe_runs", {})
    chances = sorted({round(r["rows"]["chance"], 4) for r in runs.values() if r.get("rows", {}).get("chance")})
    if chances:
        notes.append(f"chance (guessing among each row's symbols): {' / '.join(f'{c:.3g}' for c in chances)}; "
                     "every accuracy above reads against it")
    small = {}
    for name, r in runs.items():
        read = r.get("rows", {})
        if read.get("depth_not_given") and read["depth_not_given"] == read.get("n"):   # no depth: every row is read
            count = read["n"]
        else:
            count = read.get("per_depth") if isinstance(read.get("per_depth"), int) else None
        if count is not None and count < CITABLE_PER_DEPTH:
            small[name] = count
    battery = Path(str(summary.get("battery", ""))).stem
    fewest = f"as few as {min(small.values())} rows per depth ({', '.join(sorted(small))}); " if small else ""
    if battery == "demo":
        notes.append(f"a demo battery: {fewest}for looking at the mechanism, not numbers to cite "
                     "(run --battery default for those)")
    elif small:
        notes.append(f"few rows: {fewest}their intervals are wide, and a difference inside them is not a finding")
    return notes
