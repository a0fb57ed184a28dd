"""RecurTrace generators: code pool and split, p-hop, state tracking, arithmetic."""

import re
import string

import pytest

from workbench.errors import WorkbenchError
from workbench.tasks import build_rows
from workbench.tasks.reader import candidate_ids
from workbench.tasks.recurtrace import (
    POOL,
    TEST_CODES,
    TEST_DEPTHS,
    TRAIN_CODES,
    TRAIN_DEPTHS,
    arithmetic_row,
    phop_row,
    recurtrace_rows,
    state_query_row,
    state_row,
)


def test_pool_is_128_distinct_two_letter_codes_split_96_32():
    assert len(POOL) == len(set(POOL)) == 128
    assert all(len(c) == 2 and set(c) <= set(string.ascii_uppercase) for c in POOL)
    assert len(TRAIN_CODES) == 96 and len(TEST_CODES) == 32 and not set(TRAIN_CODES) & set(TEST_CODES)
    assert TRAIN_DEPTHS == (2, 3, 4, 5, 6, 7, 8) and TEST_DEPTHS == (2, 4, 6, 8, 10, 12, 14, 16)


def test_every_code_is_one_smollm2_token(tok):
    assert all(len(tok.encode(" " + c, add_special_tokens=False)) == 1 for c in POOL)


@pytest.mark.parametrize("split,pool", [("train", TRAIN_CODES), ("test", TEST_CODES)])
def test_phop_follows_a_permutation_of_the_split_codes(tok, split, pool):
    rows = recurtrace_rows("phop", TEST_DEPTHS, 32, 11, tokenizer=tok, split=split)
    for row in rows:
        table, k = row["table"], row["depth"]
        assert set(row["symbols"]) <= set(pool) and len(row["symbols"]) == 32
        assert sorted(table) == sorted(table.values()) == row["symbols"]
        x = row["start"]
        for t in range(k):
            x = table[x]
            assert row["chain"][t] == x
        assert row["answer"] == x and len(row["chain"]) == k
        assert row["prompt"].endswith("\nAnswer:") and f"{k} times" in row["prompt"]
    assert len({r["start"] for r in rows}) > 16


def test_phop_with_a_tokenizer_that_splits_codes_is_an_error(tok, monkeypatch):
    monkeypatch.setattr("workbench.tasks.recurtrace.TEST_CODES", ("ZQ",) * 32)
    with pytest.raises(WorkbenchError, match="'ZQ'"):
        phop_row(2, 0, 1, tokenizer=tok)


def replay_state(row):
    """Re-executes the rule texts independently of the generator."""
    names = row["registers"]
    state = dict(zip(names, map(int, row["start"].split())))
    out = []
    for step in row["steps"]:
        if m := re.fullmatch(r"set (\w+) to (\d)", step):
            state[m[1]] = int(m[2])
        elif m := re.fullmatch(r"swap (\w+) and (\w+)", step):
            state[m[1]], state[m[2]] = state[m[2]], state[m[1]]
        elif m := re.fullmatch(r"increment (\w+) by 1 modulo 4", step):
            state[m[1]] = (state[m[1]] + 1) % 4
        elif m := re.fullmatch(r"if (\w+) is (\d), set (\w+) to (\d)", step):
            if state[m[1]] == int(m[2]):
                state[m[3]] = int(m[4])
        elif m := re.fullmatch(r"copy (\w+) into (\w+)", step):
            state[m[2]] = state[m[1]]
        else:
            raise AssertionError(step)
        out.append(" ".join(str(state[n]) for n in names))
    return out


def test_state_tracking_chain_replays_from_the_prompt_rules():
    rows = recurtrace_rows("state", TEST_DEPTHS, 64, 5, split="test")
    kinds = set()
    for row in rows:
        assert len(row["registers"]) == 6 and set(row["registers"]) <= set(TEST_CODES)
        assert replay_state(row) == row["chain"] and row["answer"] == row["chain"][-1]
        assert all(step in row["prompt"] for step in row["steps"]) and len(row["steps"]) == row["depth"]
        kinds |= {s.split()[0] for s in row["steps"]}
    assert kinds == {"set", "swap", "increment", "if", "copy"}
    assert set(recurtrace_rows("state", [2], 8, 5, split="train")[0]["registers"]) <= set(TRAIN_CODES)


