"""The capability guardrail's rows, declared once without the model stack: 64 single-digit sums and differences
(answers 0-9, none a worked example of the few-shot prompt), drawn with a fixed seed.

`workbench.tasks.guardrail` scores them through the reader (torch); the claims ledger reads their answers here (the
majority answer's null beside a guardrail row) without importing the tasks or torch.
"""

from __future__ import annotations

import random

GUARDRAIL_VERSION = "arith-v1"
GUARDRAIL_ROWS = 64
GUARDRAIL_SEED = 20260702
DIGITS = [str(d) for d in range(10)]
SHOTS = "2 + 3 = 5\n7 - 4 = 3\n1 + 6 = 7\n9 - 1 = 8\n4 + 4 = 8\n6 - 6 = 0\n3 + 0 = 3\n8 - 5 = 3\n5 + 4 = 9\n4 - 2 = 2\n"


def guardrail_rows() -> list[dict]:
    """Returns the 64 battery rows (32 sums, 32 differences, answers 0-9, none a worked example)."""
    problems = {"+": [], "-": []}
    for a in range(10):
        for b in range(10):
            if f"{a} + {b} =" in SHOTS or f"{a} - {b} =" in SHOTS:
                continue  # no row repeats a worked example
            if a + b <= 9:
                problems["+"].append((a, b, a + b))
            if a - b >= 0:
                problems["-"].append((a, b, a - b))
    rng = random.Random(GUARDRAIL_SEED)
    chosen = [(op, p) for op in "+-" for p in rng.sample(problems[op], GUARDRAIL_ROWS // 2)]
    rng.shuffle(chosen)
    return [
        {
            "row_id": f"guardrail-{GUARDRAIL_VERSION}-{i:02d}",
            "task": "guardrail",
            "template_version": GUARDRAIL_VERSION,
            "depth": 1,
            "prompt": f"{SHOTS}{a} {op} {b} = ",
            "start": f"{a} {op} {b}",
            "chain": [str(r)],
            "answer": str(r),
            "symbols": DIGITS,
            "answer_prefix": "",  # the prompt's trailing space is already a token
        }
        for i, (op, (a, b, r)) in enumerate(chosen)
    ]
