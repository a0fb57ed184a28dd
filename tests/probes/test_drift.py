"""drift finds a planted subspace rotation and a drift planted inside one head's output subspace."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from workbench.probes import drift

D, H, DH, K = 64, 8, 8, 4
THETA = 30.0


@pytest.fixture(scope="module")
def planted():
    """Loop 1 states span U (K dims); loop t rotates U's first axis by (t-1)*THETA towards v,
    a direction inside head 5's output subspace and orthogonal to U."""
    rng = np.random.default_rng(0)
    q = np.linalg.qr(rng.standard_normal((D, D)))[0]
    bases = [q[:, h * DH:(h + 1) * DH] for h in range(H)]                  # orthogonal head subspaces
    v = bases[5][:, 0]
    U = np.linalg.qr(np.column_stack([bases[h][:, 1] + bases[(h + 1) % H][:, 2] for h in (0, 2, 4, 6)]))[0]
    scales = np.array([5.0, 4.0, 3.0, 2.0])
    states = []
    for t in range(1, 4):
        a = np.radians((t - 1) * THETA)
        Ut = U.copy()
        Ut[:, 0] = np.cos(a) * U[:, 0] + np.sin(a) * v
        Z = rng.standard_normal((2000, K)) * scales
        states.append(Z @ Ut.T + 1e-3 * rng.standard_normal((2000, D)))
    return states, bases


def test_principal_angles_recover_the_rotation(planted):
    states, _ = planted
    f = drift.principal_angles(states, K)
    for loop, comparison, expected in [(2, "consecutive", THETA), (3, "consecutive", THETA),
                                       (2, "vs_loop1", THETA), (3, "vs_loop1", 2 * THETA)]:
        angles = f[(f["loop"] == loop) & (f["comparison"] == comparison)].sort_values("angle_index")["angle_deg"]
        assert angles.iloc[-1] == pytest.approx(expected, abs=0.5)
        assert (angles.iloc[:-1] < 0.5).all()


def test_the_concentration_test_finds_the_head(planted):
    states, bases = planted
    conc, heads = drift.concentration_test(states, bases, K, n_null=200, seed=0)
    for t in (2, 3):
        row = conc[conc["loop"] == t].iloc[0]
        assert row["top3_share"] > 0.99 and row["null_p95"] < 0.9 and row["top3_share"] > row["null_p95"]
        shares = heads[heads["loop"] == t].set_index("head")["share"]
        assert shares.idxmax() == 5 and shares[5] > 0.99
    assert conc.set_index("loop").loc[3, "residual_frac"] > conc.set_index("loop").loc[2, "residual_frac"]


def test_no_drift_means_no_concentration(planted):
    rng = np.random.default_rng(1)
    states = [rng.standard_normal((2000, D)) for _ in range(3)]
    _, bases = planted
    conc, _ = drift.concentration_test(states, bases, K, n_null=200, seed=0)
    assert (conc["top3_share"] < conc["null_p95"] + 0.02).all()


def test_head_bases_span_each_heads_output(tiny_looped):
    looped, _ = tiny_looped
    bases = drift.head_bases(looped, looped.b - 1)
    cfg = looped.config
    dh = cfg.hidden_size // cfg.num_attention_heads
    o_proj = looped.layers[looped.b - 1].self_attn.o_proj
    assert len(bases) == cfg.num_attention_heads
    for h, Q in enumerate(bases):
        x = torch.zeros(3, cfg.num_attention_heads * dh)
        x[:, h * dh:(h + 1) * dh] = torch.randn(3, dh)
        y = o_proj(x).detach().double().numpy().T                             # [D, 3]
        assert np.allclose(Q @ (Q.T @ y), y, atol=1e-5)


def test_run_on_a_tiny_retrofit(tiny_looped, rows):
    looped, tok = tiny_looped
    tables = drift.run(looped, tok, rows[::4], k=4, n_null=20)
    assert set(tables["drift"]["loop"]) == {2, 3, 4}
    assert set(tables["drift__concentration"]["loop"]) == {2, 3, 4}
    assert np.allclose(tables["drift__heads"].groupby("loop")["share"].sum(), 1.0)
    summary = drift.summarize(tables)
    assert set(summary) == {"consecutive", "vs_loop1", "concentration", "headline"}
    head = drift.headline(tables)
    assert head.to_dict() == summary["headline"]
    assert head["consecutive_loop2"].value == round(float(tables["drift"].query("comparison == 'consecutive' and loop == 2")
                                                          ["angle_deg"].mean()), 1)
    assert f"at {head['concentrated_loops'].value} of 3 loops" in head.sentence
