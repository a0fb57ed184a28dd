"""splice on constructed machines whose splice class is known, and on a tiny retrofit."""

from __future__ import annotations

import pytest
import torch

from tests.probes.machines import TableMachine
from workbench.errors import WorkbenchError
from workbench.probes import splice
from workbench.probes.common import iterate, token_lengths
from workbench.tasks.reader import read_rows


@pytest.fixture(scope="module")
def deep_rows(rows):
    return [r for r in rows if r["depth"] >= 2]


@pytest.mark.parametrize("mode, expected", [("carry", "source_orbit"), ("prelude", "lawful"),
                                            ("shortcut", "shortcut")])
def test_each_machine_gets_its_verdict(tok, deep_rows, mode, expected):
    machine = TableMachine(tok, deep_rows[0]["symbols"], mode=mode)
    tables = splice.run(machine, tok, deep_rows, k0s=(1, 2), sites=("state",), spans=("all", "read"))
    verdicts = tables["splice__verdict"]
    assert len(verdicts) == 4 and (verdicts["verdict"] == expected).all()
    assert (verdicts[expected] == 1.0).all() and (verdicts["n"] >= 30).all()  # 24 pairs x 3 j, less coincidences
    frame = tables["splice"]
    # j = 0 reads the spliced state itself: B's symbol at loop k0, in every mode.
    at_splice = frame[frame["j"] == 0]
    rows_by_id = {r["row_id"]: r for r in deep_rows}
    assert all(p == iterate(rows_by_id[b], k0) for p, b, k0 in zip(at_splice["predicted"], at_splice["row_b"],
                                                                   at_splice["k0"]))


def test_carry_machine_follows_the_source_from_every_site(tok, deep_rows):
    machine = TableMachine(tok, deep_rows[0]["symbols"], mode="carry")
    tables = splice.run(machine, tok, deep_rows, k0s=(2,), sites=splice.SITES, spans=("all", "read"),
                        all_sites=splice.SITES, layer=0)
    assert len(tables["splice__verdict"]) == 6
    assert set(tables["splice__verdict"]["verdict"]) == {"source_orbit"}
    assert set(tables["splice__verdict"]["site"]) == set(splice.SITES)


def test_pairs_share_depth_and_length_and_use_each_row_once_per_side(tok, rows):
    pairs = splice.make_pairs(tok, rows, seed=3)
    lengths = token_lengths(tok, rows)
    assert len(pairs) == len(rows)
    assert sorted(a for a, _ in pairs) == sorted(b for _, b in pairs) == list(range(len(rows)))
    assert all(a != b and rows[a]["depth"] == rows[b]["depth"] and lengths[a] == lengths[b] for a, b in pairs)


def test_pair_ids_number_the_pairs(tok, deep_rows):
    machine = TableMachine(tok, deep_rows[0]["symbols"], mode="carry")
    frame = splice.run(machine, tok, deep_rows, k0s=(1,), horizon=1, sites=("state",), batch_size=5)["splice"]
    assert sorted(frame["pair_id"].unique()) == list(range(len(deep_rows)))
    assert (frame.groupby("pair_id")[["row_a", "row_b"]].nunique() == 1).all().all()


def test_a_state_splice_into_a_fresh_retrofit_reads_the_source_row(tiny_looped, deep_rows):
    # A fresh bridge passes h through (W_p = 0), so after an all-position state splice at k0
    # row A's model is row B's model: A must read exactly what B reads at every loop >= k0.
    looped, tok = tiny_looped
    subset = [r for r in deep_rows if r["depth"] == 2]
    tables = splice.run(looped, tok, subset, k0s=(2,), horizon=1, sites=("state",), spans=("all",))
    frame = tables["splice"]
    assert len(frame) == 8 * 2
    own = read_rows(looped, tok, subset, loops=3)
    pred = {(rid, t + 1): p for rid, ps in zip(own.row_ids, own.predicted_symbols()) for t, p in enumerate(ps)}
    assert all(p == pred[(b, t)] for p, b, t in zip(frame["predicted"], frame["row_b"], frame["loop"]))


def test_the_all_span_runs_only_at_its_sites(tok, deep_rows):
    machine = TableMachine(tok, deep_rows[0]["symbols"], mode="prelude")
    tables = splice.run(machine, tok, deep_rows, k0s=(1,), layer=0)
    combos = set(zip(tables["splice__verdict"]["site"], tables["splice__verdict"]["span"]))
    assert combos == {("state", "all"), ("state", "read"), ("block_resid", "read"), ("reentry_input", "read")}
    verdicts = tables["splice__verdict"].set_index(["site", "span"])["verdict"]
    assert verdicts[("state", "read")] == verdicts[("block_resid", "read")] == "lawful"
    # At loop 1 the block input is the Prelude itself: B's (x0, f_B) swapped in, then A's rule applied
    # to x^B_0, which is neither class: the re-entry input site is not the state.
    assert verdicts[("reentry_input", "read")] != "lawful"


def test_read_span_replaces_only_the_read_position():
    cached = torch.arange(24.0).reshape(2, 3, 4)
    hook = splice._substitute(cached, "read", torch.tensor([2, 1]))
    out = hook(torch.zeros(2, 3, 4), None)
    assert torch.equal(out[0, 2], cached[0, 2]) and torch.equal(out[1, 1], cached[1, 1])
    assert out[0, :2].abs().sum() == 0 and out[1, 0].abs().sum() == 0 and out[1, 2].abs().sum() == 0


def test_verdict_thresholds():
    assert splice.verdict({"source_orbit": 0.75, "lawful": 0.2, "shortcut": 0.05, "other": 0}, 20) == "source_orbit"
    assert splice.verdict({"source_orbit": 0.1, "lawful": 0.8, "shortcut": 0.1, "other": 0}, 20) == "lawful"
    assert splice.verdict({"source_orbit": 0.2, "lawful": 0.3, "shortcut": 0.5, "other": 0}, 20) == "shortcut"
    assert splice.verdict({"source_orbit": 0.4, "lawful": 0.3, "shortcut": 0.3, "other": 0}, 20) == "mixed"
    assert splice.verdict({}, 0) == "undetermined"


def test_bad_site_and_layer_are_refused(tiny_looped, deep_rows):
    looped, tok = tiny_looped
    with pytest.raises(WorkbenchError, match="site 'coda'"):
        splice.run(looped, tok, deep_rows, sites=("coda",))
    with pytest.raises(WorkbenchError, match="not a block layer"):
        splice.run(looped, tok, deep_rows, sites=("block_resid",), layer=5)
