"""The one reader (retrofit paper Sec. 4.2): score the task's symbols at the read position of every loop.

Rows whose answer is not one single-token symbol (RecurTrace's state tracking: six register
values; arithmetic: an integer; a user's free-text answer) are read exactly by `read_answers`
instead. What "the model answers A" means is defined once, by `writes_answer`: greedy decoding
writes the row's prefix and A, then the row's `answer_end` when it gives one (the built-in tasks
end their line, as they are trained), or else anything that does not continue A's last word:
" Paris.", " Paris\n" and " Paris is" answer "Paris"; " Parisian" does not. It is read in one
teacher-forced forward: the prompt is followed by the answer's tokens (prefix + A + end, tokenized
on their own, as greedy decoding appends them) and every loop is read at each answer position
over the whole vocabulary, and, when the row gives no end, at the answer's last token too. A row
is correct at loop t when the argmax at every answer position is the next answer token and the
argmax after the answer does not continue its last word: exactly when greedy decoding at loop t
writes what `writes_answer` accepts (a causal model's prediction at a position never sees the
tokens after it).

Each candidate symbol is scored by the logit of its single token (" " + symbol, as it
follows `Answer:`) at the last prompt token of loop t, through the model's one-pass read
(`model.read(..., loops=T, candidates=...)`); the prediction is the argmax over the row's
symbols. Training targets, every probe, final answers and the capability guardrail all go
through `score_prompts`. Before its verdicts are trusted the reader is calibrated: a
perfect executor (`tests/executors.py`) must score exactly 100% through it.

Prompts are encoded as raw text, without the chat template: the task surface is the text
the retrofit is trained on, and a chat wrapper would only add a fixed system preamble.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from workbench.devices import device_of
from workbench.errors import WorkbenchError
from workbench.tasks.manifest import rows_sha256

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from workbench.loop.looped import LoopedLM

ANSWER_PREFIX = " "  # a row may override it with an `answer_prefix` field (the guardrail's digits do)
ANSWER_END = "\n"   # the built-in tasks' answers end their line, as they are trained (`answer_end`)
WORD = re.compile(r"[\w\ufffd]")  # a word character; U+FFFD is part of a letter whose bytes a token splits
READ_BYTES = 256 * 2 ** 20  # full-vocabulary scores one `read_answers` forward may hold


@functools.lru_cache(maxsize=256)
def _single_token_ids(tokenizer, texts: tuple[str, ...]) -> tuple[int, ...]:
    ids = []
    for text in texts:
        tokens = tokenizer.encode(text, add_special_tokens=False)
        if len(tokens) != 1:
            raise WorkbenchError(
                f"symbol {text.strip()!r} is not a single token of tokenizer "
                f"'{tokenizer.name_or_path}' ({text!r} -> {len(tokens)} tokens)"
            )
        ids.append(tokens[0])
    return tuple(ids)


def candidate_ids(tokenizer, symbols: list[str], prefix: str = ANSWER_PREFIX) -> torch.Tensor:
    """Returns the token ids of prefix + symbol, LongTensor [C].

    Raises:
        WorkbenchError: a symbol that is not one token, naming it and the tokenizer.
    """
    if tokenizer is None:
        raise WorkbenchError("symbols are checked against a tokenizer; none was given")
    return torch.tensor(_single_token_ids(tokenizer, tuple(prefix + s for s in symbols)), dtype=torch.long)


def row_candidates(tokenizer, rows: list[dict]) -> torch.Tensor:
    """Returns the candidate token ids of each row's symbols (after the row's `answer_prefix`), LongTensor [B, C]."""
    return torch.stack([candidate_ids(tokenizer, r["symbols"], r.get("answer_prefix", ANSWER_PREFIX)) for r in rows])


def encode_prompts(tokenizer, prompts: list[str]):
    """Returns a BatchEncoding of `input_ids` and `attention_mask`, LongTensor [B, S], left padded.

    The prompt text is encoded as given (no chat template), with the tokenizer's own special tokens.
    """
    return tokenizer(list(prompts), return_tensors="pt", padding=True, padding_side="left")


@torch.no_grad()
def score_prompts(model, tokenizer, prompts: list[str], candidates: list[torch.Tensor], loops: int,
                  batch_size: int = 16, progress: bool = False) -> np.ndarray:
    """Returns candidate scores at the last prompt token of loops 1..T, float32 [R, T, C].

    Args:
        model: anything with the LoopedLM `read` signature.
        tokenizer: the model's tokenizer.
        prompts: R prompt texts.
        candidates: per prompt, the LongTensor [C] of candidate token ids (same C for all).
        loops: T.
        batch_size: prompts per forward pass; prompts are batched by length to limit padding.
        progress: show a progress bar.
    """
    if loops < 1:
        raise WorkbenchError(f"loops must be >= 1, got {loops}")
    if len({len(c) for c in candidates}) != 1:
        raise WorkbenchError("every row must have the same number of candidate symbols")
    lengths = [len(tokenizer.encode(p)) for p in prompts]
    order = np.argsort(lengths, kind="stable")
    scores = np.zeros((len(prompts), loops, len(candidates[0])), dtype=np.float32)
    device = device_of(model)
    for start in tqdm(range(0, len(order), batch_size), disable=not progress, desc="read"):
        idx = order[start:start + batch_size]
        enc = encode_prompts(tokenizer, [prompts[i] for i in idx]).to(device)
        cands = torch.stack([candidates[i] for i in idx])  # [B, C]
        if bool((cands == cands[0]).all()):
            cands = cands[0]  # shared by the batch: [C]
        readout = model.read(enc["input_ids"], attention_mask=enc["attention_mask"], loops=loops,
                             candidates=cands.to(device))
        expected = (len(idx), loops, 1, scores.shape[2])
        if tuple(readout.scores.shape) != expected:
            got = tuple(readout.scores.shape)
            raise WorkbenchError(f"model.read returned scores of shape {got}, expected {expected}")
        scores[idx] = readout.scores[:, :, -1, :].float().cpu().numpy()
    return scores


@dataclass
class ReadResult:
    """Per-row, per-loop candidate scores from `read_rows`, with what is needed to grade them."""

    row_ids: list[str]
    depths: np.ndarray  # [R]
    chains: list[list[str]]  # x_1..x_d per row
    symbols: list[list[str]]  # the N candidate symbols per row
    scores: np.ndarray  # [R, T, N]
    manifest_sha256: str  # rows_sha256 of the rows read, in order

    @property
    def loops(self) -> int:
        """T, the number of loops read."""
        return self.scores.shape[1]

    @property
    def predictions(self) -> np.ndarray:
        """Index of the argmax symbol per row and loop, int [R, T]."""
        return self.scores.argmax(axis=-1)

    def predicted_symbols(self) -> list[list[str]]:
        """The predicted symbol per row and loop."""
        return [[syms[j] for j in row] for syms, row in zip(self.symbols, self.predictions)]

    def frame(self) -> pd.DataFrame:
        """Returns one row per (row_id, loop): row_id, depth, loop, target, predicted, correct.

        `target` is x_t for t <= depth and None past it, where `correct` is <NA>.
        """
        records = []
        for rid, depth, chain, predicted in zip(self.row_ids, self.depths, self.chains, self.predicted_symbols()):
            for t, pred in enumerate(predicted, 1):
                target = chain[t - 1] if t <= depth else None
                records.append((rid, int(depth), t, target, pred, None if target is None else pred == target))
        df = pd.DataFrame.from_records(records, columns=["row_id", "depth", "loop", "target", "predicted", "correct"])
        df["correct"] = df["correct"].astype("boolean")
        return df


def read_rows(model: LoopedLM, tokenizer: PreTrainedTokenizerBase, rows: list[dict], loops: int, batch_size: int = 16,
              progress: bool = False) -> ReadResult:
    """Returns a `ReadResult` of every row's symbol scores at loops 1..`loops` from one forward each.

    Raises:
        WorkbenchError: a row whose answer is not one of its symbols, or a symbol that is not one token.
    """
    if not rows:
        raise WorkbenchError("no rows to read")
    bad = [r for r in rows if not reads_symbol(r)]
    if bad:
        raise WorkbenchError(f"row '{bad[0]['row_id']}' has an answer that is not one of its symbols "
                             f"({bad[0]['answer']!r}); read it exactly with read_answers")
    cands = [candidate_ids(tokenizer, r["symbols"], r.get("answer_prefix", ANSWER_PREFIX)) for r in rows]  # may differ
    scores = score_prompts(model, tokenizer, [r["prompt"] for r in rows], cands, loops, batch_size, progress)
    return ReadResult(
        row_ids=[r["row_id"] for r in rows],
        depths=np.array([r["depth"] for r in rows]),
        chains=[list(r["chain"]) for r in rows],
        symbols=[list(r["symbols"]) for r in rows],
        scores=scores,
        manifest_sha256=rows_sha256(rows),
    )


# ----------------------------------------------------------------------------- multi-token answers
def reads_symbol(row: dict) -> bool:
    """Whether a row's answer is one of its candidate symbols (`read_rows`); else `read_answers` reads it."""
    return row["answer"] in row["symbols"]


