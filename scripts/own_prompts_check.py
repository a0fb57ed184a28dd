"""The README's "Your own prompts" flow on ten factual rows, checked against what `generate` writes (issue 55).

    PYTHONPATH=. .venv/bin/python scripts/own_prompts_check.py --out /tmp/own [--checkpoint smollm2-chase]
        [--loops 8]

Writes ten rows of one- and multi-token answers to OUT/facts.jsonl, then runs the README's commands as a user
would, each in its own process:

    workbench rows --from OUT/facts.jsonl --out OUT/rows/facts.jsonl
    workbench probe --checkpoint CKPT --rows OUT/rows/facts.jsonl --out OUT/results
    workbench generate CKPT --prompts OUT/prompts.txt --loops 1-T --max-new-tokens N --json

and checks, for every row and loop count t, that `probe`'s loop_accuracy reads the row correct exactly when the
text greedy decoding writes at t answers it (`workbench.tasks.reader.writes_answer`), and that the accuracy per
loop `probe` stores in summary.json equals `generate`'s. Prints both per loop and exits 1 on any disagreement.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd

from workbench.tasks.manifest import read_manifest
from workbench.tasks.reader import writes_answer

FACTS = [   # (prompt, answer): one-token and multi-token answers of the SmolLM2 tokenizer
    ("The capital of France is", "Paris"),
    ("The capital of Italy is", "Rome"),
    ("The capital of Japan is", "Tokyo"),
    ("The capital of Germany is", "Berlin"),
    ("The largest planet in the solar system is", "Jupiter"),
    ("The chemical symbol for gold is", "Au"),
    ("The city that never sleeps is", "New York"),
    ("Romeo and Juliet was written by", "William Shakespeare"),
    ("The first president of the United States was", "George Washington"),
    ("The theory of relativity was developed by", "Albert Einstein"),
]
NEW_TOKENS = 12   # the README's --max-new-tokens: every answer here is at most 4 tokens, then one to end it


def workbench(*args: str) -> str:
    """Runs `python -m workbench ARGS` as a user would and returns its stdout; a failure stops the check."""
    done = subprocess.run([sys.executable, "-m", "workbench", *args], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"workbench {' '.join(args)} exited {done.returncode}: {done.stderr.strip()}")
    return done.stdout


def json_of(stdout: str) -> dict:
    """The JSON object `--json` prints, from the first line that opens one (a third-party warning may precede it
    on a fresh cache: issue 55 item 4)."""
    start = next(i for i, line in enumerate(stdout.splitlines(keepends=True)) if line.startswith("{"))
    return json.loads("".join(stdout.splitlines(keepends=True)[start:]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint", default="smollm2-chase")
    parser.add_argument("--out", type=Path, required=True, help="A new directory for the rows and results.")
    parser.add_argument("--loops", type=int, default=8, help="Loop counts 1..T generated (probe reads 1..8).")
    args = parser.parse_args()
    out = args.out
    out.mkdir(parents=True, exist_ok=False)
    source = out / "facts.jsonl"
    source.write_text("".join(json.dumps({"prompt": p, "answer": a}) + "\n" for p, a in FACTS), encoding="utf-8")
    (out / "prompts.txt").write_text("".join(p + "\n" for p, _ in FACTS), encoding="utf-8")

    manifest = out / "rows" / "facts.jsonl"
    workbench("rows", "--from", str(source), "--out", str(manifest))
    shown = workbench("probe", "--checkpoint", args.checkpoint, "--rows", str(manifest), "--out", str(out / "results"))
    print(shown, end="")
    rows = read_manifest(manifest).rows
    summary = json.loads((out / "results" / "summary.json").read_text())
    read = pd.read_parquet(out / "results" / "loop_accuracy.parquet").set_index(["row_id", "loop"])["correct"]

    texts = json_of(workbench("generate", args.checkpoint, "--prompts", str(out / "prompts.txt"),
                              "--loops", f"1-{args.loops}", "--max-new-tokens", str(NEW_TOKENS), "--json"))
    written = {(r["prompt_index"], r["loops"]): r["text"] for r in texts["rows"]}
    loops = sorted(set(read.index.get_level_values("loop")) & {t for _, t in written})
    disagree, lines = [], []
    for t in loops:
        greedy = [writes_answer(written[(i, t)], r) for i, r in enumerate(rows)]
        probe = [bool(read[(r["row_id"], t)]) for r in rows]
        disagree += [(r["row_id"], t, written[(i, t)]) for i, r in enumerate(rows) if greedy[i] != probe[i]]
        printed = summary["probes"]["loop_accuracy"]["by_loop"][str(t)]
        if round(sum(greedy) / len(rows), 4) != printed:
            disagree.append(("accuracy", t, f"summary {printed} against {sum(greedy)}/{len(rows)}"))
        lines.append(f"loop {t}: probe {sum(probe)}/{len(rows)} (summary.json {printed:.2f}), "
                     f"generate {sum(greedy)}/{len(rows)}")
    print("\n".join(lines))
    for row_id, t, text in disagree:
        print(f"disagree: {row_id} at loop {t}: {text!r}")
    pairs = len(loops) * len(rows)
    print(f"{pairs - len(disagree)}/{pairs} (row, loop) pairs agree; threads {os.environ.get('OMP_NUM_THREADS', 'all')}")
    return 1 if disagree else 0


if __name__ == "__main__":
    sys.exit(main())
