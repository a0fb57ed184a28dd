"""RecurTrace's three procedural generators (RecurTrace App. A): p-hop, state tracking, arithmetic.

Plus `state_query`, the workbench's one-register form of state tracking (the same rules; the question asks
one register, so the answer is one token and every loop has a chain target, as in the chase).

The two symbol tasks draw from a fixed pool of 128 two-letter uppercase codes: `TRAIN_CODES`
(96) for split "train", `TEST_CODES` (32) for split "test", so the splits share no symbol.
The pool is a seeded random sample of the codes that are one SmolLM2 token with a leading
space (375 of 676), so p-hop answers can be read by the one reader; p-hop rows check their
codes against the tokenizer in use. Difficulty k (the row's `depth`) is the number of
sequential steps: 2..8 for training, buckets 2, 4, .., 16 for testing (App. A).
"""

from __future__ import annotations

import random
from typing import Iterable

from workbench.errors import WorkbenchError
from workbench.tasks.chase import ChaseInstance, render
from workbench.tasks.reader import candidate_ids
from workbench.tasks.seeding import SPLITS, row_rng

TEMPLATE_VERSION = "recurtrace-v1"
TRAIN_DEPTHS = tuple(range(2, 9))
TEST_DEPTHS = tuple(range(2, 17, 2))
POOL = (
    "WS", "DE", "UN", "DD", "CL", "IE", "FM", "DC", "IP", "IX", "EX", "IO", "ER", "RG", "EG", "RL",
    "PC", "GA", "BT", "HI", "BA", "FL", "ME", "RP", "UK", "II", "WA", "LC", "RF", "JJ", "SL", "SO",
    "BB", "JH", "RV", "PH", "AS", "JS", "VS", "MN", "SN", "SC", "UX", "DB", "WE", "RD", "JL", "TL",
    "TV", "NZ", "LA", "NI", "CP", "UI", "FO", "OP", "DO", "VM", "DN", "QR", "EM", "HA", "NO", "HV",
    "OH", "BY", "SK", "CC", "AI", "MV", "DM", "EF", "SS", "TI", "CD", "SY", "MM", "GO", "DH", "US",
    "YO", "OF", "GL", "CW", "MD", "BS", "PP", "VO", "AK", "FE", "UV", "LM", "OS", "RB", "RI", "MU",
    "IA", "PT", "KM", "TR", "HD", "AM", "TW", "MY", "IM", "CG", "XP", "SM", "FR", "AV", "TB", "RE",
    "TT", "TH", "PO", "TE", "AT", "RT", "GP", "NM", "ES", "NR", "JF", "DW", "TX", "CE", "AR", "MI",
)
TRAIN_CODES, TEST_CODES = POOL[:96], POOL[96:]
REGISTERS = 6
QUERY_REGISTERS = 4  # state_query rows: shorter prompts, the same rules
VALUES = 4  # register values 0..3
RULES = ("assign", "swap", "increment", "conditional", "copy")
OPERATIONS = ("+", "-", "*")


def codes(split: str) -> tuple[str, ...]:
    """Returns the codes of a split ("train": 96, "test": 32)."""
    _check(split, 1)
    return TRAIN_CODES if split == "train" else TEST_CODES


def phop_row(depth: int, index: int, seed: int, *, tokenizer, split: str = "test", alphabet: int = 32) -> dict:
    """Returns a p-hop row: follow a random permutation of `alphabet` codes `depth` times.

    The permutation is uniform, as in the paper, so a chain may revisit a code (a short cycle).
    """
    _check(split, depth)
    pool = list(codes(split))
    if not 2 <= alphabet <= len(pool):
        raise WorkbenchError(f"p-hop alphabet {alphabet} is out of range for split {split}; accepted: 2..{len(pool)}")
    candidate_ids(tokenizer, pool)  # every code one token, or an error naming it
    rng = row_rng("phop", split, alphabet, depth, index, seed)
    symbols = sorted(rng.sample(pool, alphabet))
    values = rng.sample(symbols, alphabet)
    order = rng.sample(symbols, alphabet)
    instance = ChaseInstance(dict(zip(symbols, values)), rng.choice(symbols), depth, tuple(order))
    chain = instance.chain
    return _row("phop", split, seed, index, alphabet, depth, render(instance, "symbolic"),
                instance.start, chain, symbols, table=instance.table)


def state_row(depth: int, index: int, seed: int, *, split: str = "test") -> dict:
    """Returns a state-tracking row: 6 code-named registers (0-3) after `depth` random rules."""
    _check(split, depth)
    rng = row_rng("state", split, REGISTERS, depth, index, seed)
    names = rng.sample(codes(split), REGISTERS)
    state = [rng.randrange(VALUES) for _ in names]
    start, steps, chain = _vector(state), [], []
    for _ in range(depth):
        steps.append(_apply_rule(rng, names, state))
        chain.append(_vector(state))
    prompt = _state_prompt(names, start, steps, f"What are {', '.join(names)} after all {depth} rules?\nAnswer:")
    return _row("state", split, seed, index, REGISTERS, depth, prompt, start, chain,
                [str(v) for v in range(VALUES)], registers=names, steps=steps)


