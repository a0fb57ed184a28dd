"""The `park` stage: the answer loss at every loop d..T (T drawn per step), chain supervision below d."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from workbench.errors import WorkbenchError
from workbench.tasks.chase import chase_row
from workbench.train.evaluate import park_reading
from workbench.train.losses import make_batch, park_loop_count
from workbench.train.recipe import Recipe
from workbench.train.trainer import train


def test_a_park_batch_targets_the_answer_at_every_loop_past_d(tiny):
    _, tok = tiny
    rows = [chase_row(4, d, i, 0, tokenizer=tok, split="train") for i, d in enumerate([1, 3, 2])]
    b = make_batch(rows, tok, chain_weight=0.25, park_loops=5)
    assert b["targets"].shape == (3, 5) and b["weights"].shape == (3, 5)
    for i, r in enumerate(rows):
        d, idx = r["depth"], [r["symbols"].index(x) for x in r["chain"]]
        assert b["targets"][i].tolist() == idx + [idx[-1]] * (5 - d)     # x_1..x_d, then x_d held
        assert b["weights"][i].tolist() == [0.25] * (d - 1) + [1.0] * (5 - d + 1)
    plain = make_batch(rows, tok, chain_weight=0.25)                     # the chain batch is unchanged
    assert plain["targets"].shape == (3, 3) and (plain["targets"][0, 1:] == -1).all()
    with pytest.raises(WorkbenchError, match="park_loops = 2 is below the deepest row's depth 3"):
        make_batch(rows, tok, park_loops=2)


def test_a_depth_mix_parks_the_named_depths_and_iterates_the_others_past_d(tiny):
    """park_depths: rows of those depths hold x_d past d; the others' loop t targets x_t, the table walked t
    times from the start (computed here from the table, not from the chain the batch builder reads)."""
    _, tok = tiny
    rows = [chase_row(4, d, i, 0, tokenizer=tok, split="train") for i, d in enumerate([1, 3, 2])]
    b = make_batch(rows, tok, chain_weight=0.25, park_loops=5, park_depths={1})
    for i, r in enumerate(rows):
        d, walked, x = r["depth"], [], r["start"]
        for _ in range(5):
            x = r["table"][x]
            walked.append(r["symbols"].index(x))
        want = walked[:d] + [walked[d - 1]] * (5 - d) if d == 1 else walked
        assert b["targets"][i].tolist() == want, d
        assert b["weights"][i].tolist() == [0.25] * (d - 1) + [1.0] * (5 - d + 1)
    assert make_batch(rows, tok, park_loops=5, park_depths={1, 2, 3})["targets"].tolist() == \
        make_batch(rows, tok, park_loops=5)["targets"].tolist()          # every depth named: the plain park batch
    bare = [{k: v for k, v in rows[1].items() if k != "table"}]
    with pytest.raises(WorkbenchError, match="needs the row's function table"):
        make_batch(bare, tok, park_loops=5, park_depths={1})


def test_park_depths_belong_to_a_park_stage_and_its_depths(write_recipe):
    with pytest.raises(WorkbenchError, match=r"'stages.0.park_depths' belongs to a park stage; stage 0 is 'chain'"):
        Recipe.from_toml(write_recipe(stages=[{"kind": "chain", "depths": [1, 2], "steps": 2, "park_depths": [1]}]))
    with pytest.raises(WorkbenchError, match=r"'stages.0.park_depths' = \[3\] names depths the stage does not train"):
        Recipe.from_toml(write_recipe(sampler={"max": 4}, stages=[{"kind": "park", "depths": [1, 2], "steps": 2,
                                                                     "park_depths": [3]}]))
    with pytest.raises(WorkbenchError, match=r"'stages.0.park_depths' = \[\] parks no depth"):
        Recipe.from_toml(write_recipe(sampler={"max": 4}, stages=[{"kind": "park", "depths": [1, 2], "steps": 2,
                                                                     "park_depths": []}]))
    with pytest.raises(WorkbenchError, match=r"must be a list of numbers"):
        Recipe.from_toml(write_recipe(sampler={"max": 4}, stages=[{"kind": "park", "depths": [1, 2], "steps": 2,
                                                                     "park_depths": ["one"]}]))


def test_a_depth_mix_run_hands_its_park_depths_to_every_step(write_recipe, tmp_path, monkeypatch):
    from workbench.train.stages import chain

    seen, real = [], chain.make_batch

    def spy(*args, **kw):
        if kw.get("park_loops") is not None:
            seen.append(kw.get("park_depths"))
        return real(*args, **kw)

    monkeypatch.setattr(chain, "make_batch", spy)
    recipe = write_recipe(sampler={"max": 4}, eval={"every": 2, "per_depth": 2, "depths": [1, 2]},
                          stages=[{"kind": "park", "depths": [1, 2], "steps": 2, "park_depths": [1]}])
    assert train(recipe, out=tmp_path / "mix", progress=False)["finished"] is True
    assert seen == [{1}, {1}]


def test_park_loop_counts_are_uniform_from_the_deepest_row_to_the_maximum():
    draws = [park_loop_count(3, 8, seed) for seed in range(3000)]
    assert min(draws) == 3 and max(draws) == 8
    shares = pd.Series(draws).value_counts(normalize=True)
    assert (shares - 1 / 6).abs().max() < 0.03
    assert park_loop_count(3, 8, 11) == park_loop_count(3, 8, 11)       # hashed seed: the same on every rank
    assert park_loop_count(8, 8, 5) == 8
    with pytest.raises(WorkbenchError, match="depth 9 must lie in 1..8"):
        park_loop_count(9, 8, 0)


def test_park_reading_counts_the_cells_past_d_that_hold_the_answer():
    # row a (d = 1, answer B): loops 2, 3 read B, C; row b (d = 2, answer D): loop 3 reads D; row c (d = 3): none past
    rec = [("a", 1, 1, "B", "B"), ("a", 1, 2, None, "B"), ("a", 1, 3, None, "C"),
           ("b", 2, 1, "C", "C"), ("b", 2, 2, "D", "A"), ("b", 2, 3, None, "D"),
           ("c", 3, 1, "A", "A"), ("c", 3, 2, "B", "B"), ("c", 3, 3, "C", "C")]
    frame = pd.DataFrame.from_records(rec, columns=["row_id", "depth", "loop", "target", "predicted"])
    out = park_reading(frame)
    # row b read A at its own depth, D past it: the answer is x_d (the target at loop d), not what loop d read
    assert out == {"park": {"1": {"2": 1.0, "3": 0.0}, "2": {"3": 1.0}}, "park_cells": 3, "park_share": 0.6667}
    assert park_reading(frame[frame["loop"] <= frame["depth"]])["park_share"] is None


def test_a_park_stage_needs_sampler_max_at_least_its_deepest_depth(write_recipe):
    stage = {"kind": "park", "depths": [1, 2], "steps": 2}
    with pytest.raises(WorkbenchError, match=r"'sampler.max' = 1 must lie in 2..model.max_loops = 4"):
        Recipe.from_toml(write_recipe(sampler={"max": 1}, stages=[stage]))
    with pytest.raises(WorkbenchError, match=r"'sampler.max' = 5 must lie in 2..model.max_loops = 4"):
        Recipe.from_toml(write_recipe(sampler={"max": 5}, stages=[stage]))
    assert Recipe.from_toml(write_recipe(sampler={"max": 4}, stages=[stage])).needed_loops() == 4


def test_a_park_run_trains_past_d_logs_the_park_reading_and_resumes_bitwise(write_recipe, tmp_path):
    recipe = write_recipe(sampler={"max": 4}, eval={"every": 3, "per_depth": 4, "depths": [1, 2]},
                          stages=[{"kind": "park", "depths": [1, 2], "steps": 3, "chain_weight": 0.5,
                                   "chain_weight_end": 0.1},
                                  {"kind": "park", "depths": [1, 2], "steps": 3, "chain_weight": 0.1}])
    whole = train(recipe, out=tmp_path / "whole", progress=False)
    assert whole["finished"] is True
    lines = [json.loads(x) for x in (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in lines if m["kind"] == "train"]
    assert len(steps) == 6 and all(2 <= m["loops"] <= 4 and len(m["loop_ce"]) == m["loops"] for m in steps)
    assert [m["chain_weight"] for m in steps[:3]] == pytest.approx([0.5, 0.3, 0.1])
    evals = [m for m in lines if m["kind"] == "eval"]
    assert [e["step"] for e in evals] == [0, 3, 6]
    for e in evals:   # depth 1 read at loops 2-4, depth 2 at loops 3-4: 4 rows each
        assert set(e["park"]) == {"1", "2"} and set(e["park"]["1"]) == {"2", "3", "4"}
        assert e["park_cells"] == 4 * 3 + 4 * 2 and 0 <= e["park_share"] <= 1
    train(recipe, out=tmp_path / "cut", stop_after=5, progress=False)
    train(recipe, out=tmp_path / "cut", resume=True, progress=False)
    want = load_file(str(tmp_path / "whole" / "trainable.safetensors"))
    got = load_file(str(tmp_path / "cut" / "trainable.safetensors"))
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