def answer_end(row: dict) -> str:
    """The text a row's answer must be followed by: its own `answer_end`; a built-in task's end of line (what it is
    trained to write); "" for a user's row that gives none, whose answer ends where its last word does."""
    if "answer_end" in row:
        return row["answer_end"]
    return "" if row.get("task") == "user" else ANSWER_END


def ends_answer(answer: str, rest: str, end: str) -> bool:
    """Whether `rest`, the text written right after `answer`, lets the answer stand: it starts with `end` when one is
    given; else it does not continue the answer's last word ("", ".", "\n" and " is" do not; "ian" after "Paris"
    does)."""
    if end:
        return rest.startswith(end)
    return not (WORD.match(answer[-1:]) and WORD.match(rest[:1]))


def writes_answer(text: str, row: dict) -> bool:
    """Whether `text`, what greedy decoding writes after a row's prompt, answers the row: what "the model answers A"
    means for every reader of a row read exactly.

    The text starts with the row's prefix and A, and then the row's `answer_end` (`answer_end`), or, for a row whose
    answer ends at its last word, anything that does not continue that word (`ends_answer`): " Paris.",
    " Paris\n" and " Paris is" answer "Paris"; " Parisian" does not. `read_answers` decides the same from one
    teacher-forced forward (`grade_answers`).
    """
    head = row.get("answer_prefix", ANSWER_PREFIX) + row["answer"]
    return text.startswith(head) and ends_answer(row["answer"], text[len(head):], answer_end(row))


