"""Corrupted pairs: each clean row and its twins that differ in one fact the answer depends on, paired by construction.

Built once here for the three probes that read them (`patching`, `attribution`, `paths`):

    entry   one table entry on the chain changed: the line of x_{k-1} (read by loop k, the "step") now
            sends it elsewhere, so the chain, and the answer, change from step k on
    start   the start symbol changed (the answer changes; every step differs)

Only twins with the same number of tokens, differing only inside the edited text, and a different
answer are kept. Each pair's tokens are split into the position classes a probe patches (`POSITIONS`:
edited, entries, start, question, other, read; `workbench.probes.patching` says what each holds). A user's row
(`workbench rows --from`) brings its own twin as `corrupt`: corruption "user".
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from workbench.errors import WorkbenchError
from workbench.probes.common import iterate, line_spans, require
from workbench.probes.spec import Need
from workbench.tasks.chase import TEMPLATES
from workbench.tasks.reader import ANSWER_PREFIX, candidate_ids

CORRUPTIONS = ("entry", "start")
POSITIONS = ("edited", "entries", "start", "question", "other", "read")


@dataclass
class Pair:
    """A clean row and its corrupted twin, token for token the same length.

    positions: {position class: unpadded token indices}; cands: the row's candidate ids; answer and
    corrupted index the clean and the corrupted answer among them."""

    pair_id: int
    row: dict
    corruption: str
    step: int
    edited: str
    clean_ids: torch.Tensor
    corrupt_ids: torch.Tensor
    positions: dict[str, list[int]]
    cands: torch.Tensor
    answer: int
    corrupted: int
    corrupted_answer: str
    corrupted_chain: list[str] = field(default_factory=list)


def _question(row: dict, start: str) -> str:
    tpl = TEMPLATES[row.get("surface", "symbolic")]
    unit = tpl["unit"][0] if row["depth"] == 1 else tpl["unit"][1]
    return tpl["question"].format(start=start, count=row["depth"], unit=unit)


def _chain(table: dict, start: str, depth: int) -> list[str]:
    out, x = [], start
    for _ in range(depth):
        x = table[x]
        out.append(x)
    return out


def corrupt_row(row: dict, corruption: str, rng: np.random.Generator, step: int | None = None) -> dict | None:
    """The corrupted twin of a chase row (prompt, table, start, answer, chain, step), or None if none changes
    the answer. `step` (1..depth) picks the entry corruption's edited line: the one loop `step` reads."""
    symbols, d = row["symbols"], row["depth"]
    tpl = TEMPLATES[row.get("surface", "symbolic")]
    if corruption == "start":
        for s in rng.permutation(symbols):
            s = str(s)
            chain = _chain(row["table"], s, d)
            if s != row["start"] and chain[-1] != row["answer"]:
                old, new = _question(row, row["start"]), _question(row, s)
                if row["prompt"].count(old) != 1:
                    return None
                return {"prompt": row["prompt"].replace(old, new), "table": row["table"], "start": s,
                        "answer": chain[-1], "chain": chain, "step": 0, "edited": f"start {row['start']} -> {s}"}
        return None
    if corruption != "entry":
        raise WorkbenchError(f"patching corruption '{corruption}' is unknown; accepted: {', '.join(CORRUPTIONS)}")
    states = [row["start"], *[iterate(row, t) for t in range(1, d + 1)]]      # x_0 .. x_d
    steps = [step] if step is not None else list(range(1, d + 1))
    for k in steps:
        key = states[k - 1]
        if states[:d].count(key) != 1:        # the line is read by one loop only: the step is well defined
            continue
        for v in rng.permutation(symbols):
            v = str(v)
            if v == row["table"][key]:
                continue
            table = {**row["table"], key: v}
            chain = _chain(table, row["start"], d)
            if chain[-1] == row["answer"]:
                continue
            old, new = tpl["line"].format(k=key, v=row["table"][key]), tpl["line"].format(k=key, v=v)
            if row["prompt"].count("\n" + old + "\n") != 1:
                return None
            return {"prompt": row["prompt"].replace("\n" + old + "\n", "\n" + new + "\n"), "table": table,
                    "start": row["start"], "answer": chain[-1], "chain": chain, "step": k,
                    "edited": f"{old} -> {v}"}
    return None


