"""Function-table chase (retrofit paper Sec. 4.1) and its verbal relay / pointer surfaces.

An instance of depth d over N symbols is a distinct orbit x0..xd with f(x_i) = x_{i+1};
every other symbol maps to a uniformly random symbol (f is many-to-one), or, in the
permutation control, the remaining symbols are matched to the remaining values at
random (f is a bijection). The instance is drawn from the row's hashed RNG
(`workbench.tasks.seeding`) independently of the surface, so the symbolic, relay and
pointer rows of one (N, depth, index, seed) with name symbols share table, chain and
answer; letters and names rows of one key are the same instance under renaming.

The prompt ends with `Answer:`; the answer is read as the single token " " + x_d.
"""

from __future__ import annotations

import random
import re
import string
from dataclasses import dataclass
from typing import Iterable

from workbench.defaults import CHASE_SURFACES, SYMBOL_SET_NAMES
from workbench.errors import WorkbenchError
from workbench.tasks.reader import candidate_ids
from workbench.tasks.seeding import SPLITS, row_rng

TEMPLATE_VERSION = "chase-v1"
ANSWER_CUE = "Answer:"
LETTERS = tuple(string.ascii_uppercase)
# Each is one SmolLM2 token with a leading space (pinned by a test); the first four are the paper's.
NAMES = (
    "Ben", "Max", "Eve", "Kai", "Sam", "Tom", "Ann", "Joe", "Amy", "Dan", "Tim", "Leo", "Mia",
    "Ian", "Kim", "Roy", "Jim", "Bob", "Ted", "Ada", "Ivy", "Jon", "Meg", "Ron", "Ken", "Lucy",
)
SYMBOL_SETS = dict(zip(SYMBOL_SET_NAMES, (LETTERS, NAMES)))
SURFACES = CHASE_SURFACES

# The one place the wording lives: a header line, one line per table entry, the question.
TEMPLATES = {
    "symbolic": {
        "header": "Function table:",
        "line": "{k} -> {v}",
        "question": "Start at {start} and apply the table {count} {unit}.",
        "unit": ("time", "times"),
    },
    "relay": {
        "header": "Each day, whoever has the key passes it on.",
        "line": "{k} always passes the key to {v}.",
        "question": "On day 0, {start} has the key. After {count} {unit}, who has the key?",
        "unit": ("day", "days"),
    },
    "pointer": {
        "header": "Every person has a note that points to one person.",
        "line": "{k}'s note points to {v}.",
        "question": "Start at {start} and follow the notes {count} {unit}. Where do you end up?",
        "unit": ("time", "times"),
    },
}


@dataclass(frozen=True)
class ChaseInstance:
    """A function table f, a start x0, a depth d, and the order the table is printed in."""

    table: dict[str, str]
    start: str
    depth: int
    order: tuple[str, ...]

    def iterate(self, t: int) -> str:
        """Returns f^t(x0); past the depth the chain simply continues."""
        x = self.start
        for _ in range(t):
            x = self.table[x]
        return x

    @property
    def chain(self) -> list[str]:
        """x_1..x_d."""
        return [self.iterate(t) for t in range(1, self.depth + 1)]


def draw_instance(rng: random.Random, symbols: list[str], depth: int, permutation: bool = False) -> ChaseInstance:
    """Returns a random instance of `depth` over `symbols` (1 <= depth < len(symbols))."""
    orbit = rng.sample(symbols, depth + 1)
    table = dict(zip(orbit, orbit[1:]))
    rest = [s for s in symbols if s not in table]  # includes x_d
    if permutation:
        free = [s for s in symbols if s not in orbit[1:]]  # unused values, includes x0
        rng.shuffle(free)
        table.update(zip(rest, free))
    else:
        table.update((s, rng.choice(symbols)) for s in rest)
    order = list(symbols)
    rng.shuffle(order)
    return ChaseInstance({s: table[s] for s in symbols}, orbit[0], depth, tuple(order))


def render(instance: ChaseInstance, surface: str = "symbolic") -> str:
    """Returns the prompt text: header, table in `instance.order`, question, `Answer:`."""
    tpl = TEMPLATES[surface]
    unit = tpl["unit"][0] if instance.depth == 1 else tpl["unit"][1]
    lines = [tpl["line"].format(k=k, v=instance.table[k]) for k in instance.order]
    question = tpl["question"].format(start=instance.start, count=instance.depth, unit=unit)
    return "\n".join([tpl["header"], *lines, question, ANSWER_CUE])


def _pattern(fmt: str) -> re.Pattern:
    # "{k} -> {v}" -> ^(?P<k>\w+) \-> (?P<v>\w+)$ ; literal parts escaped.
    parts = re.split(r"\{(\w+)\}", fmt)
    body = "".join(re.escape(p) if i % 2 == 0 else rf"(?P<{p}>\w+)" for i, p in enumerate(parts))
    return re.compile(rf"^{body}$", re.MULTILINE)


