"""lens_agreement, dynamics and exit_rules on planted cases whose right numbers are known by construction
(tests/probes/planted.py), and on a tiny real retrofit for the t = T identity and the one-pass read."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from tests.probes.planted import ContractionMachine, LensMachine, ScriptedMachine
from workbench.analysis.headlines.dynamics import state_rows
from workbench.errors import WorkbenchError
from workbench.probes import dynamics, exit_rules, lens_agreement
from workbench.probes.common import split_rows


# ----------------------------------------------------------------------------- dynamics
def test_a_contraction_settles_at_its_planted_rate(tok, rows):
    tables = dynamics.run(ContractionMachine("contract"), tok, rows, loops=10)
    per_row = tables["dynamics__rows"]
    for layer, lam in enumerate(ContractionMachine.RATES):
        g = per_row[per_row["layer"] == layer]
        assert len(g) == len(rows)
        assert np.allclose(g["rate"], lam, rtol=1e-9)
        assert (g["cls"] == "settling").all()
    f = tables["dynamics"]
    inner = f["angle_deg"].dropna()
    assert len(inner) and np.allclose(inner, 0.0, atol=1e-5)      # every step points the same way
    last = f[f["loop"] == 10]
    assert np.allclose(last["dist_last"], 0.0) and last["rel_step"].isna().all()
    # relative step of the state: s_t / ||h_t|| with s_t = lam^t (1 - lam) |v|, h_t = c + lam^t v, c ⟂ v, |c| = 5
    row = rows[0]
    m = ContractionMachine("contract")
    v = float(m.offset(tok([row["prompt"]], return_tensors="pt")["input_ids"])[0, 0])
    got = f[(f["row_id"] == row["row_id"]) & (f["layer"] == 1)].set_index("loop")["rel_step"]
    for t in range(1, 10):
        want = 0.5 ** t * 0.5 * v / math.hypot(5.0, 0.5 ** t * v)
        assert got[t] == pytest.approx(want, rel=1e-9)
    assert (dynamics.headline(tables)["settling_share"].value == 1.0)


def test_the_heads_divergence_is_zero_for_a_fixed_pattern_and_ln2_for_a_flip(tok, rows):
    h = dynamics.run(ContractionMachine("contract"), tok, rows[:8], loops=6)["dynamics__heads"]
    assert set(h["loop"]) == set(range(1, 6)) and set(h["layer"]) == {0, 1}
    assert np.allclose(h[h["head"] == 0]["js_mean"], 0.0, atol=1e-12)
    assert np.allclose(h[h["head"] == 1]["js_mean"], math.log(2), rtol=1e-9)


@pytest.mark.parametrize("mode, cls, rate", [("rotate", "marginal", 1.0), ("expand", "drifting", 1.5)])
def test_an_orbit_is_marginal_and_an_expansion_drifts(tok, rows, mode, cls, rate):
    tables = dynamics.run(ContractionMachine(mode), tok, rows[:8], loops=8, heads=False)
    state = state_rows(tables)
    assert np.allclose(state["rate"], rate, rtol=1e-9) and (state["cls"] == cls).all()
    assert tables["dynamics__heads"].empty
    if mode == "rotate":   # consecutive steps of a rotation turn by its angle
        a = tables["dynamics"]["angle_deg"].dropna()
        assert np.allclose(a, math.degrees(0.3), rtol=1e-6)


class DoublingMachine(ContractionMachine):
    """The expansion with its fixed point at 0: every block layer's state is 2^t v, so its norm doubles each step."""

    def __init__(self):
        super().__init__("expand", expand=2.0)

    def fixed_point(self, layer):
        return torch.zeros(self.D, dtype=torch.float64)


def test_a_state_that_doubles_each_step_reads_norm_growth_two(tok, rows):
    tables = dynamics.run(DoublingMachine(), tok, rows[:4], loops=6, heads=False)
    f = tables["dynamics"]
    assert f[f["loop"] == 1]["norm_growth"].isna().all()          # no state before the first pass
    later = f[f["loop"] > 1]
    assert len(later) == 4 * 2 * 5 and (later["norm_growth"] == 2.0).all()
    for _, r in f.iterrows():   # ||h_t|| = 2^t |v|, v = the row's planted offset (dims 0-1)
        assert r["norm"] == pytest.approx(2.0 ** r["loop"] * f[(f["row_id"] == r["row_id"]) & (f["loop"] == 1)]
                                          ["norm"].iloc[0] / 2.0, rel=1e-12)
    assert set(dynamics.summarize(tables)["state_norm_growth_by_loop"].values()) == {2.0}


