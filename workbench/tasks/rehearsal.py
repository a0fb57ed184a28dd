"""Rehearsal text for preservation: where the trainer holds loop 1 to the frozen base (KL at loop 1).

Installing the chase taught the shipped keeper to *copy* a symbol from its context at the
read position: on the guardrail's few-shot arithmetic it answered an operand (5 + 2 = 5,
1 + 4 = 4) where the base computed the sum. Generic prose barely exercises that position
type (a hand probe: KL on prose was already 0.004 and recovered 39 of the 49 rows). So the
rehearsal set has two sources, both read by the *base* model as teacher:

- `corpus`: the lines of `workbench/data/corpus.txt` (prose, instructions, code comments),
  read at positions spread along each line;
- `patterns`: few-shot line patterns in which the answer after the separator is *recalled or
  transformed*, not copied (antonyms, plurals, past tenses, capitals, upper case, opposites of
  directions, colours of things, next letters), read at the position just before each answer;
- `numbers`: the same few-shot shape with digits as answers in other templates than the
  guardrail's (successor "4 -> 5", predecessor, number word <-> digit). The first run with
  prose and word patterns alone (KL weight 5) still lost 3 of 47 rows by step 100: the
  position that breaks is "predict a digit after few-shot lines", so the rehearsal reads it.

Held out from the guardrail by construction: no text here contains '=' or a '+' / '-' between
spaces (the guardrail's template is `a + b = ` / `a - b = `), and no text is a guardrail row; a
test checks every text the generator can produce.
"""

from __future__ import annotations

import functools
import random
from pathlib import Path

import torch

from workbench.defaults import REHEARSAL_SOURCES
from workbench.errors import WorkbenchError
from workbench.tasks.seeding import row_seed

CORPUS = Path(__file__).resolve().parent.parent / "data" / "corpus.txt"
SOURCES = REHEARSAL_SOURCES

# (family, separator, pairs): the base recalls or transforms the left side into the right side.
FAMILIES: list[tuple[str, list[tuple[str, str]]]] = [
    ("antonym", [("hot", "cold"), ("big", "small"), ("up", "down"), ("fast", "slow"), ("light", "dark"),
                 ("happy", "sad"), ("open", "closed"), ("early", "late"), ("rich", "poor"), ("strong", "weak"),
                 ("full", "empty"), ("hard", "soft"), ("wet", "dry"), ("young", "old"), ("long", "short"),
                 ("high", "low"), ("near", "far"), ("clean", "dirty"), ("loud", "quiet"), ("thick", "thin")]),
    ("plural", [("cat", "cats"), ("box", "boxes"), ("child", "children"), ("mouse", "mice"), ("city", "cities"),
                ("tooth", "teeth"), ("leaf", "leaves"), ("dog", "dogs"), ("woman", "women"), ("bus", "buses"),
                ("foot", "feet"), ("story", "stories"), ("knife", "knives"), ("goose", "geese"), ("tree", "trees")]),
    ("past", [("walk", "walked"), ("run", "ran"), ("eat", "ate"), ("see", "saw"), ("go", "went"),
              ("write", "wrote"), ("take", "took"), ("sing", "sang"), ("jump", "jumped"), ("think", "thought"),
              ("buy", "bought"), ("swim", "swam"), ("bring", "brought"), ("fly", "flew"), ("drink", "drank")]),
    ("capital", [("France", "Paris"), ("Japan", "Tokyo"), ("Italy", "Rome"), ("Spain", "Madrid"),
                 ("Germany", "Berlin"), ("Egypt", "Cairo"), ("Canada", "Ottawa"), ("Russia", "Moscow"),
                 ("China", "Beijing"), ("Greece", "Athens"), ("Kenya", "Nairobi"), ("Peru", "Lima"),
                 ("Norway", "Oslo"), ("Ireland", "Dublin"), ("Poland", "Warsaw")]),
    ("upper", [("dog", "DOG"), ("tree", "TREE"), ("sun", "SUN"), ("book", "BOOK"), ("fish", "FISH"),
               ("rain", "RAIN"), ("lamp", "LAMP"), ("road", "ROAD"), ("milk", "MILK"), ("star", "STAR"),
               ("wind", "WIND"), ("gold", "GOLD"), ("bird", "BIRD"), ("ship", "SHIP"), ("cake", "CAKE")]),
    ("colour", [("grass", "green"), ("sky", "blue"), ("snow", "white"), ("coal", "black"), ("banana", "yellow"),
                ("blood", "red"), ("orange", "orange"), ("cloud", "white"), ("tomato", "red"), ("lemon", "yellow"),
                ("night", "black"), ("ocean", "blue"), ("leaf", "green"), ("cherry", "red"), ("milk", "white")]),
    ("direction", [("north", "south"), ("east", "west"), ("left", "right"), ("above", "below"), ("inside", "outside"),
                   ("front", "back"), ("top", "bottom"), ("in", "out"), ("over", "under"), ("south", "north"),
                   ("west", "east"), ("right", "left"), ("below", "above"), ("back", "front"), ("under", "over")]),
    ("next_letter", [(a, b) for a, b in zip("abcdefghijklmnopqrstuvwxy", "bcdefghijklmnopqrstuvwxyz")]),
]
SEPARATORS = (" ->", ":", " is", " becomes")
_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
# Digits in other templates than the guardrail's: successor, predecessor, number words. The answer is a
# digit the base recalls at the read position (the position type the chase damaged), never "a op b = ".
NUMBER_FAMILIES: list[tuple[str, list[tuple[str, str]]]] = [
    ("successor", [(str(i), str(i + 1)) for i in range(9)]),
    ("predecessor", [(str(i), str(i - 1)) for i in range(1, 10)]),
    ("word_to_digit", [(w, str(i)) for i, w in enumerate(_WORDS)]),
    ("digit_to_word", [(str(i), w) for i, w in enumerate(_WORDS)]),
]