def corrupt_pairs(tokenizer, rows: list[dict], corruptions=CORRUPTIONS, seed: int = 0) -> tuple[list[Pair], int]:
    """Returns (pairs, skipped): each row's twin per corruption, the entry corruption's step cycling 1..depth
    over the rows so every step is edited about equally often. A twin is skipped (counted) when none changes
    the answer, or its tokens differ from the clean row's outside the edited text."""
    rng = np.random.default_rng(seed)
    pairs, skipped = [], 0
    for n, row in enumerate(rows):
        if "corrupt" in row:
            pair = _user_pair(tokenizer, len(pairs), row)
            if pair is None:
                skipped += 1
            else:
                pairs.append(pair)
            continue
        spans, _, length = line_spans(tokenizer, row)
        start_twin = corrupt_row(row, "start", np.random.default_rng([seed, n]))
        start_tokens = _differing(tokenizer, row["prompt"], start_twin["prompt"]) if start_twin else None
        for corruption in corruptions:
            step = 1 + n % row["depth"] if corruption == "entry" else None
            twin = corrupt_row(row, corruption, rng, step) or (corrupt_row(row, corruption, rng)
                                                               if corruption == "entry" else None)
            pair = _pair(tokenizer, len(pairs), row, twin, corruption, spans, length, start_tokens) if twin else None
            if pair is None:
                skipped += 1
                continue
            pairs.append(pair)
    return pairs, skipped


def _differing(tokenizer, a: str, b: str) -> list[int] | None:
    ia, ib = tokenizer(a)["input_ids"], tokenizer(b)["input_ids"]
    if len(ia) != len(ib):
        return None
    return [i for i, (x, y) in enumerate(zip(ia, ib)) if x != y]


def _pair(tokenizer, pair_id, row, twin, corruption, spans, length, start_tokens) -> Pair | None:
    diff = _differing(tokenizer, row["prompt"], twin["prompt"])
    if not diff or start_tokens is None:
        return None
    table_end = max(e for _, e in spans.values())
    line_tokens = set(range(table_end))          # the header, the lines and the breaks between them
    read = length - 1
    if corruption == "entry":
        key = next(k for k in row["table"] if twin["table"][k] != row["table"][k])
        edited = list(range(*spans[key]))
        if not set(diff) <= set(edited):
            return None
        start = [i for i in start_tokens if i not in edited]
    else:
        edited, start = diff, []
        if not set(diff) <= set(start_tokens):
            return None
    entries = sorted(line_tokens - set(edited))
    taken = set(edited) | set(entries) | set(start) | {read}
    positions = {"edited": sorted(edited), "entries": entries, "start": sorted(start),
                 "question": [i for i in range(length) if i not in taken], "other": [], "read": [read]}
    cands = candidate_ids(tokenizer, row["symbols"], row.get("answer_prefix", ANSWER_PREFIX))
    ids = lambda text: torch.tensor([tokenizer(text)["input_ids"]])  # noqa: E731
    return Pair(pair_id, row, corruption, twin["step"], twin["edited"], ids(row["prompt"]), ids(twin["prompt"]),
                positions, cands, row["symbols"].index(row["answer"]), row["symbols"].index(twin["answer"]),
                twin["answer"], twin["chain"])


def _user_pair(tokenizer, pair_id: int, row: dict) -> Pair | None:
    twin = row["corrupt"]
    diff = _differing(tokenizer, row["prompt"], twin["prompt"])
    if not diff:
        return None
    ids = tokenizer(row["prompt"])["input_ids"]
    read = len(ids) - 1
    positions = {"edited": [i for i in diff if i != read], "entries": [], "start": [], "question": [],
                 "other": [i for i in range(read) if i not in diff], "read": [read]}
    cands = candidate_ids(tokenizer, row["symbols"], row.get("answer_prefix", ANSWER_PREFIX))
    return Pair(pair_id, row, "user", 0, "the row's corrupt prompt", torch.tensor([ids]),
                torch.tensor([tokenizer(twin["prompt"])["input_ids"]]), positions, cands,
                row["symbols"].index(row["answer"]), row["symbols"].index(twin["answer"]), twin["answer"], [])


def corrupt_twins(model, rows: list[dict]) -> str | None:
    """`CORRUPT_TWIN`'s test: None when every row is a chase row whose corrupted twins the probe can build, or
    brings its own twin (`corrupt`), else the reason."""
    bad = [r["row_id"] for r in rows if "corrupt" not in r and (
        r.get("task") not in ("chase", "phop") or "table" not in r or r.get("surface", "symbolic") not in TEMPLATES)]
    return (f"needs a corrupted twin: a function-table row whose one fact it corrupts (an entry, the start), or a "
            f"row's own corrupt twin; row '{bad[0]}' is neither (give it a corrupt field: docs/cli.md)") if bad else None


CORRUPT_TWIN = Need("a corrupted twin", corrupt_twins)   # patching, attribution and paths write clean into it


def require_pairs(rows: list[dict]) -> None:
    """Raises NotApplicable unless every row has a corrupted twin the probe can build or read (`CORRUPT_TWIN`)."""
    require(CORRUPT_TWIN, None, rows)