def test_a_committed_table_without_the_norm_columns_reads_unchanged():
    """A battery written before `norm` / `norm_growth` existed summarises to exactly what it committed."""
    run = Path(__file__).parents[2] / "training/keepers/smollm2-chase-park-codes/battery"
    tables = {name: pd.read_parquet(run / f"{name}.parquet") for name in ("dynamics", "dynamics__rows",
                                                                          "dynamics__heads")}
    assert "norm" not in tables["dynamics"]
    committed = json.loads((run / "summary.json").read_text())["probes"]["dynamics"]
    committed.pop("wall_s")   # the battery adds the probe's wall time beside its summary
    assert json.loads(json.dumps(dynamics.summarize(tables))) == committed


def test_the_classification_rule_and_bad_options():
    assert dynamics.classify(0.9) == "settling" and dynamics.classify(0.91) == "marginal"
    assert dynamics.classify(1 / 0.9) == "drifting" and dynamics.classify(1.1) == "marginal"
    assert dynamics.contraction_rate(np.array([4.0, 2.0, 1.0, 0.5]), 1) == pytest.approx(0.5)
    assert dynamics.contraction_rate(np.zeros(3), 1) == 0.0
    with pytest.raises(WorkbenchError, match="band"):
        dynamics.run(ContractionMachine(), None, [{"depth": 1, "symbols": ["A"], "answer": "A", "task": "chase"}],
                     band=1.5)


# ----------------------------------------------------------------------------- lens_agreement
def test_lenses_that_disagree_by_construction(tok, rows):
    model = LensMachine(tok, rows, max_loops=8)
    tables = lens_agreement.run(model, tok, rows, loops=6, horizon=1, max_causal=200, seed=1)
    f = tables["lens_agreement"]
    coda, logit = f[f["lens"] == "coda"], f[f["lens"] == "logit"]
    assert coda["agree_label"].all()                          # the Coda reads x_t at every pass
    assert not logit["agree_label"].any()                     # the logit lens reads x_t + 1 in the alphabet
    by = logit.set_index(["row_id", "loop"])["top1"]
    sym = rows[0]["symbols"]
    for r in coda.itertuples():
        assert by[(r.row_id, r.loop)] == sym[(sym.index(r.top1) + 1) % len(sym)]
    last = coda[coda["loop"] == 6]
    assert last["agree_final"].all() and np.allclose(last["kl_final"], 0.0, atol=1e-12)
    pairs = tables["lens_agreement__pairs"]
    assert not pairs[pairs["pair"] == "logit-coda"]["agree"].any()
    s = tables["lens_agreement__summary"]
    one = s[(s["measure"] == "agree_label") & (s["lens"] == "coda") & (s["loop"] == 3)].iloc[0]
    assert one["value"] == 1.0 and one["n"] == 16 and one["low"] < 1.0
    causal = tables["lens_agreement__causal"]
    kept = causal[~causal["coincide"]]
    assert len(kept) > 20 and set(kept["j"]) == {0, 1}
    assert kept["carried_coda"].all() and not kept["carried_logit"].any()
    assert (causal["disagree"] == "logit-coda").all()             # logit and coda differ in every cell here
    assert tables["lens_agreement__identity"]["max_abs_diff"].iloc[0] == 0.0
    h = lens_agreement.headline(tables)
    assert h["carried_coda"].value == 1.0 and h["carried_logit"].value == 0.0
    assert h["carried_coda_logit_coda"].value == 1.0 and h["carried_logit_logit_coda"].n == h["carried_logit"].n
    assert h["label_coda"].value == 1.0 and h["label_logit"].value == 0.0


def test_the_identity_at_t_equals_T_fails_loudly_when_broken(tok, rows):
    with pytest.raises(WorkbenchError, match="coda lens at t = T = 4 is not the model's output"):
        lens_agreement.run(LensMachine(tok, rows, broken=True), tok, rows, loops=4)


