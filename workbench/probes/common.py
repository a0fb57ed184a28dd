"""What the probes share: chain symbols, row selection and splits, batched encodings, token spans."""

from __future__ import annotations

from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

from workbench.devices import device_of
from workbench.errors import WorkbenchError
from workbench.loop.hooks import hook_name
from workbench.probes import NotApplicable
from workbench.probes.spec import Need
from workbench.tasks.chase import TEMPLATES
from workbench.tasks.reader import (
    answer_batches,
    encode_prompts,
    grade_answers,
    greedy_texts,
    read_positions,
    reads_symbol,
    row_candidates,
)


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


def function_table_rows(model, rows: list[dict]) -> str | None:
    """`FUNCTION_TABLE`'s test: None when every row is a function-table row (chase or p-hop, which is a chase over
    two-letter codes) with its table, else the reason."""
    bad = [r["row_id"] for r in rows if r.get("task") not in ("chase", "phop") or "table" not in r]
    return f"needs function-table rows (chase, phop); row '{bad[0]}' is not one" if bad else None


def one_token_answers(model, rows: list[dict]) -> str | None:
    """`ONE_TOKEN`'s test: None when every row's answer is one single-token symbol, else the reason (state
    tracking, arithmetic and a user's free text are read exactly, token by token)."""
    bad = [r["row_id"] for r in rows if not reads_symbol(r)]
    return (f"needs one-token answers; row '{bad[0]}' is read exactly, token by token (loop_accuracy and halting "
            "read those)") if bad else None


def halting_head(model, rows: list[dict]) -> str | None:
    """`HALTING_HEAD`'s test: None when the model has a halting head, else the reason (which also says where a
    model's own learned exit, such as Ouro's gate, is read instead)."""
    return None if model.halting is not None else (
        "the model has no halting head (retrofit with halting=True to train one; a model's own learned exit is read "
        "by exit_rules as 'head' and by adaptive_read)")


FUNCTION_TABLE = Need("function-table rows", function_table_rows)   # the probe needs f
ONE_TOKEN = Need("one-token answers", one_token_answers)             # the probe scores each loop over the symbols
HALTING_HEAD = Need("a halting head", halting_head)                  # the halting probe reads its stops


def require(need: Need, model, rows: list[dict]) -> None:
    """Raises NotApplicable with `need`'s reason when the rows or model do not meet it (a probe called directly)."""
    reason = need.why(model, rows)
    if reason is not None:
        raise NotApplicable(reason)


def require_chase(rows: list[dict]) -> None:
    """Raises NotApplicable unless every row is a function-table row with its table (`FUNCTION_TABLE`)."""
    require(FUNCTION_TABLE, None, rows)


def require_symbols(rows: list[dict]) -> None:
    """Raises NotApplicable when a row's answer is not one single-token symbol (`ONE_TOKEN`)."""
    require(ONE_TOKEN, None, rows)


@dataclass
class FinalRead:
    """Each row's final answer read at every loop 1..T (`read_final`).

    correct [R, T] bool; confidence [R, T] (symbol rows: the top symbol's softmax probability;
    multi-token answers: the greedy answer's probability); predicted [R][T] text; halt_probs
    {head name: continue probabilities [R, T]} ("head" is the model's own halting head); logprob [R, T]
    the answer's log-likelihood (symbol rows: log p of the answer among the row's symbols; multi-token
    answers: log p of the answer tokens over the vocabulary, teacher forced).
    """

    correct: np.ndarray
    confidence: np.ndarray
    predicted: list[list[str]]
    halt_probs: dict[str, np.ndarray]
    logprob: np.ndarray


