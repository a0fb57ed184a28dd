"""The one reader: calibration against the perfect executor, chance under shuffling, contracts."""

import numpy as np
import pandas as pd
import pytest
import torch

from tests.executors import ParkingExecutor, PerfectExecutor, Readout, ShuffledExecutor
from workbench.errors import WorkbenchError
from workbench.tasks import build_rows
from workbench.tasks.manifest import rows_sha256
from workbench.tasks.reader import candidate_ids, encode_prompts, read_rows


@pytest.fixture(scope="module")
def chase16(tok):
    return build_rows("chase", range(1, 15), 12, 20260702, alphabet=16, tokenizer=tok)


def test_candidate_ids_are_the_single_tokens_after_a_space(tok):
    ids = candidate_ids(tok, ["A", "B", "Ben"])
    expected = [tok.encode(" " + s, add_special_tokens=False)[0] for s in ("A", "B", "Ben")]
    assert ids.dtype == torch.long and ids.tolist() == expected
    assert tok.decode(ids[2:]) == " Ben"
    with pytest.raises(WorkbenchError, match=r"'Zoe'.*smollm2-135m-instruct"):
        candidate_ids(tok, ["Ben", "Zoe"])


def test_encode_prompts_pads_on_the_left_so_the_last_column_is_the_read_position(tok):
    enc = encode_prompts(tok, ["A -> B\nAnswer:", "Answer:"])
    assert enc["input_ids"].shape == enc["attention_mask"].shape
    assert enc["attention_mask"][1, 0] == 0 and enc["attention_mask"][:, -1].tolist() == [1, 1]
    assert tok.decode(enc["input_ids"][1, -2:]) == "Answer:"


def test_perfect_executor_scores_exactly_100_percent_through_the_reader(tok, chase16):
    result = read_rows(PerfectExecutor(tok), tok, chase16, loops=16, batch_size=7)
    frame = result.frame()
    assert result.scores.shape == (len(chase16), 16, 16)
    active = frame.dropna(subset=["correct"])
    assert len(active) == sum(r["depth"] for r in chase16) and active["correct"].all()
    diagonal = frame[frame["loop"] == frame["depth"]]
    assert diagonal["predicted"].tolist() == [r["answer"] for r in chase16]


@pytest.mark.parametrize("rows_kw", [
    dict(task="chase", depths=range(1, 13), surface="relay"),
    dict(task="chase", depths=range(1, 13), surface="pointer"),
    dict(task="chase", depths=range(1, 24), alphabet=24, permutation=True),
    dict(task="phop", depths=(2, 8, 16)),  # per-row symbol sets: candidates [B, C]
])
def test_perfect_executor_is_perfect_on_every_surface(tok, rows_kw):
    kw = dict(rows_kw)
    rows = build_rows(kw.pop("task"), kw.pop("depths"), 4, 5, tokenizer=tok, **kw)
    frame = read_rows(PerfectExecutor(tok), tok, rows, loops=max(r["depth"] for r in rows)).frame()
    assert frame["correct"].dropna().all() and frame["correct"].notna().sum() == sum(r["depth"] for r in rows)


def test_past_the_depth_targets_are_masked_and_executors_differ(tok, chase16):
    perfect = read_rows(PerfectExecutor(tok), tok, chase16, loops=16)
    parking = read_rows(ParkingExecutor(tok), tok, chase16, loops=16)
    fp, fk = perfect.frame(), parking.frame()
    past = fp["loop"] > fp["depth"]
    assert fp.loc[past, "target"].isna().all() and fp.loc[past, "correct"].isna().all()
    assert fp["correct"].dtype == pd.BooleanDtype()
    # Parking holds x_d; the perfect executor iterates f, so past the depth they part ways somewhere.
    answers = fk.merge(pd.DataFrame({"row_id": perfect.row_ids, "answer": [r["answer"] for r in chase16]}))
    held = answers[answers["loop"] >= answers["depth"]]
    assert (held["predicted"] == held["answer"]).all()
    assert (fp.loc[past, "predicted"] != fk.loc[past, "predicted"]).any()
    assert (fp.loc[~past, "predicted"] == fk.loc[~past, "predicted"]).all()


def test_shuffled_executor_scores_near_chance(tok, chase16):
    frame = read_rows(ShuffledExecutor(PerfectExecutor(tok), seed=3), tok, chase16, loops=14).frame()
    accuracy = frame["correct"].dropna().mean()
    n = frame["correct"].notna().sum()
    assert abs(accuracy - 1 / 16) < 4 * np.sqrt(1 / 16 * 15 / 16 / n), (accuracy, n)


def test_result_carries_the_rows_digest_and_predictions(tok, chase16):
    result = read_rows(PerfectExecutor(tok), tok, chase16[:20], loops=3)
    assert result.manifest_sha256 == rows_sha256(chase16[:20]) and result.loops == 3
    assert result.predictions.shape == (20, 3)
    assert result.predicted_symbols()[0][0] == chase16[0]["chain"][0]
    assert list(result.frame().columns) == ["row_id", "depth", "loop", "target", "predicted", "correct"]


class Recorder:
    """A fake model that records the reader's calls and answers with fixed scores."""

    def __init__(self, shape_fix=None):
        self.calls = []
        self.shape_fix = shape_fix

    def read(self, input_ids, attention_mask=None, loops=1, positions=None, candidates=None, return_states=False):
        self.calls.append(dict(input_ids=input_ids, attention_mask=attention_mask, loops=loops,
                               positions=positions, candidates=candidates))
        c = candidates.shape[-1]
        shape = self.shape_fix or (input_ids.shape[0], loops, 1, c)
        return Readout(torch.arange(c, dtype=torch.float).expand(*shape).clone())


def test_reader_calls_read_once_per_batch_with_left_padding_and_shared_candidates(tok, chase16):
    model = Recorder()
    result = read_rows(model, tok, chase16[:40], loops=5, batch_size=16)
    assert len(model.calls) == 3
    ids16 = candidate_ids(tok, chase16[0]["symbols"])
    for call in model.calls:
        assert call["loops"] == 5 and call["positions"] is None
        assert torch.equal(call["candidates"], ids16)  # one [C] shared by the batch
        assert call["attention_mask"][:, -1].all()
    assert (result.predictions == 15).all()  # argmax over candidates: the last symbol


def test_reader_refuses_wrong_shapes_and_non_symbol_answers(tok, chase16):
    with pytest.raises(WorkbenchError, match="shape"):
        read_rows(Recorder(shape_fix=(1, 1, 1, 16)), tok, chase16[:4], loops=2)
    with pytest.raises(WorkbenchError, match="not one of its symbols"):
        read_rows(Recorder(), tok, build_rows("arith", [2], 2, 1), loops=2)
    with pytest.raises(WorkbenchError, match="loops"):
        read_rows(Recorder(), tok, chase16[:4], loops=0)


def test_calibration_on_the_standard_n16_family(tok):
    rows = build_rows("chase", range(1, 15), 128, 20260702, alphabet=16, tokenizer=tok)
    frame = read_rows(PerfectExecutor(tok), tok, rows, loops=14, batch_size=64).frame()
    diagonal = frame[frame["loop"] == frame["depth"]]
    assert len(rows) == 1792 and diagonal["correct"].sum() == 1792 and frame["correct"].dropna().all()