def answer_token_ids(tokenizer, row: dict) -> list[int]:
    """The token ids greedy decoding must write for the row's answer: prefix + answer + the row's end (`answer_end`)."""
    text = row.get("answer_prefix", ANSWER_PREFIX) + row["answer"] + answer_end(row)
    return tokenizer.encode(text, add_special_tokens=False)


def answer_batch(tokenizer, rows: list[dict]) -> dict:
    """Prompt + answer tokens, left padded, and where each answer token is predicted.

    Returns {input_ids, attention_mask [B, S]; positions [B, K] (the position whose next-token
    prediction is answer token k; padded by repeating the last); targets [B, K] answer token ids;
    valid [B, K] bool; after [B] the position whose prediction follows the answer (its last token);
    open [B] bool, the rows whose answer ends at its last word (no `answer_end`)}, K the longest
    answer in tokens.
    """
    prompts = tokenizer([r["prompt"] for r in rows])["input_ids"]
    answers = [answer_token_ids(tokenizer, r) for r in rows]
    seqs = [p + a for p, a in zip(prompts, answers)]
    S, K = max(map(len, seqs)), max(map(len, answers))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    ids = torch.full((len(rows), S), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), S), dtype=torch.long)
    positions = torch.zeros((len(rows), K), dtype=torch.long)
    targets = torch.full((len(rows), K), pad, dtype=torch.long)
    valid = torch.zeros((len(rows), K), dtype=torch.bool)
    after = torch.zeros(len(rows), dtype=torch.long)
    for i, (p, a, seq) in enumerate(zip(prompts, answers, seqs)):
        offset = S - len(seq)
        ids[i, offset:], mask[i, offset:] = torch.tensor(seq), 1
        first = offset + len(p) - 1                       # the last prompt token predicts answer token 0
        positions[i] = torch.tensor([first + min(k, len(a) - 1) for k in range(K)])
        targets[i, : len(a)], valid[i, : len(a)] = torch.tensor(a), True
        after[i] = first + len(a)
    open_ = torch.tensor([answer_end(r) == "" for r in rows])
    return {"input_ids": ids, "attention_mask": mask, "positions": positions, "targets": targets, "valid": valid,
            "after": after, "open": open_}