@torch.no_grad()
def read_final(model, tokenizer, rows: list[dict], loops: int, batch_size: int = 16, progress: bool = False,
               heads: dict | None = None) -> FinalRead:
    """Returns a `FinalRead`: one forward per batch to `loops`, graded against each row's answer.

    Symbol rows are scored over their symbols; multi-token answers exactly (`read_answers`' rule).
    `heads` ({name: HaltingHead}) are more halting heads read on the same loop states (hooks on
    `hook_name("state", t)`), e.g. ACT and PonderNet heads trained on the same frozen model.
    """
    symbol = [reads_symbol(r) for r in rows]
    if len(set(symbol)) != 1:
        raise WorkbenchError("rows mix single-token symbol answers and multi-token answers; read them apart")
    R, T = len(rows), loops
    correct, confidence, logprob = np.zeros((R, T), dtype=bool), np.zeros((R, T)), np.zeros((R, T))
    predicted: list[list[str]] = [[] for _ in rows]
    probs: dict[str, np.ndarray] = {}
    device = device_of(model)
    if symbol[0]:
        chunks = ((idx, {"input_ids": e["input_ids"], "attention_mask": e["attention_mask"]})
                  for idx, e in batches(tokenizer, rows, batch_size, device))
    else:
        chunks = answer_batches(model, tokenizer, rows, T, batch_size, progress)
    for idx, b in chunks:
        batch_rows = [rows[i] for i in idx]
        extra = {"candidates": shared_candidates(row_candidates(tokenizer, batch_rows).to(device))} if symbol[0] \
            else {"positions": read_positions(b)}
        with _extra_heads(model, heads or {}, b["attention_mask"], T) as seen:
            r = model.read(b["input_ids"], attention_mask=b["attention_mask"], loops=T, **extra)
        if symbol[0]:
            s = r.scores[:, :, -1].double()                                          # [B, T, C]
            answer = torch.tensor([row["symbols"].index(row["answer"]) for row in batch_rows], device=s.device)
            ok, conf, top = s.argmax(-1) == answer[:, None], s.softmax(-1).max(-1).values, s.argmax(-1)
            ll = s.log_softmax(-1).gather(-1, answer[:, None, None].expand(-1, s.shape[1], 1)).squeeze(-1)
            text = [[row["symbols"][j] for j in top[k].tolist()] for k, row in enumerate(batch_rows)]
        else:
            ll, ok, top, greedy = grade_answers(tokenizer, r.scores, b)
            conf, text = greedy.double().exp(), greedy_texts(tokenizer, top, b)
        correct[idx], confidence[idx], logprob[idx] = ok.cpu().numpy(), conf.cpu().numpy(), ll.double().cpu().numpy()
        for k, i in enumerate(idx):
            predicted[i] = text[k]
        own = {"head": r.halt_probs} if getattr(r, "halt_probs", None) is not None else {}
        for name, p in {**own, **seen}.items():
            probs.setdefault(name, np.zeros((R, T)))[idx] = p.double().cpu().numpy()
    return FinalRead(correct, confidence, predicted, probs, logprob)


@contextmanager
def _extra_heads(model, heads: dict, attention_mask, T: int):
    """Reads each extra halting head on every loop's state during one `read`; yields {name: [B, T]} after it."""
    if not heads:
        yield {}
        return
    got: dict[str, list] = {name: [] for name in heads}

    def reader(h, hook):
        for name, head in heads.items():
            got[name].append(head(h, attention_mask))
        return h

    out: dict = {}
    with model.hooks(fwd_hooks=[(hook_name("state", t), reader) for t in range(1, T + 1)]):
        yield out
    out.update({name: torch.stack(v, dim=1) for name, v in got.items()})


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


UNKNOWN_DEPTH_LOOPS = 8  # loops read on rows whose depth is not given, when the model names no count of its own


def default_loops(model, rows: list[dict], at_least: int = 1) -> int:
    """The loops a probe reads when its battery gives no `loops`: the rows' max depth (at least `at_least`).

    A row whose depth is not given (depth 0, `workbench.tasks.user`) is read to the model's own loop count
    instead: `native_loops` (a native looped model), else 8 or the model's `max_loops` when smaller; never
    below a given depth.
    """
    depths = [r["depth"] for r in rows]
    if all(d >= 1 for d in depths):
        return max(at_least, max(depths))
    own = model.native_loops or min(UNKNOWN_DEPTH_LOOPS, model.max_loops)
    return max(at_least, own, *[d for d in depths if d >= 1])


def check_loops(model, loops: int) -> int:
    """Returns `loops` if the model can run that many, else raises naming its max_loops."""
    limit = model.max_loops
    if loops < 1 or loops > limit:
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
