"""linear_probe decodes what is linearly present and nothing else (label-permutation null)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.probes.machines import TableMachine
from workbench.errors import WorkbenchError
from workbench.probes import linear_probe
from workbench.tasks import build_rows


def test_a_planted_linear_code_is_decoded_above_its_null():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 8, size=120).astype(str)
    codes = rng.standard_normal((8, 32))
    X = codes[y.astype(int)] + 0.1 * rng.standard_normal((120, 32))
    out = linear_probe.probe(X[:60], y[:60], X[60:], y[60:], n_perm=20, C=1.0, seed=0)
    assert out["accuracy"] == 1.0 and out["null_p95"] < 0.4
    assert out["n_train"] == 60 and out["n_test"] == 60


def test_noise_is_not_decoded():
    rng = np.random.default_rng(1)
    X, y = rng.standard_normal((120, 32)), rng.integers(0, 8, size=120).astype(str)
    out = linear_probe.probe(X[:60], y[:60], X[60:], y[60:], n_perm=20, C=1.0, seed=0)
    assert out["accuracy"] < 0.35


def test_the_machine_state_holds_the_current_symbol_linearly(tok):
    # The machine's state is [one-hot x_t | table]: x_t is linear in it, whatever the loop.
    rows = build_rows("chase", [1, 2], 96, 5, alphabet=8, tokenizer=tok)
    machine = TableMachine(tok, rows[0]["symbols"], mode="carry")
    f = linear_probe.run(machine, tok, rows, n_perm=20, seed=0)
    assert set(f["site"]) == {"state"} and set(f["loop"]) == {1, 2}
    x_t = f[f["target"] == "x_t"]
    assert x_t.set_index("loop").loc[1, "accuracy"] == 1.0
    assert (x_t["accuracy"] > 0.7).all() and (x_t["null_p95"] < 0.4).all()  # loop 2: 0.77 on 48 training rows
    assert (f["n_train"] + f["n_test"] == f["loop"].map({1: 192, 2: 96})).all()
    assert (f["n_test"] == f["loop"].map({1: 96, 2: 48})).all()


def test_block_layers_and_sites_on_a_tiny_retrofit(tiny_looped, rows):
    looped, tok = tiny_looped
    f = linear_probe.run(looped, tok, rows[::2], layers=["mid"], n_perm=2)
    assert set(f["site"]) == {"state", "block.3"}
    assert set(f["target"]) == {"x_prev", "x_t", "x_next"}
    with pytest.raises(WorkbenchError, match="not a block layer"):
        linear_probe.run(looped, tok, rows[:4], layers=[5])
    with pytest.raises(WorkbenchError, match="target 'x_far'"):
        linear_probe.run(looped, tok, rows[:4], targets=("x_far",))
