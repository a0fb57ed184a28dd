"""Stand-in models with the LoopedLM `read` signature, for calibrating the reader and the probes.

`AnswerExecutor` does the same for multi-token answers (state tracking, arithmetic): it solves
the prompt text itself and puts the answer's next token on top at every read position, so
`read_answers` must score it at exactly 100%, and a wrong solver at 0%.

Each decodes every row's `input_ids` back to text, recovers the task from the prompt, and
puts one symbol on top at each loop: the perfect executor the chain x_t (and f^t(x0) past
the depth), the parking executor x_min(t, d). A reader that does not score the perfect
executor at exactly 100% is broken.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from typing import Callable

import torch

from workbench.errors import WorkbenchError
from workbench.models.looped import CAPABILITIES
from workbench.tasks.chase import ChaseInstance, parse_prompt


class StandIn:
    """The `workbench.models.looped.LoopedModel` attributes a stand-in model declares: no pass count of its own,
    no capability beyond reading, the identity logit transform. `max_loops` and `halting` are each class's own."""

    native_loops = None
    halt_rule = "threshold"
    precision = "fp32"
    supports: frozenset[str] = frozenset()
    unsupported = {c: "a stand-in model only reads" for c in CAPABILITIES}

    @property
    def final_norm(self):
        return self.base.model.norm

    def logit_transform(self, logits: torch.Tensor) -> torch.Tensor:
        return logits

    def all_cycles_with_grad(self):
        return contextlib.nullcontext(self)


@dataclass
class Readout:
    """What `read` returns: `scores` [B, T, P, C] (loops 1..T along dim 1), `states` unused here."""

    scores: torch.Tensor
    states: torch.Tensor | None = None


def parse_chase(text: str) -> ChaseInstance:
    """Returns the chase instance of a prompt of any surface."""
    return parse_prompt(text)[1]


class ReadoutExecutor(StandIn):
    """A fake model whose loop-t readout puts `symbol_at(parse(prompt_text), t)` on top (1, others 0).

    Args:
        tokenizer: decodes rows and candidate ids.
        symbol_at: (parsed row, loop t) -> the answer at loop t, without its leading space.
        parse: prompt text -> parsed row, once per row (default: the chase parser).
    """

    max_loops, halting = 64, None

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


class ShuffledExecutor(StandIn):
    """Wraps a model and permutes its candidate scores at random per row and loop (a chance-level null)."""

    max_loops, halting = 64, None

    def __init__(self, inner, seed: int = 0):
        self.inner = inner
        self.generator = torch.Generator().manual_seed(seed)

    def read(self, input_ids, attention_mask=None, loops=1, positions=None, candidates=None,
             return_states=False) -> Readout:
        """Returns the inner readout with each [C] score vector randomly permuted."""
        scores = self.inner.read(input_ids, attention_mask, loops, positions, candidates).scores
        perm = torch.rand(scores.shape, generator=self.generator).argsort(dim=-1)
        return Readout(scores.gather(-1, perm))


def solve_state(text: str) -> str:
    """The register values after every rule of a state-tracking prompt, "v1 v2 .. v6"."""
    start = re.search(r"Start: (.*)\.\n", text)
    if start is None:
        raise WorkbenchError(f"text is not a state-tracking prompt: {text[:60]!r}")
    state = {k: int(v) for k, v in (item.split("=") for item in start[1].split(", "))}
    for line in text.split("\n"):
        if m := re.fullmatch(r"set (\w+) to (\d)", line):
            state[m[1]] = int(m[2])
        elif m := re.fullmatch(r"swap (\w+) and (\w+)", line):
            state[m[1]], state[m[2]] = state[m[2]], state[m[1]]
        elif m := re.fullmatch(r"increment (\w+) by 1 modulo 4", line):
            state[m[1]] = (state[m[1]] + 1) % 4
        elif m := re.fullmatch(r"if (\w+) is (\d), set (\w+) to (\d)", line):
            state[m[3]] = int(m[4]) if state[m[1]] == int(m[2]) else state[m[3]]
        elif m := re.fullmatch(r"copy (\w+) into (\w+)", line):
            state[m[2]] = state[m[1]]
    return " ".join(str(v) for v in state.values())


def solve_arith(text: str) -> str:
    """The result of an arithmetic prompt's operations, as decimal text."""
    start = re.search(r"Start with (-?\d+)\.", text)
    if start is None:
        raise WorkbenchError(f"text is not an arithmetic prompt: {text[:60]!r}")
    value = int(start[1])
    for line in text.split("\n"):
        if m := re.fullmatch(r"(add|subtract|multiply by) (\d+)", line):
            n = int(m[2])
            value = value + n if m[1] == "add" else value - n if m[1] == "subtract" else value * n
    return str(value)


def solve_prompt(text: str) -> str:
    """The answer of a state-tracking or arithmetic prompt, recovered from its text alone."""
    return solve_state(text) if text.startswith("Registers hold") else solve_arith(text)


class AnswerExecutor(StandIn):
    """A fake model for multi-token answers: at each read position it puts the answer's next token on top.

    The answer comes from `solve(prompt text)` (default `solve_prompt`), never from the tokens after
    the prompt, so the reader's teacher forcing cannot leak it. Scores are [B, T, P, vocab].
    """

    max_loops, halting = 64, None

    def __init__(self, tokenizer, solve: Callable[[str], str] = solve_prompt, cue: str = "Answer:"):
        self.tokenizer, self.solve, self.cue = tokenizer, solve, cue

    def read(self, input_ids, attention_mask=None, loops=1, positions=None, candidates=None,
             return_states=False) -> Readout:
        """Returns a `Readout` with scores [B, T, P, vocab] (1 on the answer's next token, 0 elsewhere)."""
        from workbench.tasks.reader import ANSWER_END, ANSWER_PREFIX

        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if positions is None:
            positions = (attention_mask.shape[1] - 1) * torch.ones(input_ids.shape[0], 1, dtype=torch.long)
        scores = torch.zeros(input_ids.shape[0], loops, positions.shape[1], len(self.tokenizer))
        for b, (ids, mask) in enumerate(zip(input_ids, attention_mask)):
            text = self.tokenizer.decode(ids[mask.bool()])
            prompt = text[: text.rindex(self.cue) + len(self.cue)]
            target = self.tokenizer.encode(ANSWER_PREFIX + self.solve(prompt) + ANSWER_END, add_special_tokens=False)
            first = int((~mask.bool()).sum()) + len(self.tokenizer(prompt)["input_ids"]) - 1
            for j, p in enumerate(positions[b].tolist()):
                if 0 <= p - first < len(target):
                    scores[b, :, j, target[p - first]] = 1.0
        return Readout(scores)