def read_positions(batch: dict) -> torch.Tensor:
    """The positions a read of `answer_batch` scores, LongTensor: the answer positions [B, K], then, when a row's
    answer ends at its last word, the position after it [B, K + 1] (`grade_answers` reads both)."""
    if not bool(batch["open"].any()):
        return batch["positions"]
    return torch.cat([batch["positions"], batch["after"][:, None]], dim=1)


def grade_answers(tokenizer, scores: torch.Tensor, batch: dict):
    """`answer_logprobs` of a read at `read_positions(batch)`, scores [B, T, K or K + 1, V], with its exact match
    [B, T] made `writes_answer`'s: a row without an `answer_end` also needs its next greedy token not to continue
    its answer's last word."""
    K = batch["positions"].shape[1]
    logp, hit, top, greedy = answer_logprobs(scores[:, :, :K], batch["targets"], batch["valid"])
    if scores.shape[2] > K:
        after = scores[:, :, K].argmax(-1)                                          # [B, T]
        hit = hit & _ends_word(tokenizer, batch, after).to(hit.device)
    return logp, hit, top, greedy


def greedy_texts(tokenizer, top: torch.Tensor, batch: dict) -> list[list[str]]:
    """[B][T] the text greedy decoding writes at the answer positions, stripped: the argmax tokens [B, T, K] up to
    and including the first that differs from the answer (past it teacher forcing reads text greedy decoding never
    wrote), all of them when none does."""
    wrong = (top != batch["targets"][:, None]) & batch["valid"][:, None]                   # [B, T, K]
    lengths = torch.where(wrong.any(-1), wrong.int().argmax(-1) + 1, batch["valid"].sum(-1)[:, None])
    return [[tokenizer.decode(top[i, t, :n].tolist()).strip() for t, n in enumerate(row)]
            for i, row in enumerate(lengths.tolist())]


def _ends_word(tokenizer, batch: dict, after: torch.Tensor) -> torch.Tensor:
    """[B, T] bool: whether greedy token `after` ends each open row's answer (`ends_answer`; rows with an end: True).

    The token is decoded after the answer's tokens, not alone: a SentencePiece word's leading space shows only
    in context."""
    out = torch.ones(after.shape, dtype=torch.bool)
    for i in torch.nonzero(batch["open"].cpu()).flatten().tolist():
        answer = batch["targets"][i, batch["valid"][i]].tolist()
        text = tokenizer.decode(answer, skip_special_tokens=True)
        for t, token in enumerate(after[i].tolist()):
            rest = tokenizer.decode(answer + [token], skip_special_tokens=True)[len(text):]
            out[i, t] = ends_answer(text, rest, "")
    return out


def answer_logprobs(scores: torch.Tensor, targets: torch.Tensor, valid: torch.Tensor):
    """(log p of the answer [B, T], exact greedy match [B, T], argmax tokens [B, T, K], log p of the greedy
    tokens [B, T]) from full-vocabulary scores [B, T, K, V] at the answer positions (teacher forced)."""
    logp = scores.float().log_softmax(-1)
    target = targets.unsqueeze(1).expand(-1, scores.shape[1], -1)              # [B, T, K]
    picked = logp.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    best, top = logp.max(-1)
    hit = (top == target) | ~valid.unsqueeze(1)
    keep = valid.unsqueeze(1)
    return (picked * keep).sum(-1), hit.all(-1), top, (best * keep).sum(-1)


