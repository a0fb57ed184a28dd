"""logit_lens: the three lenses agree where they must, and the tuned lens is the fitted affine map."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from workbench.loop.config import Block, RetrofitConfig
from workbench.loop.surgery import retrofit
from workbench.models import load_base
from workbench.probes import logit_lens
from workbench.tasks.reader import read_rows


@pytest.fixture(scope="module")
def no_coda():
    """A tiny retrofit whose block runs to the last layer: the Coda is empty, so coda lens == raw lens."""
    model, tok = load_base("tiny-llama")
    return retrofit(model, RetrofitConfig(Block(2, 6), max_loops=6)).eval(), tok


def test_with_no_coda_the_raw_lens_is_the_coda_lens(no_coda, rows):
    looped, tok = no_coda
    tables = logit_lens.run(looped, tok, rows, fit_fraction=0.5)
    f = tables["logit_lens"].set_index(["row_id", "loop", "chain_index", "lens"]).unstack("lens")
    assert np.allclose(f["prob"]["coda"], f["prob"]["raw"], atol=1e-6)
    assert (f["rank"]["coda"] == f["rank"]["raw"]).all()


def test_the_coda_lens_is_the_reader(tiny_looped, rows):
    looped, tok = tiny_looped
    tables = logit_lens.run(looped, tok, rows, fit_fraction=0.5, seed=2)
    f = tables["logit_lens"]
    coda = f[f["lens"] == "coda"]
    evaluated = sorted(set(coda["row_id"]))
    assert len(evaluated) == 16  # half of each depth; the other half fits the tuned lens
    by_id = {r["row_id"]: r for r in rows}
    result = read_rows(looped, tok, [by_id[i] for i in evaluated], loops=4)
    probs = torch.as_tensor(result.scores).softmax(-1).numpy()
    for r in coda.itertuples():
        i, j = evaluated.index(r.row_id), by_id[r.row_id]["symbols"].index(r.symbol)
        assert r.prob == pytest.approx(probs[i, r.loop - 1, j], abs=1e-5)
        assert r.rank == int((result.scores[i, r.loop - 1] > result.scores[i, r.loop - 1, j]).sum())
    top = tables["logit_lens__top"]
    assert set(top["k"]) == set(range(5)) and set(top["lens"]) == {"coda", "raw", "tuned"}
    assert (top.groupby(["row_id", "loop", "lens"])["prob"].apply(lambda p: p.is_monotonic_decreasing)).all()


def test_fit_tuned_recovers_a_planted_affine_map():
    rng = np.random.default_rng(0)
    A, b = rng.standard_normal((6, 6)), rng.standard_normal(6)
    X = rng.standard_normal((40, 3, 6))
    Y = X[:, 1] @ A + b
    maps = logit_lens.fit_tuned(X, Y, depths=np.full(40, 3), ridge=1e-9)
    mx, W, my = maps[2]
    test = rng.standard_normal((5, 6))
    assert np.allclose((test - mx) @ W + my, test @ A + b, atol=1e-5)


def test_fit_tuned_uses_only_rows_deep_enough(rows):
    X = np.random.default_rng(0).standard_normal((4, 3, 5))
    maps = logit_lens.fit_tuned(X, X[:, 0], depths=np.array([1, 1, 2, 3]), ridge=0.1)
    assert set(maps) == {1, 2}  # loop 3 has a single row of depth >= 3
