"""What the probes share: chain symbols, row selection and splits, batched encodings, token spans."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import torch

from workbench.errors import WorkbenchError
from workbench.tasks.chase import TEMPLATES
from workbench.tasks.reader import ANSWER_PREFIX, candidate_ids, encode_prompts


def iterate(row: dict, t: int) -> str:
    """Returns f^t(x0) of a chase row: its start at t = 0, x_t for t <= d, the chain continued past d."""
    x = row["start"]
    for _ in range(t):
        x = row["table"][x]
    return x


def iterate_from(row: dict, x: str, j: int) -> str:
    """Returns f^j(x) under the row's table."""
    for _ in range(j):
        x = row["table"][x]
    return x


def require_chase(rows: list[dict], probe: str) -> None:
    """Raises WorkbenchError unless every row is a chase row with its table (the probe needs f)."""
    bad = [r["row_id"] for r in rows if r.get("task") != "chase" or "table" not in r]
    if bad:
        raise WorkbenchError(f"the {probe} probe needs chase rows with a table; row '{bad[0]}' is not one")


def select_rows(rows: list[dict], depths=None, per_depth: int | None = None) -> list[dict]:
    """Returns the rows at `depths` (all if None), the first `per_depth` at each, in manifest order."""
    taken: dict[int, int] = defaultdict(int)
    out = []
    for r in rows:
        d = r["depth"]
        if depths is not None and d not in depths:
            continue
        if per_depth is not None and taken[d] >= per_depth:
            continue
        taken[d] += 1
        out.append(r)
    if not out:
        raise WorkbenchError(f"no rows left after selecting depths {depths} and per_depth {per_depth}")
    return out


def split_rows(rows: list[dict], fraction: float, seed: int) -> tuple[list[dict], list[dict]]:
    """Returns two disjoint row lists, `fraction` of each depth in the first, shuffled by `seed`.

    Each depth keeps at least one row on each side when it has two or more rows.
    """
    if not 0 < fraction < 1:
        raise WorkbenchError(f"split fraction {fraction} must lie strictly between 0 and 1")
    by_depth: dict[int, list[int]] = defaultdict(list)
    for i, r in enumerate(rows):
        by_depth[r["depth"]].append(i)
    rng = np.random.default_rng(seed)
    first, second = [], []
    for d in sorted(by_depth):
        idx = list(rng.permutation(by_depth[d]))
        k = int(round(fraction * len(idx)))
        k = min(max(k, 1), len(idx) - 1) if len(idx) >= 2 else len(idx)
        first += idx[:k]
        second += idx[k:]
    return [rows[i] for i in sorted(first)], [rows[i] for i in sorted(second)]


def device_of(model) -> torch.device:
    """The device of the model's parameters (CPU for parameterless stand-ins)."""
    try:
        return next(model.parameters()).device
    except (AttributeError, StopIteration):
        return torch.device("cpu")


def row_candidates(tokenizer, rows: list[dict]) -> torch.Tensor:
    """Returns the candidate token ids of each row's symbols, LongTensor [B, C]."""
    return torch.stack([candidate_ids(tokenizer, r["symbols"], r.get("answer_prefix", ANSWER_PREFIX)) for r in rows])


def shared_candidates(cands: torch.Tensor) -> torch.Tensor:
    """[C] when every row of a [B, C] batch scores the same candidates, else the [B, C] tensor."""
    return cands[0] if bool((cands == cands[0]).all()) else cands


def token_lengths(tokenizer, rows: list[dict]) -> list[int]:
    """Token count of each row's prompt as `encode_prompts` encodes it."""
    return [len(ids) for ids in tokenizer([r["prompt"] for r in rows])["input_ids"]]


def batches(tokenizer, rows: list[dict], batch_size: int, device=None):
    """Yields `(indices, encoding)` over `rows`, batched by token length (left padded, on `device`)."""
    if batch_size < 1:
        raise WorkbenchError(f"batch_size must be >= 1, got {batch_size}")
    order = np.argsort(token_lengths(tokenizer, rows), kind="stable")
    for start in range(0, len(order), batch_size):
        idx = [int(i) for i in order[start:start + batch_size]]
        enc = encode_prompts(tokenizer, [rows[i]["prompt"] for i in idx])
        yield idx, (enc.to(device) if device is not None else enc)


def check_loops(model, loops: int) -> int:
    """Returns `loops` if the model can run that many, else raises naming its max_loops."""
    limit = getattr(model, "max_loops", None)
    if loops < 1 or (limit is not None and loops > limit):
        raise WorkbenchError(f"this probe needs {loops} loops but the model runs 1..{limit} (its max_loops)")
    return loops


def line_spans(tokenizer, row: dict) -> tuple[dict[str, tuple[int, int]], tuple[int, int], int]:
    """Returns the token spans of a chase prompt's table lines, unpadded.

    Returns:
        ({key symbol: (first token, end token)} for the line that says where the key goes,
         (first, end) token span of the whole table, number of prompt tokens). A token belongs to
        a line when its characters overlap the line's text (`K -> V` without the newline).
    """
    enc = tokenizer(row["prompt"], return_offsets_mapping=True)
    offsets = enc["offset_mapping"]
    tpl = TEMPLATES[row.get("surface", "symbolic")]["line"]
    text, spans = row["prompt"], {}
    for k, v in row["table"].items():
        line = tpl.format(k=k, v=v)
        start = text.find("\n" + line + "\n")
        if start < 0:
            raise WorkbenchError(f"row '{row['row_id']}': table line {line!r} not found in its prompt")
        spans[k] = _token_span(offsets, start + 1, start + 1 + len(line))
    first = min(s for s, _ in spans.values())
    last = max(e for _, e in spans.values())
    return spans, (first, last), len(enc["input_ids"])


def _token_span(offsets, char_start: int, char_end: int) -> tuple[int, int]:
    hits = [i for i, (a, b) in enumerate(offsets) if b > a and a < char_end and b > char_start]
    return hits[0], hits[-1] + 1
