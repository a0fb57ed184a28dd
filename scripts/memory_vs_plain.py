"""Loop Memory Attention against plain looping, row-paired at every loop count (issue 16, RecurTrace Table 5).

    .venv/bin/python scripts/memory_vs_plain.py PLAIN_RESULTS MEMORY_RESULTS --out DIR

Each RESULTS directory holds `loop_accuracy.parquet` from `workbench probe --checkpoint RUN --only loop_accuracy
--rows MANIFEST --out RESULTS` on the same manifest. Writes DIR/MEMORY_VS_PLAIN.md and memory_vs_plain.json:
accuracy at every loop count 1..T for both runs over all rows, the rows only memory gets right ("helped") and
only plain gets right ("hurt") with the exact McNemar p per loop, and the same per row depth at the loop count
equal to the depth.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from workbench.analysis.stats import paired_counts
from workbench.errors import WorkbenchError
from workbench.io import write_bytes_atomic


def paired(plain: pd.DataFrame, memory: pd.DataFrame, by: str) -> pd.DataFrame:
    """Per value of `by`: n, plain and memory correct, helped / hurt (memory's view), exact McNemar p."""
    m = plain.merge(memory, on=["row_id", "loop"], suffixes=("_plain", "_memory"), validate="one_to_one")
    if len(m) != len(plain) or len(m) != len(memory):
        raise WorkbenchError("the two results do not hold the same rows and loops; read both on one manifest")
    out = []
    for key, g in m.groupby(by):
        c = paired_counts(g["correct_plain"].astype(bool), g["correct_memory"].astype(bool))
        out.append({by: int(key), "n": c.n, "plain": c.a_correct, "memory": c.b_correct, "helped": c.helped,
                    "hurt": c.hurt, "p_mcnemar": c.p_mcnemar})
    return pd.DataFrame(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("plain", type=Path)
    ap.add_argument("memory", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    plain, memory = (pd.read_parquet(p / "loop_accuracy.parquet") for p in (a.plain, a.memory))
    per_loop = paired(plain, memory, "loop")
    at_depth = paired(plain[plain["loop"] == plain["depth"]], memory[memory["loop"] == memory["depth"]],
                      "loop").rename(columns={"loop": "depth"})
    lines = [f"# Memory vs plain looping ({a.memory} vs {a.plain})", "",
             f"Regenerate: `python scripts/memory_vs_plain.py {a.plain} {a.memory} --out {a.out}`. Rows paired by id; "
             "helped = memory right and plain wrong; exact McNemar p.", "",
             "Every row at every loop count:", "", "| loops | rows | plain | memory | helped | hurt | McNemar p |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r.loop} | {r.n} | {r.plain} ({r.plain / r.n:.3f}) | {r.memory} ({r.memory / r.n:.3f}) | {r.helped} | "
              f"{r.hurt} | {r.p_mcnemar:.3g} |" for r in per_loop.itertuples()]
    lines += ["", "Each depth at loops = depth:", "", "| depth | rows | plain | memory | helped | hurt | McNemar p |",
              "|---|---|---|---|---|---|---|"]
    lines += [f"| {r.depth} | {r.n} | {r.plain} | {r.memory} | {r.helped} | {r.hurt} | {r.p_mcnemar:.3g} |"
              for r in at_depth.itertuples()]
    text = "\n".join(lines) + "\n"
    a.out.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(a.out / "MEMORY_VS_PLAIN.md", text.encode())
    record = {"plain": str(a.plain), "memory": str(a.memory), "per_loop": per_loop.to_dict("records"),
              "at_depth": at_depth.to_dict("records")}
    write_bytes_atomic(a.out / "memory_vs_plain.json", (json.dumps(record, indent=1) + "\n").encode())
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