def test_on_a_real_retrofit_the_identity_holds_and_tables_are_deterministic(tiny_looped, rows):
    looped, tok = tiny_looped
    a = lens_agreement.run(looped, tok, rows, loops=5, max_causal=6, seed=3)
    b = lens_agreement.run(looped, tok, rows, loops=5, max_causal=6, seed=3)
    assert a["lens_agreement__identity"]["holds"].all()
    assert a["lens_agreement__identity"]["max_abs_diff"].iloc[0] < 1e-3
    for name in a:
        assert a[name].equals(b[name]), name
    f = a["lens_agreement"]
    assert set(f["lens"]) == {"logit", "coda", "tuned"} and set(f["loop"]) == set(range(1, 6))
    t5 = f[(f["lens"] == "coda") & (f["loop"] == 5)]
    assert t5["agree_final"].all()


# ----------------------------------------------------------------------------- exit_rules
def test_a_max_prob_rule_has_its_planted_best_threshold(tok, rows):
    model = ScriptedMachine(tok, rows, max_loops=8)
    tables = exit_rules.run(model, tok, rows, loops=8, grids={"max_prob": [0.3, 0.6, 0.9], "stable": [1, 2, 3]},
                            rules=("max_prob", "stable", "kl"))
    f = tables["exit_rules"]
    mp = f[f["method"] == "max_prob"].set_index("threshold")
    assert mp["chosen"].idxmax() == 0.6                            # stops exactly at each row's depth
    _, rep = split_rows(rows, 0.5, 0)
    depths = np.array([r["depth"] for r in rep])
    assert mp.at[0.6, "accuracy"] == 1.0 and mp.at[0.6, "mean_loops"] == pytest.approx(depths.mean())
    assert mp.at[0.9, "accuracy"] == 1.0 and mp.at[0.9, "mean_loops"] == pytest.approx(depths.mean() + 1)
    assert mp.at[0.3, "mean_loops"] == 1.0 and mp.at[0.3, "accuracy"] == pytest.approx((depths == 1).mean())
    st = f[f["method"] == "stable"].set_index("threshold")
    assert st["chosen"].idxmax() == 1.0 and st.at[1.0, "mean_loops"] == pytest.approx(depths.mean() + 1)
    head = f[(f["method"] == "head") & f["chosen"]].iloc[0]
    assert head["accuracy"] == 1.0 and head["mean_loops"] == pytest.approx(depths.mean() + 2)
    oracle = f[f["method"] == "oracle"].iloc[0]
    assert oracle["mean_loops"] == pytest.approx(depths.mean())
    test = tables["exit_rules__test"].iloc[0]
    assert test["reference"] == "head" and test["rule"] == "stable" and test["rule_threshold"] == 2.0
    assert test["rule_mean_loops"] == pytest.approx(depths.mean() + 2) and test["p_mcnemar"] == 1.0
    assert test["rule_only"] == 0 and test["ref_only"] == 0


def test_each_exit_reads_its_agreement_with_the_last_steps_answer(tok, rows):
    """At T = 3 the depth-4 rows are wrong at every step, each step a different symbol: the last step's answer is
    wrong for them, so agreeing with it differs from being right."""
    model = ScriptedMachine(tok, rows, max_loops=8)
    tables = exit_rules.run(model, tok, rows, loops=3, grids={"max_prob": [0.6]}, rules=("max_prob",))
    f = tables["exit_rules"]
    _, rep = split_rows(rows, 0.5, 0)
    d = np.array([r["depth"] for r in rep])
    fixed = f[f["method"] == "fixed_k"].set_index("threshold")
    assert fixed.at[1.0, "agree_last"] == pytest.approx((d == 1).mean())
    assert fixed.at[2.0, "agree_last"] == pytest.approx((d <= 2).mean())
    assert fixed.at[3.0, "agree_last"] == 1.0 and fixed.at[3.0, "accuracy"] == pytest.approx((d <= 3).mean())
    # the model's own exit (as Ouro's gate): it continues through d + 1, so a row runs to T = 3 unless the
    # threshold stops every row at step 1
    head = f[f["method"] == "head"]
    assert set(head["mean_loops"]) == {1.0, 3.0}
    assert (head[head["mean_loops"] == 3.0]["agree_last"] == 1.0).all()
    assert np.allclose(head[head["mean_loops"] == 1.0]["agree_last"], (d == 1).mean())
    # max_prob >= 0.6 stops a row at its depth; a depth-4 row never reaches it and stops at T
    mp = f[f["method"] == "max_prob"].iloc[0]
    assert mp["agree_last"] == 1.0 and mp["accuracy"] == pytest.approx((d <= 3).mean())
    assert exit_rules.summarize(tables)["chosen"]["fixed_k"]["agree_last"] == 1.0


