"""Multi-token answers (state tracking, arithmetic) are read exactly: greedy decoding writes the answer, then ends
the line. Calibrated like the symbol reader: a solver of the prompt text scores 100%, a wrong one 0%."""

import pytest
import torch

from tests.executors import AnswerExecutor, solve_arith, solve_prompt
from workbench.errors import WorkbenchError
from workbench.tasks import build_rows
from workbench.tasks.reader import answer_batch, answer_token_ids, read_answers, read_rows, reads_symbol


@pytest.fixture(scope="module")
def answer_rows():
    return build_rows("state", [2, 5], 3, 4) + build_rows("arith", [2, 6], 3, 4)


def test_solvers_recover_every_answer_from_the_prompt_text_alone(answer_rows):
    rows = build_rows("state", range(1, 17), 8, 9) + build_rows("arith", range(1, 17), 8, 9)
    assert all(solve_prompt(r["prompt"]) == r["answer"] for r in rows + answer_rows)
    assert not any(reads_symbol(r) for r in rows)


def test_answer_batch_aligns_each_position_with_the_token_it_predicts(tok, answer_rows):
    b = answer_batch(tok, answer_rows)
    for i, r in enumerate(answer_rows):
        want = answer_token_ids(tok, r)
        assert tok.decode(want) == " " + r["answer"] + "\n" and len(want) > 2   # several tokens, end of line last
        n = int(b["valid"][i].sum())
        assert n == len(want) and b["targets"][i, :n].tolist() == want
        # teacher forcing: the token after each read position is the answer token it must predict
        assert b["input_ids"][i, b["positions"][i, :n] + 1].tolist() == want
        real = b["input_ids"][i][b["attention_mask"][i].bool()]
        assert tok.decode(real[: len(real) - n]) == r["prompt"]


def test_a_perfect_solver_reads_100_percent_at_every_loop(tok, answer_rows):
    read = read_answers(AnswerExecutor(tok), tok, answer_rows, loops=3, batch_size=4)
    frame = read.frame()
    assert read.correct.all() and len(frame) == len(answer_rows) * 3
    assert (frame["predicted"] == frame["target"]).all()
    assert (read.logprob < 0).all()   # one-hot scores over the vocabulary: log p = -K log(1 + (V-1)/e)


@pytest.mark.parametrize("wrong", [lambda text: str(int(solve_arith(text)) + 1),   # off by one
                                   lambda text: solve_arith(text) + "0"])            # right digits, then more
def test_a_wrong_answer_or_one_that_runs_on_reads_0_percent(tok, wrong):
    rows = build_rows("arith", [2, 3], 4, 5)
    read = read_answers(AnswerExecutor(tok, solve=wrong), tok, rows, loops=2)
    assert not read.correct.any()


def test_the_symbol_reader_refuses_multi_token_answers_naming_the_exact_reader(tok, answer_rows):
    refusal = r"state-test-.*\('\d \d \d \d \d \d'\); read it exactly with read_answers"
    with pytest.raises(WorkbenchError, match=refusal):
        read_rows(AnswerExecutor(tok), tok, answer_rows, loops=2)
    with pytest.raises(WorkbenchError, match="loops must be >= 1, got 0"):
        read_answers(AnswerExecutor(tok), tok, answer_rows, loops=0)


def test_read_answers_calls_read_with_the_answer_positions_and_the_whole_vocabulary(tok, answer_rows):
    calls = []

    class Spy(AnswerExecutor):
        def read(self, input_ids, attention_mask=None, loops=1, positions=None, candidates=None, return_states=False):
            calls.append((positions.shape, candidates))
            return super().read(input_ids, attention_mask, loops, positions, candidates)

    read_answers(Spy(tok), tok, answer_rows, loops=1, batch_size=16)
    longest = max(len(answer_token_ids(tok, r)) for r in answer_rows)
    assert calls == [(torch.Size([len(answer_rows), longest]), None)]