@functools.lru_cache(maxsize=1)
def corpus_lines() -> tuple[str, ...]:
    """The lines of the bundled corpus (prose, instructions, code comments), less any that fail
    `check_held_out` (one recipe line names an oven temperature in digits)."""
    def held_out(line: str) -> bool:
        try:
            check_held_out(line)
        except WorkbenchError:
            return False
        return True

    return tuple(line for line in CORPUS.read_text().splitlines() if line.strip() and held_out(line))


def pattern_text(index: int, seed: int, lines: int = 8, families=None) -> str:
    """Returns one few-shot pattern text: `lines` lines "left<sep> right" of one family, one separator."""
    families = FAMILIES if families is None else families
    rng = random.Random(row_seed("rehearsal-pattern", "train", 0, 0, index, seed))
    _, pairs = families[rng.randrange(len(families))]
    sep = SEPARATORS[rng.randrange(len(SEPARATORS))]
    chosen = rng.sample(pairs, min(lines, len(pairs)))
    return "\n".join(f"{a}{sep} {b}" for a, b in chosen)


def check_held_out(text: str) -> None:
    """Raises if a rehearsal text could touch the guardrail's template `a + b = ` / `a - b = `: an '=', or a
    '+' or '-' between two spaces (digits alone are allowed: the `numbers` source recalls them elsewhere)."""
    if " + " in text or " - " in text or "=" in text:
        raise WorkbenchError(f"rehearsal text {text[:40]!r} touches the guardrail's template (a + b = , a - b = )")


def rehearsal_texts(step: int, seed: int, n: int, sources: list[str] | tuple[str, ...] = SOURCES) -> list[str]:
    """Returns the n rehearsal texts of a training step (hashed by step and seed), sources alternating."""
    bad = [s for s in sources if s not in SOURCES]
    if bad or not sources:
        raise WorkbenchError(f"rehearsal source '{(bad or [''])[0]}' is not accepted; accepted: {', '.join(SOURCES)}")
    lines = corpus_lines()
    out = []
    for i in range(n):
        source = sources[i % len(sources)]
        rng = random.Random(row_seed("rehearsal", "train", 0, 0, step * n + i, seed))
        if source == "corpus":
            out.append(lines[rng.randrange(len(lines))])
        else:
            out.append(pattern_text(step * n + i, seed, families=FAMILIES if source == "patterns" else NUMBER_FAMILIES))
    return out


def _answer_positions(text: str, offsets: list[tuple[int, int]]) -> list[int]:
    """Token indices whose next token starts an answer in a pattern text (the token ending each separator)."""
    ends = []
    for line_start, line in _line_spans(text):
        for sep in SEPARATORS:
            k = line.find(sep + " ")
            if k >= 0:
                ends.append(line_start + k + len(sep))
                break
    positions = []
    for end in ends:
        hits = [j for j, (a, b) in enumerate(offsets) if a < end <= b]
        if hits:
            positions.append(hits[0])
    return positions


def _line_spans(text: str):
    start = 0
    for line in text.split("\n"):
        yield start, line
        start += len(line) + 1


def rehearsal_batch(tokenizer, texts: list[str], positions_per_row: int, seed: int = 0) -> dict:
    """Returns {input_ids, attention_mask [B, S] left padded; positions [B, P]} for KL at loop 1.

    Pattern texts are read just before each answer (the token that ends the separator); prose is
    read at P positions spread evenly over its real tokens. Rows with fewer candidate positions
    than P repeat their last one (counted once per occurrence: the KL weights them so).
    """
    enc = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left", return_offsets_mapping=True)
    ids, mask, offsets = enc["input_ids"], enc["attention_mask"], enc["offset_mapping"]
    S = ids.shape[1]
    rows = []
    for b, text in enumerate(texts):
        real = int(mask[b].sum())
        pad = S - real
        offs = [tuple(int(v) for v in o) for o in offsets[b, pad:]]
        picks = _answer_positions(text, offs) if any(sep + " " in text for sep in SEPARATORS) and "\n" in text else []
        if not picks:  # prose: evenly spread over positions 1..real-2 (every one predicts a real next token)
            hi = max(real - 2, 0)
            picks = sorted({round(k * hi / max(positions_per_row - 1, 1)) for k in range(positions_per_row)})
        picks = (picks * positions_per_row)[:positions_per_row] if len(picks) < positions_per_row else \
            picks[:positions_per_row]
        rows.append([pad + p for p in picks])
    return {"input_ids": ids, "attention_mask": mask, "positions": torch.tensor(rows, dtype=torch.long)}