def test_a_rule_far_from_the_heads_loops_is_not_matched(tok, rows):
    model = ScriptedMachine(tok, rows, max_loops=8)
    tables = exit_rules.run(model, tok, rows, loops=8, grids={"max_prob": [0.6]}, rules=("max_prob",))
    m = tables["exit_rules__matched"].iloc[0]
    assert m["method"] == "max_prob" and not m["within"] and not m["best"]   # 2 loops earlier than the head
    assert tables["exit_rules__test"].empty
    assert "No rule's calibration mean loops get within the match window of head's" in exit_rules.headline(tables).sentence
    within = exit_rules.run(model, tok, rows, loops=8, grids={"max_prob": [0.6]}, rules=("max_prob",),
                            match_within=2.0)["exit_rules__test"]
    assert within.iloc[0]["rule"] == "max_prob" and within.iloc[0]["rule_only"] == 0


def test_stop_depth_and_unknown_rules():
    v = np.array([[np.nan, 0.5, 0.1, 0.0], [np.nan, 0.9, 0.8, 0.7]])
    assert exit_rules.stop_depth(v, 0.2, False, 1).tolist() == [3, 4]
    assert exit_rules.stop_depth(v, 0.6, True, 3).tolist() == [4, 3]
    with pytest.raises(WorkbenchError, match="exit rule 'nope' is unknown"):
        exit_rules.run(None, None, [{"depth": 1, "symbols": ["A"], "answer": "A", "task": "chase"}], rules=("nope",))


# ----------------------------------------------------------------------------- the battery, end to end
def test_the_three_probes_run_through_the_battery_and_the_cli(tmp_path):
    import json
    from pathlib import Path

    import pandas as pd
    import tomli_w
    from typer.testing import CliRunner

    from workbench.cli import app

    manifest = Path(__file__).parents[2] / "probes" / "chase_n8_d1-7.jsonl"
    battery = tmp_path / "loops.toml"
    battery.write_text(tomli_w.dumps({
        "battery": {"manifest": str(manifest), "batch_size": 8},
        "probes": {"lens_agreement": {"depths": [1, 2], "per_depth": 4, "loops": 3, "max_causal": 4},
                   "dynamics": {"depths": [1, 2], "per_depth": 2, "loops": 4},
                   "exit_rules": {"depths": [1, 2], "per_depth": 4, "loops": 3}}}))
    result = CliRunner().invoke(app, ["probe", "--checkpoint", "untrained:tiny-llama:2:4", "--battery", str(battery),
                                      "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    for name in ("lens_agreement", "dynamics", "exit_rules"):
        assert summary["probes"][name]["headline"]["sentence"], name
    assert summary["probes"]["lens_agreement"]["identity_max_abs_diff"] < 1e-3
    rows = pd.read_parquet(tmp_path / "out" / "dynamics__rows.parquet")
    assert len(rows) == 4 * 2 and set(rows["cls"]) <= set(dynamics.CLASSES)    # 4 rows x 2 block layers
    heads = pd.read_parquet(tmp_path / "out" / "dynamics__heads.parquet")
    assert set(heads["loop"]) == {1, 2, 3} and set(heads["layer"]) == {2, 3}
    bad = battery.read_text().replace("max_causal", "max_casual")
    battery.write_text(bad)
    result = CliRunner().invoke(app, ["probe", "--checkpoint", "untrained:tiny-llama:2:4", "--battery", str(battery),
                                      "--out", str(tmp_path / "bad")])
    assert isinstance(result.exception, WorkbenchError) and "no option 'max_casual'" in str(result.exception)
    assert not (tmp_path / "bad").exists()
