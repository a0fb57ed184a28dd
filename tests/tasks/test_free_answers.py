"""A user's free-text answer is read as greedy decoding writes it (`writes_answer`): the answer, then the row's
`answer_end`, or anything that does not continue its last word. Read on a stand-in whose greedy text is fixed, the
exact reader agrees with that text at every loop."""

import pytest
import torch

from tests.executors import Readout, StandIn
from workbench.errors import WorkbenchError
from workbench.probes import loop_accuracy
from workbench.tasks.reader import read_answers, writes_answer
from workbench.tasks.user import check_user_rows

PROMPT = "The capital of France is"


class Writer(StandIn):
    """A model whose greedy continuation of each prompt is fixed text, one per loop: at every read position it puts
    the next token of prompt + that text on top (end of text: the EOS token), whatever tokens were forced after the
    prompt, so its greedy decoding writes exactly `written[prompt][t - 1]` at loop t."""

    max_loops, halting = 8, None

    def __init__(self, tokenizer, written: dict[str, list[str]]):
        self.tokenizer, self.written, self.forwards = tokenizer, written, 0

    def read(self, input_ids, attention_mask=None, loops=1, positions=None, candidates=None, return_states=False):
        """Scores [B, T, P, vocab]: 1 on the fixed text's token each position predicts, 0 elsewhere."""
        self.forwards += 1
        scores = torch.zeros(input_ids.shape[0], loops, positions.shape[1], len(self.tokenizer))
        for b, (ids, mask) in enumerate(zip(input_ids, attention_mask)):
            text = self.tokenizer.decode(ids[mask.bool()])
            prompt = max((p for p in self.written if text.startswith(p)), key=len)
            first = int((~mask.bool()).sum()) + len(self.tokenizer(prompt)["input_ids"]) - 1
            for t, written in enumerate(self.written[prompt][:loops]):
                greedy = self.tokenizer.encode(written, add_special_tokens=False) + [self.tokenizer.eos_token_id]
                for j, p in enumerate(positions[b].tolist()):
                    scores[b, t, j, greedy[min(p - first, len(greedy) - 1)]] = 1.0
        return Readout(scores)


def user_row(tok, answer: str, prompt: str = PROMPT, **fields) -> dict:
    return check_user_rows([(1, {"prompt": prompt, "answer": answer, **fields})], tok, "test rows")[0][0]


@pytest.mark.parametrize(("answer", "written", "fields", "answers"), [
    ("Paris", " Paris.", {}, True),
    ("Paris", " Paris\n", {}, True),
    ("Paris", " Paris is a city", {}, True),
    ("Paris", " Paris", {}, True),                  # then the end of text
    ("Paris", " Parisian food", {}, False),         # ' Paris' 'ian': the word goes on
    ("Paris", " Lyon.", {}, False),
    ("New York", " New York, of course", {}, True),
    ("New York", " New Yorker", {}, False),         # ' New' ' Yorker': another token
    ("Paris", " Paris.\n", {"answer_end": "\n"}, False),
    ("Paris", " Paris\nand", {"answer_end": "\n"}, True),
    ("Paris", " Paris, France", {"answer_end": ","}, True),
])
def test_a_row_reads_correct_exactly_when_the_greedy_text_answers_it(tok, answer, written, fields, answers):
    row = user_row(tok, answer, **fields)
    assert not row["symbols"]                                   # read exactly, token by token
    assert writes_answer(written, row) is answers
    read = read_answers(Writer(tok, {PROMPT: [written]}), tok, [row], loops=1)
    assert bool(read.correct[0, 0]) is answers


def test_loop_accuracy_agrees_with_the_greedy_text_of_every_loop_and_row(tok):
    written = {PROMPT: [" Paris.", " Parisian", " Paris\n", " Lyon"],
               "The largest city of the United States is": [" New York.", " New York City", " New Yorker", " Los"]}
    rows = [user_row(tok, "Paris", id="paris"),
            user_row(tok, "New York", prompt="The largest city of the United States is", id="new-york")]
    model = Writer(tok, written)
    frame = loop_accuracy.run(model, tok, rows, loops=4, batch_size=2)["loop_accuracy"]
    got = frame.pivot(index="row_id", columns="loop", values="correct").loc[["paris", "new-york"]].astype(bool)
    want = [[writes_answer(w, r) for w in written[r["prompt"]]] for r in rows]
    assert got.to_numpy().tolist() == want == [[True, False, True, False], [True, True, False, False]]
    assert model.forwards == 1                                  # every loop and row from one teacher-forced forward
    shown = frame.pivot(index="row_id", columns="loop", values="predicted").loc[["paris", "new-york"]]
    # what greedy decoding writes at the answer's positions, up to its first wrong token: never text after it
    assert shown.to_numpy().tolist() == [["Paris", "Paris", "Paris", "Lyon"], ["New York", "New York", "New Yorker", "Los"]]


def test_a_built_in_tasks_answer_still_ends_its_line_beside_a_users_row(tok):
    """Mixed in one batch: the built-in task's row still needs its end of line, the user's row does not."""
    state = {"row_id": "s", "task": "state", "depth": 1, "prompt": "Answer:", "answer": "1 2", "symbols": []}
    written = {"Answer:": [" 1 2 3"], PROMPT: [" Paris is"]}
    read = read_answers(Writer(tok, written), tok, [state, user_row(tok, "Paris")], loops=1)
    assert read.correct[:, 0].tolist() == [False, True]
    assert writes_answer(" 1 2\n", state) and not writes_answer(" 1 2 3", state)


@pytest.mark.parametrize(("fields", "message"), [
    ({"answer_end": ""}, r"answer_end must be a non-empty string, got \"\""),
    ({"answer_end": 3}, "answer_end must be a non-empty string, got 3"),
    ({"answer_end": "\n", "candidates": ["Paris", "Lyon"]}, "answer_end is for an answer read exactly"),
])
def test_a_bad_answer_end_is_refused_in_one_line(tok, fields, message):
    with pytest.raises(WorkbenchError, match=f"test rows line 1: {message}"):
        user_row(tok, "Paris", **fields)


def test_a_row_with_an_answer_end_is_read_exactly_and_keeps_it(tok):
    rows, meta = check_user_rows([(1, {"prompt": PROMPT, "answer": "Paris", "answer_end": "\n"}),
                                  (2, {"prompt": "The capital of Italy is", "answer": "Rome"})], tok, "test rows")
    assert [r["symbols"] for r in rows] == [[], []] and meta["candidates"].endswith("every answer read exactly, token by token")
    assert rows[0]["answer_end"] == "\n" and "answer_end" not in rows[1]
