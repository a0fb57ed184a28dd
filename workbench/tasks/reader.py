"""The one reader (retrofit paper Sec. 4.2): score the task's symbols at the read position of every loop.

Each candidate symbol is scored by the logit of its single token (" " + symbol, as it
follows `Answer:`) at the last prompt token of loop t, through the model's one-pass read
(`model.read(..., loops=T, candidates=...)`); the prediction is the argmax over the row's
symbols. Training targets, every probe, final answers and the capability guardrail all go
through `score_prompts`. Before its verdicts are trusted the reader is calibrated: a
perfect executor (`workbench.tasks.executors`) must score exactly 100% through it.

Prompts are encoded as raw text, without the chat template: the task surface is the text
the retrofit is trained on, and a chat wrapper would only add a fixed system preamble.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from workbench.errors import WorkbenchError
from workbench.tasks.manifest import rows_sha256

ANSWER_PREFIX = " "  # a row may override it with an `answer_prefix` field (the guardrail's digits do)


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


def encode_prompts(tokenizer, prompts: list[str]):
    """Returns a BatchEncoding of `input_ids` and `attention_mask`, LongTensor [B, S], left padded.

    The prompt text is encoded as given (no chat template), with the tokenizer's own special tokens.
    """
    return tokenizer(list(prompts), return_tensors="pt", padding=True, padding_side="left")


def _device(model) -> torch.device:
    try:
        return next(model.parameters()).device
    except (AttributeError, StopIteration):
        return torch.device("cpu")


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
    device = _device(model)
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


def read_rows(model, tokenizer, rows: list[dict], loops: int, batch_size: int = 16,
              progress: bool = False) -> ReadResult:
    """Returns a `ReadResult` of every row's symbol scores at loops 1..`loops` from one forward each.

    Raises:
        WorkbenchError: a row whose answer is not one of its symbols, or a symbol that is not one token.
    """
    if not rows:
        raise WorkbenchError("no rows to read")
    bad = [r["row_id"] for r in rows if r["answer"] not in r["symbols"]]
    if bad:
        raise WorkbenchError(f"row '{bad[0]}' has an answer that is not one of its symbols; the reader scores symbols")
    cands = [candidate_ids(tokenizer, r["symbols"], r.get("answer_prefix", ANSWER_PREFIX)) for r in rows]
    scores = score_prompts(model, tokenizer, [r["prompt"] for r in rows], cands, loops, batch_size, progress)
    return ReadResult(
        row_ids=[r["row_id"] for r in rows],
        depths=np.array([r["depth"] for r in rows]),
        chains=[list(r["chain"]) for r in rows],
        symbols=[list(r["symbols"]) for r in rows],
        scores=scores,
        manifest_sha256=rows_sha256(rows),
    )