@dataclass
class AnswerRead:
    """Every loop's exact reading of multi-token answers, from `read_answers`."""

    row_ids: list[str]
    depths: np.ndarray  # [R]
    answers: list[str]
    predicted: list[list[str]]  # [R][T] what greedy decoding writes at the answer positions, stripped (`greedy_texts`)
    correct: np.ndarray  # [R, T] bool: greedy decoding at loop t writes the answer (`writes_answer`)
    logprob: np.ndarray  # [R, T] log p(answer tokens) at loop t
    manifest_sha256: str

    @property
    def loops(self) -> int:
        """T, the number of loops read."""
        return self.correct.shape[1]

    def frame(self) -> pd.DataFrame:
        """Returns one row per (row_id, loop): row_id, depth, loop, target (the answer), predicted, correct, logprob."""
        records = [(rid, int(d), t + 1, ans, pred[t], bool(ok[t]), float(lp[t]))
                   for rid, d, ans, pred, ok, lp in zip(self.row_ids, self.depths, self.answers, self.predicted,
                                                        self.correct, self.logprob) for t in range(len(ok))]
        df = pd.DataFrame.from_records(records, columns=["row_id", "depth", "loop", "target", "predicted", "correct",
                                                         "logprob"])
        df["correct"] = df["correct"].astype("boolean")
        return df


def answer_batches(model, tokenizer, rows: list[dict], loops: int, batch_size: int, progress: bool = False):
    """Yields (row indices, `answer_batch` on the model's device), rows batched by prompt length; a batch is
    split further so that full-vocabulary scores at the answer positions stay under `READ_BYTES`."""
    device = device_of(model)
    longest = max(len(answer_token_ids(tokenizer, r)) + (answer_end(r) == "") for r in rows)
    step = max(1, min(batch_size, READ_BYTES // (4 * loops * longest * len(tokenizer))))
    order = np.argsort([len(tokenizer.encode(r["prompt"])) for r in rows], kind="stable")
    for start in tqdm(range(0, len(order), step), disable=not progress, desc="read answers"):
        idx = [int(i) for i in order[start:start + step]]
        yield idx, {k: v.to(device) for k, v in answer_batch(tokenizer, [rows[i] for i in idx]).items()}


@torch.no_grad()
def read_answers(model: LoopedLM, tokenizer: PreTrainedTokenizerBase, rows: list[dict], loops: int, batch_size: int = 16,
                 progress: bool = False) -> AnswerRead:
    """Returns an `AnswerRead`: each row's answer read exactly at loops 1..`loops`, one forward per batch.

    Full-vocabulary scores are held only at the answer positions; a batch is split further so that
    they stay under `READ_BYTES`.

    Raises:
        WorkbenchError: no rows, or loops < 1.
    """
    if not rows:
        raise WorkbenchError("no rows to read")
    if loops < 1:
        raise WorkbenchError(f"loops must be >= 1, got {loops}")
    correct = np.zeros((len(rows), loops), dtype=bool)
    logprob = np.zeros((len(rows), loops))
    predicted: list[list[str]] = [[] for _ in rows]
    for idx, b in answer_batches(model, tokenizer, rows, loops, batch_size, progress):
        readout = model.read(b["input_ids"], attention_mask=b["attention_mask"], loops=loops,
                             positions=read_positions(b))
        lp, ok, top, _ = grade_answers(tokenizer, readout.scores, b)
        texts = greedy_texts(tokenizer, top, b)
        for j, i in enumerate(idx):
            correct[i], logprob[i] = ok[j].cpu().numpy(), lp[j].double().cpu().numpy()
            predicted[i] = texts[j]
    return AnswerRead(row_ids=[r["row_id"] for r in rows], depths=np.array([r["depth"] for r in rows]),
                      answers=[r["answer"] for r in rows], predicted=predicted, correct=correct, logprob=logprob,
                      manifest_sha256=rows_sha256(rows))