_PATTERNS = {s: (_pattern(t["line"]), _pattern(t["question"])) for s, t in TEMPLATES.items()}


def parse_prompt(text: str) -> tuple[str, ChaseInstance]:
    """Returns `(surface, instance)` recovered from a rendered prompt (the inverse of `render`).

    Raises:
        WorkbenchError: the text is not a chase prompt of any surface.
    """
    for surface, (line_re, question_re) in _PATTERNS.items():
        if TEMPLATES[surface]["header"] not in text:
            continue
        pairs = [(m["k"], m["v"]) for m in line_re.finditer(text)]
        question = question_re.search(text)
        if pairs and question:
            table = dict(pairs)
            return surface, ChaseInstance(table, question["start"], int(question["count"]), tuple(table))
    raise WorkbenchError(f"text is not a chase prompt of any surface ({', '.join(SURFACES)}): {text[:60]!r}")


def chase_symbols(alphabet: int, symbol_set: str, tokenizer) -> list[str]:
    """Returns the first `alphabet` symbols of a set, each checked to be one token of `tokenizer`."""
    if symbol_set not in SYMBOL_SETS:
        raise WorkbenchError(f"symbol set '{symbol_set}' is unknown; accepted: {', '.join(SYMBOL_SETS)}")
    pool = SYMBOL_SETS[symbol_set]
    if not 2 <= alphabet <= len(pool):
        raise WorkbenchError(f"alphabet {alphabet} is out of range for {symbol_set}; accepted: 2..{len(pool)}")
    symbols = list(pool[:alphabet])
    candidate_ids(tokenizer, symbols)  # the reader's own single-token check
    return symbols


def chase_row(
    alphabet: int,
    depth: int,
    index: int,
    seed: int,
    *,
    tokenizer,
    surface: str = "symbolic",
    symbol_set: str | None = None,
    permutation: bool = False,
    split: str = "test",
) -> dict:
    """Returns one chase row (see `workbench.tasks` for the schema).

    Args:
        alphabet: N, the number of symbols.
        depth: d, 1 <= d < N.
        index: the row's index within its depth (part of its seed material).
        seed: the base seed.
        tokenizer: every symbol is checked to be one token of it (with its leading space).
        surface: "symbolic", "relay" or "pointer".
        symbol_set: "letters" or "names"; default letters for symbolic, names for verbal surfaces.
        permutation: the bijective control.
        split: "train" or "test" (part of the seed material).
    """
    symbol_set = symbol_set or ("letters" if surface == "symbolic" else "names")
    _check_options(alphabet, depth, surface, symbol_set, split)
    symbols = chase_symbols(alphabet, symbol_set, tokenizer)
    key = "chase-permutation" if permutation else "chase"
    instance = draw_instance(row_rng(key, split, alphabet, depth, index, seed), symbols, depth, permutation)
    chain = instance.chain
    return {
        "row_id": f"{key}-{symbol_set}{alphabet}-{surface}-{split}-s{seed}-d{depth:02d}-{index:04d}",
        "task": "chase",
        "template_version": TEMPLATE_VERSION,
        "split": split,
        "seed": seed,
        "index": index,
        "alphabet": alphabet,
        "symbol_set": symbol_set,
        "surface": surface,
        "permutation": permutation,
        "depth": depth,
        "prompt": render(instance, surface),
        "start": instance.start,
        "chain": chain,
        "answer": chain[-1],
        "symbols": symbols,
        "table": instance.table,
    }


def chase_rows(alphabet: int, depths: Iterable[int], per_depth: int, seed: int, first_index: int = 0,
               **options) -> list[dict]:
    """Returns `per_depth` rows at each depth (indices from `first_index`), depth-major; `options` as `chase_row`'s."""
    depths = list(depths)
    if not depths or per_depth < 1:
        raise WorkbenchError(f"need at least one depth and per_depth >= 1; got depths {depths}, per_depth {per_depth}")
    indices = range(first_index, first_index + per_depth)
    return [chase_row(alphabet, d, i, seed, **options) for d in depths for i in indices]


def _check_options(alphabet: int, depth: int, surface: str, symbol_set: str, split: str) -> None:
    if surface not in SURFACES:
        raise WorkbenchError(f"surface '{surface}' is unknown; accepted: {', '.join(SURFACES)}")
    if surface != "symbolic" and symbol_set != "names":
        raise WorkbenchError(f"the {surface} surface needs name symbols, not '{symbol_set}'")
    if split not in SPLITS:
        raise WorkbenchError(f"split '{split}' is unknown; accepted: {', '.join(SPLITS)}")
    if not 1 <= depth < alphabet:
        raise WorkbenchError(f"depth {depth} is out of range for alphabet {alphabet}; accepted: 1..{alphabet - 1}")