def state_query_row(depth: int, index: int, seed: int, *, split: str = "test") -> dict:
    """Returns a state-tracking row that asks one register: a one-token answer, so loops read as the chase does.

    RecurTrace's rules over `QUERY_REGISTERS` code-named registers (0-3); the question names one register q
    and `chain` holds q's value after each rule, so every loop has a target (the chain stage) as in the
    chase. Each rule writes q with probability 1/2 (assign, increment, swap, a conditional or a copy into
    q), so q's value after rule t depends on the other registers' values, which earlier rules set: the
    answer carries the whole state, not one pointer. Digits with a leading space are two SmolLM2 tokens,
    so the prompt ends with "Answer: " and the candidates are the bare digits (`answer_prefix` "").
    """
    _check(split, depth)
    rng = row_rng("state_query", split, QUERY_REGISTERS, depth, index, seed)
    names = rng.sample(codes(split), QUERY_REGISTERS)
    q = rng.randrange(QUERY_REGISTERS)
    state = [rng.randrange(VALUES) for _ in names]
    start, steps, chain = _vector(state), [], []
    for _ in range(depth):
        steps.append(_apply_rule(rng, names, state, writes=q if rng.random() < 0.5 else None))
        chain.append(str(state[q]))
    prompt = _state_prompt(names, start, steps, f"What is {names[q]} after all {depth} rules?\nAnswer: ")
    return _row("state_query", split, seed, index, QUERY_REGISTERS, depth, prompt, start, chain,
                [str(v) for v in range(VALUES)], registers=names, query=names[q], steps=steps, answer_prefix="")


def arithmetic_row(depth: int, index: int, seed: int, *, split: str = "test") -> dict:
    """Returns an arithmetic row: a start in [1, 99] and `depth` operations +n, −n, ×n (n in 2..9)."""
    _check(split, depth)
    rng = row_rng("arith", split, 0, depth, index, seed)
    value = rng.randint(1, 99)
    start, steps, chain = str(value), [], []
    for _ in range(depth):
        op, n = rng.choice(OPERATIONS), rng.randint(2, 9)
        value = value + n if op == "+" else value - n if op == "-" else value * n
        steps.append({"+": f"add {n}", "-": f"subtract {n}", "*": f"multiply by {n}"}[op])
        chain.append(str(value))
    prompt = "\n".join([f"Start with {start}.", *steps, f"What is the result after all {depth} operations?", "Answer:"])
    # An open-ended integer answer: no closed symbol set, so the symbol reader does not apply.
    return _row("arith", split, seed, index, 0, depth, prompt, start, chain, [], steps=steps)


def recurtrace_rows(task: str, depths: Iterable[int], per_depth: int, seed: int, first_index: int = 0,
                    **options) -> list[dict]:
    """Returns `per_depth` rows at each depth (indices from `first_index`) for "phop", "state", "state_query", "arith"."""
    makers = {"phop": phop_row, "state": state_row, "state_query": state_query_row, "arith": arithmetic_row}
    if task not in makers:
        raise WorkbenchError(f"RecurTrace task '{task}' is unknown; accepted: {', '.join(makers)}")
    depths = list(depths)
    if not depths or per_depth < 1:
        raise WorkbenchError(f"need at least one depth and per_depth >= 1; got depths {depths}, per_depth {per_depth}")
    indices = range(first_index, first_index + per_depth)
    return [makers[task](d, i, seed, **options) for d in depths for i in indices]


def _apply_rule(rng: random.Random, names: list[str], state: list[int], writes: int | None = None) -> str:
    """Applies one random rule to `state` in place; returns its text. `writes`: a register the rule must write."""
    i, j = rng.sample(range(len(names)), 2)
    rule = rng.choice(RULES)
    if writes is not None:  # assign and increment write i; a conditional and a copy write j; a swap both
        if rule in ("assign", "increment", "swap"):
            i, j = writes, (j if j != writes else i)
        else:
            i, j = (i if i != writes else j), writes
    if rule == "assign":
        v = rng.randrange(VALUES)
        state[i] = v
        return f"set {names[i]} to {v}"
    if rule == "swap":
        state[i], state[j] = state[j], state[i]
        return f"swap {names[i]} and {names[j]}"
    if rule == "increment":
        state[i] = (state[i] + 1) % VALUES
        return f"increment {names[i]} by 1 modulo 4"
    if rule == "conditional":
        v, w = rng.randrange(VALUES), rng.randrange(VALUES)
        if state[i] == v:
            state[j] = w
        return f"if {names[i]} is {v}, set {names[j]} to {w}"
    state[j] = state[i]
    return f"copy {names[i]} into {names[j]}"


def _state_prompt(names: list[str], start: str, steps: list[str], question: str) -> str:
    """The state-tracking prompt: the registers' start values, the rules in order, then the question."""
    listed = ", ".join(f"{n}={v}" for n, v in zip(names, start.split()))
    return "\n".join([f"Registers hold values 0 to 3. Start: {listed}.", "Apply these rules in order:", *steps,
                      question])


def _vector(state: list[int]) -> str:
    return " ".join(str(v) for v in state)


def _row(task, split, seed, index, alphabet, depth, prompt, start, chain, symbols, **extra) -> dict:
    return {
        "row_id": f"{task}-{split}-n{alphabet}-s{seed}-d{depth:02d}-{index:04d}",
        "task": task,
        "template_version": TEMPLATE_VERSION,
        "split": split,
        "seed": seed,
        "index": index,
        "alphabet": alphabet,
        "depth": depth,
        "prompt": prompt,
        "start": start,
        "chain": chain,
        "answer": chain[-1],
        "symbols": symbols,
        **extra,
    }


def _check(split: str, depth: int) -> None:
    if split not in SPLITS:
        raise WorkbenchError(f"split '{split}' is unknown; accepted: {', '.join(SPLITS)}")
    if depth < 1:
        raise WorkbenchError(f"depth {depth} is out of range; accepted: >= 1")