def q_written(step: str, q: str) -> bool:
    """Whether a rule's text writes register q (the conditional's and the copy's target is their last code)."""
    return bool(re.fullmatch(rf"(set|increment) {q} .*|swap .*\b{q}\b.*|(if|copy) .* {q}( to \d)?", step))


def test_state_query_asks_one_register_and_chains_its_value_after_each_rule(tok):
    rows = recurtrace_rows("state_query", range(1, 9), 64, 5, split="test")
    writes = 0
    for row in rows:
        names, q = row["registers"], row["registers"].index(row["query"])
        assert len(names) == 4 and set(names) <= set(TEST_CODES) and row["symbols"] == ["0", "1", "2", "3"]
        full = replay_state(row)   # the whole register vector after each rule, replayed from the prompt's text
        assert row["chain"] == [v.split()[q] for v in full] and row["answer"] == row["chain"][-1]
        assert row["prompt"].endswith(f"What is {row['query']} after all {row['depth']} rules?\nAnswer: ")
        # one token: the prompt's trailing space is a token and the bare digit follows it (answer_prefix "")
        ids = tok.encode(row["prompt"] + row["answer"], add_special_tokens=False)
        assert ids[:-1] == tok.encode(row["prompt"], add_special_tokens=False) and row["answer_prefix"] == ""
        assert candidate_ids(tok, row["symbols"], row["answer_prefix"])[int(row["answer"])] == ids[-1]
        writes += sum(q_written(step, row["query"]) for step in row["steps"])
    steps = sum(r["depth"] for r in rows)
    assert 0.45 < writes / steps < 0.65, writes / steps  # half the rules are made to write q, a few more by chance
    # the rules move the asked register: some rows' answer differs from its start value
    assert any(row["answer"] != row["start"].split()[row["registers"].index(row["query"])] for row in rows)
    assert set(state_query_row(2, 0, 5, split="train")["registers"]) <= set(TRAIN_CODES)


def test_arithmetic_chain_evaluates_the_operations():
    ops = {"add": lambda v, n: v + n, "subtract": lambda v, n: v - n, "multiply by": lambda v, n: v * n}
    for row in recurtrace_rows("arith", TRAIN_DEPTHS, 64, 9, split="train"):
        value = int(row["start"])
        assert 1 <= value <= 99
        for step, expected in zip(row["steps"], row["chain"], strict=True):
            op, n = step.rsplit(" ", 1)
            assert 2 <= int(n) <= 9
            value = ops[op](value, int(n))
            assert str(value) == expected
        assert row["answer"] == str(value) and row["symbols"] == []


def test_rows_are_deterministic_and_seeds_differ(tok):
    for task, extra in (("phop", {"tokenizer": tok}), ("state", {}), ("state_query", {}), ("arith", {})):
        a = recurtrace_rows(task, [4], 8, 1, **extra)
        assert a == recurtrace_rows(task, [4], 8, 1, **extra)
        assert not {r["prompt"] for r in a} & {r["prompt"] for r in recurtrace_rows(task, [4], 8, 2, **extra)}


@pytest.mark.parametrize("call,match", [
    (lambda tok: state_row(0, 0, 1), "depth 0"),
    (lambda tok: arithmetic_row(2, 0, 1, split="eval"), "split 'eval'"),
    (lambda tok: phop_row(2, 0, 1, tokenizer=tok, alphabet=33), "alphabet 33"),
    (lambda tok: recurtrace_rows("sort", [2], 1, 1), "task 'sort'"),
    (lambda tok: build_rows("state", [2], 1, 1, surface="relay"), "takes no surface"),
    (lambda tok: build_rows("arith", [2], 1, 1, alphabet=8), "nor an alphabet"),
])
def test_bad_input_is_an_error(tok, call, match):
    with pytest.raises(WorkbenchError, match=match):
        call(tok)
