"""Stand-in models with the LoopedLM `read` signature, for calibrating the reader and the probes.

Each decodes every row's `input_ids` back to text, recovers the task from the prompt, and
puts one symbol on top at each loop: the perfect executor the chain x_t (and f^t(x0) past
the depth), the parking executor x_min(t, d). A reader that does not score the perfect
executor at exactly 100% is broken.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from workbench.tasks.chase import ChaseInstance, parse_prompt


@dataclass
class Readout:
    """What `read` returns: `scores` [B, T, P, C] (loops 1..T along dim 1), `states` unused here."""

    scores: torch.Tensor
    states: torch.Tensor | None = None


def parse_chase(text: str) -> ChaseInstance:
    """Returns the chase instance of a prompt of any surface."""
    return parse_prompt(text)[1]


class ReadoutExecutor:
    """A fake model whose loop-t readout puts `symbol_at(parse(prompt_text), t)` on top (1, others 0).

    Args:
        tokenizer: decodes rows and candidate ids.
        symbol_at: (parsed row, loop t) -> the answer at loop t, without its leading space.
        parse: prompt text -> parsed row, once per row (default: the chase parser).
    """

    def __init__(self, tokenizer, symbol_at: Callable[[object, int], str],
                 parse: Callable[[str], object] = parse_chase):
        self.tokenizer = tokenizer
        self.symbol_at = symbol_at
        self.parse = parse
        self._decoded: dict[int, str] = {}

    def _texts(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> list[str]:
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        return [self.tokenizer.decode(ids[mask.bool()], skip_special_tokens=True)
                for ids, mask in zip(input_ids, attention_mask)]

    def _candidate_texts(self, candidates: torch.Tensor) -> list[str]:
        for c in candidates.tolist():
            if c not in self._decoded:
                self._decoded[c] = self.tokenizer.decode([c]).strip()
        return [self._decoded[c] for c in candidates.tolist()]

    def read(self, input_ids, attention_mask=None, loops=1, positions=None, candidates=None,
             return_states=False) -> Readout:
        """Returns a `Readout` with scores [B, T, P, C]; P = 1 unless `positions` [B, P] is given."""
        batch = input_ids.shape[0]
        n_pos = 1 if positions is None else positions.shape[1]
        if candidates is None:
            candidates = torch.arange(len(self.tokenizer))
        if candidates.dim() == 1:
            candidates = candidates.expand(batch, -1)
        scores = torch.zeros(batch, loops, n_pos, candidates.shape[1])
        for b, text in enumerate(self._texts(input_ids, attention_mask)):
            parsed, texts = self.parse(text), self._candidate_texts(candidates[b])
            for t in range(1, loops + 1):
                answer = self.symbol_at(parsed, t)
                scores[b, t - 1, :, :] = torch.tensor([float(c == answer) for c in texts])
        return Readout(scores)


class PerfectExecutor(ReadoutExecutor):
    """Puts x_t on top at loop t, and keeps applying f past the depth (f^t(x0))."""

    def __init__(self, tokenizer):
        super().__init__(tokenizer, lambda chase, t: chase.iterate(t))


class ParkingExecutor(ReadoutExecutor):
    """Puts x_t on top at loop t <= d and holds the answer x_d past it."""

    def __init__(self, tokenizer):
        super().__init__(tokenizer, lambda chase, t: chase.iterate(min(t, chase.depth)))


class ShuffledExecutor:
    """Wraps a model and permutes its candidate scores at random per row and loop (a chance-level null)."""

    def __init__(self, inner, seed: int = 0):
        self.inner = inner
        self.generator = torch.Generator().manual_seed(seed)

    def read(self, input_ids, attention_mask=None, loops=1, positions=None, candidates=None,
             return_states=False) -> Readout:
        """Returns the inner readout with each [C] score vector randomly permuted."""
        scores = self.inner.read(input_ids, attention_mask, loops, positions, candidates).scores
        perm = torch.rand(scores.shape, generator=self.generator).argsort(dim=-1)
        return Readout(scores.gather(-1, perm))
