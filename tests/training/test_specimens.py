"""Committed LoRA specimens reproduce their committed arms numbers from their own files (fp32 reads)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "probes" / "chase_n8_d1-7.jsonl"


@pytest.mark.specimen
@pytest.mark.parametrize("specimen, depth", [("smollm2-chase-s2", 3), ("smollm2-chase", 5), ("smollm2-chase-s3", 4),
                                             ("smollm2-chase-s2-seed2", 3), ("smollm2-chase-s6", 7)])
def test_a_specimen_rereads_its_committed_depth_matrix(specimen, depth, n=16):
    """The depth just past each support (where a wrong load or a changed reader would show first): `n` rows at
    every loop 1..d read again from the committed trainable tensors give the committed predictions. A row's scores
    do not depend on the rows read beside it (the first 16 rows of the keeper's depth 5 read alone give, bit for
    bit, the scores they get among all 64), so 16 rows check the load and the reader as the whole depth does."""
    from workbench.runs import load_run
    from workbench.tasks.manifest import read_manifest, rows_sha256
    from workbench.tasks.reader import read_rows

    run = ROOT / "training" / "keepers" / specimen
    committed = pd.read_parquet(run / "arms" / "depth_matrix.parquet")
    rows = [r for r in read_manifest(MANIFEST).rows if r["depth"] == depth][:n]
    assert len(rows) == n
    looped, tok, info = load_run(run)                      # strict load, base hash checked; fp32 as the battery
    assert info["provenance"]["status"] == "finished"
    frame = read_rows(looped, tok, rows, loops=depth).frame()
    ids = {r["row_id"] for r in rows}
    want = committed[(committed["depth"] == depth) & (committed["loop"] <= depth) & committed["row_id"].isin(ids)]
    got = frame.merge(want, on=["row_id", "loop"], suffixes=("", "_committed"), validate="one_to_one")
    assert len(got) == n * depth
    assert (got["predicted"] == got["predicted_committed"]).all()
    final = got[got["loop"] == depth]
    assert int(final["correct"].sum()) == int(want[want["loop"] == depth]["correct"].sum())
    assert rows_sha256(read_manifest(MANIFEST).rows).startswith("5771be8a9457")  # the rows the arms battery read


@pytest.mark.specimen
@pytest.mark.parametrize("specimen, kind", [("smollm2-chase-direct", "direct"), ("smollm2-chase-scratchpad", "scratchpad")])
def test_a_dense_control_rereads_its_committed_final_answers(specimen, kind):
    """Depths 3 and 7 (past the direct arm's reach, and the deepest the scratchpad writes): 16 rows of each read
    again from the committed tensors give the committed answers (scripts/final_answers.py wrote them), and the
    committed accuracies are those answers'."""
    import json

    from workbench.runs import load_run
    from workbench.tasks.manifest import read_manifest
    from workbench.train.dense import read_direct, read_scratchpad

    run = ROOT / "training" / "keepers" / specimen
    record = json.loads((run / "final" / "final.json").read_text())
    assert record["kind"] == kind and record["support"] == 4 and record["rows"] == 448
    committed = pd.read_parquet(run / "final" / "final.parquet").set_index("row_id")
    for d in (3, 7):   # the committed accuracies are the committed answers' (all 64 rows of each depth)
        assert int(committed[committed["depth"] == d]["correct"].sum()) == round(64 * record["accuracy_by_depth"][str(d)])
    rows = [r for d in (3, 7) for r in [r for r in read_manifest(MANIFEST).rows if r["depth"] == d][:16]]
    looped, tok, _ = load_run(run)
    got = (read_direct if kind == "direct" else read_scratchpad)(looped, tok, rows).set_index("row_id")
    assert len(got) == 32 and (got["predicted"] == committed.loc[got.index, "predicted"]).all()
    assert (got["correct"] == committed.loc[got.index, "correct"]).all()


@pytest.mark.specimen
def test_the_halting_specimen_rereads_its_heads_continue_probabilities():
    """The keeper's oracle-distilled head (a halting-stage run, committed tensors: the head, a delta on the keeper's
    adapter and bridge) gives the committed continue probability at every loop on 16 rows, and the ACT / PonderNet
    runs hold the same frozen model (only their heads differ)."""
    from safetensors.torch import load_file

    from workbench.probes.common import read_final
    from workbench.run_tensors import read_tensors
    from workbench.runs import load_run
    from workbench.tasks.manifest import read_manifest

    run = ROOT / "training" / "halting" / "keeper-oracle"
    committed = pd.read_parquet(run / "halting" / "halting__rows.parquet")
    committed = committed[committed["head"] == "head"].set_index(["row_id", "loop"])["continue_prob"]
    rows = [r for r in read_manifest(MANIFEST).rows if r["depth"] in (2, 6)][::8]
    looped, tok, info = load_run(run)
    assert info["provenance"]["status"] == "finished"
    read = read_final(looped, tok, rows, 8, 16, False, {})
    for i, r in enumerate(rows):
        want = [committed[(r["row_id"], t)] for t in range(1, 9)]
        assert read.halt_probs["head"][i].tolist() == pytest.approx(want, abs=1e-5)
    keeper = load_file(str(ROOT / "training" / "keepers" / "smollm2-chase" / "trainable.safetensors"))
    for name in ("keeper-act", "keeper-pondernet", "keeper-oracle"):
        heads, _ = read_tensors(ROOT / "training" / "halting" / name / "trainable.safetensors")   # deltas on the keeper
        assert set(heads) - set(keeper) == {"halting.proj.weight", "halting.proj.bias"}
        assert all(heads[k].equal(v) for k, v in keeper.items())


@pytest.mark.specimen
@pytest.mark.parametrize("specimen", ["smollm2-state-query-plain", "smollm2-state-query-plain-long"])
def test_the_state_query_plain_arm_rereads_its_committed_loop_accuracy(specimen):
    """The memory-vs-plain claim on state tracking reads `loops/loop_accuracy.parquet`: 16 rows of depth 5 (past
    the support) read again at loops 1-8 from the plain arm's committed tensors give the committed predictions,
    at both doses (the memory arms' tensors are not committed; see test_tensorless_specimens.py)."""
    from workbench.runs import load_run
    from workbench.tasks.manifest import read_manifest
    from workbench.tasks.reader import read_rows

    run = ROOT / "training" / "keepers" / specimen
    committed = pd.read_parquet(run / "loops" / "loop_accuracy.parquet")
    rows = [r for r in read_manifest(ROOT / "probes" / "state_query_d1-7.jsonl").rows if r["depth"] == 5][:16]
    looped, tok, info = load_run(run)
    assert info["provenance"]["status"] == "finished"
    frame = read_rows(looped, tok, rows, loops=8).frame()
    got = frame.merge(committed, on=["row_id", "loop"], suffixes=("", "_committed"), validate="one_to_one")
    assert len(got) == 16 * 8 and (got["predicted"] == got["predicted_committed"]).all()


@pytest.mark.specimen
def test_the_park_model_rereads_its_committed_overshoot_cells():
    """The Stage 1 model the park-* ledger rows read (issue 33 item 3): 8 rows per overshoot depth (1-3), read again
    from the committed tensors to loop d + 5, give the committed predictions and classes (park / iterate / other),
    and the model holds the answer on those rows past d, where iterate and park differ."""
    from workbench.runs import load_run
    from workbench.tasks.manifest import read_manifest
    from workbench.tasks.reader import read_rows

    run = ROOT / "training" / "keepers" / "smollm2-chase-park-count"
    committed = pd.read_parquet(run / "battery" / "overshoot.parquet")
    looped, tok, info = load_run(run)                      # strict load, base hash checked; fp32 as the battery
    assert info["provenance"]["status"] == "finished"
    for depth in (1, 2, 3):
        rows = [r for r in read_manifest(MANIFEST).rows if r["depth"] == depth][:8]
        frame = read_rows(looped, tok, rows, loops=depth + 5).frame()
        want = committed[(committed["depth"] == depth) & committed["row_id"].isin({r["row_id"] for r in rows})]
        got = frame.merge(want, on=["row_id", "loop"], suffixes=("", "_committed"), validate="one_to_one")
        assert len(got) == 8 * 5
        assert (got["predicted"] == got["predicted_committed"]).all()
        decidable = got[~got["coincide"]]
        assert (decidable["predicted"] == decidable["park_symbol"]).mean() >= 0.5


@pytest.mark.specimen
def test_the_park_mix_model_rereads_its_committed_depth_matrix():
    """The depth-mix park model the park-* halting rows read (issue 44 item 1): 8 rows of a parked depth (2) and of
    an iterated one (6), read again from the committed tensors to 7 loops, give the committed predictions; over
    the 32 committed rows the depth-2 rows hold their answer at loop 7 and the depth-6 rows leave it."""
    from workbench.runs import load_run
    from workbench.tasks.reader import read_rows

    run = ROOT / "training" / "keepers" / "smollm2-chase-park-mix"
    committed = pd.read_parquet(run / "battery" / "depth_matrix.parquet")
    looped, tok, info = load_run(run)
    assert info["provenance"]["status"] == "finished"
    rows = {r["row_id"]: r for r in read_manifest_rows()}
    for depth in (2, 6):
        want = committed[committed["depth"] == depth]
        ids = sorted(want["row_id"].unique())[:8]
        frame = read_rows(looped, tok, [rows[i] for i in ids], loops=7).frame()
        got = frame.merge(want[want["row_id"].isin(ids)], on=["row_id", "loop"], suffixes=("", "_committed"),
                          validate="one_to_one")
        assert len(got) == 8 * 7 and (got["predicted"] == got["predicted_committed"]).all()
        at = got[got["loop"] == depth]
        assert at["correct"].mean() >= 0.71
        grid = want.pivot(index="row_id", columns="loop", values="predicted")   # all 32 committed rows
        held = (grid[7] == grid[depth]).mean()
        assert held >= 0.71 if depth == 2 else held <= 0.29   # depth 2 parks on x_2; depth 6 goes on to x_7


def read_manifest_rows() -> list[dict]:
    from workbench.tasks.manifest import read_manifest

    return read_manifest(MANIFEST).rows
