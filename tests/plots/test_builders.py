"""Each figure builder on synthetic tables of its probe schema: the figure shows the table's numbers."""

import html
import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest
import synthetic

from workbench.analysis.stats import frontier as frontier_depth
from workbench.errors import WorkbenchError
from workbench.plots import (
    THEME,
    depth_matrix_figure,
    drift_figure,
    drift_heads_figure,
    frontier_figure,
    gradient_audit_figure,
    halting_figure,
    head_concentration_figure,
    heads_figure,
    latency_figure,
    lens_agreement_figure,
    linear_probe_figure,
    logit_lens_figure,
    overshoot_cost_figure,
    overshoot_figure,
    splice_figure,
)
from workbench.plots.heads import RETRIEVAL_MARK


def named(fig: go.Figure, name: str):
    hits = [t for t in fig.data if t.name == name]
    assert len(hits) == 1, f"expected one trace named {name!r}, found {[t.name for t in fig.data]}"
    return hits[0]


def test_depth_matrix_heatmap_holds_the_accuracies_and_marks_the_diagonal(tables):
    dm = tables["depth_matrix"]
    fig = depth_matrix_figure(dm)
    heat = fig.data[0]
    assert heat.type == "heatmap"
    assert list(heat.y) == list(range(1, 9)) and list(heat.x) == list(range(1, 9))
    for d in (1, 4, 8):
        for t in range(1, 9):
            cell = heat.z[d - 1][t - 1]
            rows = dm[(dm["depth"] == d) & (dm["loop"] == t)]
            if t <= d:
                assert cell == pytest.approx(rows["correct"].mean())
            else:  # past the depth there is no active label: the cell stays empty
                assert math.isnan(cell)
    diag = named(fig, "diagonal (t = d)")
    assert list(diag.x) == list(diag.y) == list(range(1, 9))
    assert fig.layout.template.layout.colorway == THEME.layout.colorway


def test_frontier_figure_draws_the_bar_and_the_frontier(tables):
    dm, table = tables["depth_matrix"], tables["depth_matrix__frontier"]
    fig = frontier_figure(dm, frontier=table)
    acc = dm[dm["loop"] == dm["depth"]].groupby("depth")["correct"].mean()
    curve = named(fig, "final-answer accuracy")
    np.testing.assert_allclose(curve.y, acc.to_numpy())
    bar = named(fig, "bar 0.71")
    assert list(bar.y) == [0.71, 0.71]
    expected = frontier_depth(acc, bar=0.71)
    assert 1 < expected < 8  # the synthetic curve crosses the bar inside the range
    marker = named(fig, f"frontier {expected:.2f}")
    assert marker.x[0] == pytest.approx(expected) and marker.y[1] == pytest.approx(0.71)
    assert f"Validity frontier at 0.71: frontier {expected:.2f}, support 8" in fig.layout.title.text
    # Without the probe's table the frontier is computed from the matrix: same value.
    assert named(frontier_figure(dm), f"frontier {expected:.2f}").x[0] == pytest.approx(expected)
    # Wilson intervals bracket each point.
    assert all(a >= 0 for a in curve.error_y.array) and all(a >= 0 for a in curve.error_y.arrayminus)


def test_a_figures_error_bars_are_the_headlines_intervals(tables):
    """One Wilson interval: the frontier figure's bar at each depth is the depth-matrix headline's interval of the
    same final-answer proportion (`workbench.analysis.stats.wilson`), to the last digit."""
    from workbench.analysis.headlines.depth_matrix import headline

    curve = named(frontier_figure(tables["depth_matrix"]), "final-answer accuracy")
    head = headline({k: tables[k] for k in ("depth_matrix", "depth_matrix__frontier")})
    for depth, y, up, down in zip(curve.x, curve.y, curve.error_y.array, curve.error_y.arrayminus):
        number = head[f"final_d{int(depth)}"]
        assert (y - down, y + up) == (pytest.approx(number.low, abs=1e-12), pytest.approx(number.high, abs=1e-12))


def test_frontier_figure_says_when_there_is_no_frontier(tables):
    dm = tables["depth_matrix"].copy()
    dm.loc[dm["depth"] == 1, "correct"] = False  # the first depth below the bar: NaN frontier
    fig = frontier_figure(dm)
    assert not any((t.name or "").startswith("frontier") for t in fig.data)
    assert "none (the first depth is already below the bar)" in fig.layout.title.text
    assert named(fig, "bar 0.71")


def test_logit_lens_heatmap_per_depth_with_slider_and_top_token_hover(tables):
    lens, top = tables["logit_lens"], tables["logit_lens__top"]
    fig = logit_lens_figure(lens, top=top)
    depths = sorted(lens["depth"].unique())
    assert len(fig.data) == len(depths)
    assert len(fig.layout.sliders[0].steps) == len(depths)
    assert [t.visible for t in fig.data] == [False, False, True]  # the deepest shown first
    d = 3
    heat = fig.data[depths.index(d)]
    sub = lens[(lens["lens"] == "coda") & (lens["depth"] == d)]
    want = sub.groupby(["loop", "chain_index"])["prob"].mean().unstack()
    np.testing.assert_allclose(np.asarray(heat.z, float), want.to_numpy())
    assert list(heat.x) == [1, 2, 3]
    # Hover of loop 2: the tokens with the highest mean full-vocabulary probability over depth-3 rows.
    rows = sub["row_id"].unique()
    t2 = top[(top["lens"] == "coda") & (top["loop"] == 2) & top["row_id"].isin(rows)]
    best_token, best_p = t2.groupby("token")["prob"].sum().div(len(rows)).nlargest(1).items().__next__()
    text = heat.text[1][0]
    assert "top tokens" in text and f"{best_p:.3f}" in text and html.escape(repr(best_token), quote=False) in text


def test_logit_lens_rank_view_one_row_and_errors(tables):
    lens, top = tables["logit_lens"], tables["logit_lens__top"]
    fig = logit_lens_figure(lens, lens="raw", value="rank", depth=4)
    sub = lens[(lens["lens"] == "raw") & (lens["depth"] == 4)]
    np.testing.assert_allclose(np.asarray(fig.data[0].z, float),
                               sub.groupby(["loop", "chain_index"])["rank"].mean().unstack().to_numpy())
    assert fig.data[0].reversescale is True and not fig.layout.sliders
    row = lens[lens["depth"] == 2]["row_id"].iloc[0]
    one = logit_lens_figure(lens, top=top, row_id=row)
    symbols = lens[(lens["row_id"] == row) & (lens["lens"] == "coda")].drop_duplicates("chain_index")["symbol"]
    assert list(one.layout.xaxis.ticktext) == [f"x{k} {s}" for k, s in zip((1, 2), symbols)]
    with pytest.raises(WorkbenchError, match="lens 'tuneed'"):
        logit_lens_figure(lens, lens="tuneed")
    with pytest.raises(WorkbenchError, match="accepted: prob, rank"):
        logit_lens_figure(lens, value="logit")
    with pytest.raises(WorkbenchError, match="lacks column"):
        logit_lens_figure(lens.drop(columns="rank"))


def test_lens_agreement_reads_the_current_and_next_symbol(tables):
    lens = tables["logit_lens"]
    fig = lens_agreement_figure(lens)
    assert {t.name for t in fig.data} == {f"{n}: {s}" for n in ("coda", "raw", "tuned") for s in ("x_t", "x_{t+1}")}
    coda = lens[(lens["lens"] == "coda") & (lens["chain_index"] == lens["loop"])]
    np.testing.assert_allclose(named(fig, "coda: x_t").y, coda.groupby("loop")["prob"].mean().to_numpy())


def test_overshoot_stacked_fractions_per_extra_loop(tables):
    df = tables["overshoot"]
    fig = overshoot_figure(df)
    assert fig.layout.barmode == "stack" and [t.name for t in fig.data] == ["iterate", "park", "other"]
    park = named(fig, "park")
    kept = df[~df["coincide"]]  # where f^t(x0) = x_d the classes cannot be told apart
    want = kept.groupby("extra")["cls"].apply(lambda c: (c == "park").mean())
    assert list(park.x) == list(want.index)
    np.testing.assert_allclose(park.y, want.to_numpy())
    np.testing.assert_allclose(sum(np.asarray(t.y, float) for t in fig.data), 1.0)
    assert f"({df['coincide'].sum()} coinciding entries left out)" in fig.layout.title.text


def test_overshoot_cost_one_line_per_depth(tables):
    cost = tables["overshoot__cost"]
    fig = overshoot_cost_figure(tables["overshoot"], cost)
    assert [t.name for t in fig.data] == ["depth 1", "depth 2", "depth 3"]
    np.testing.assert_allclose(named(fig, "depth 2").y, cost[cost["depth"] == 2].sort_values("extra")["answer_acc"])


def test_splice_one_panel_per_site_and_span_with_verdicts(tables):
    df, verdict = tables["splice"], tables["splice__verdict"]
    fig = splice_figure(df, verdict=verdict)
    panels = [("state", "all"), ("state", "read"), ("block_resid", "read"), ("reentry_input", "read")]
    titles = [a.text for a in fig.layout.annotations]
    labels = {"all": "all positions", "read": "read position"}
    assert [t.split("<br>")[0] for t in titles] == [f"{s} · {labels[sp]}" for s, sp in panels]
    for title, (site, span) in zip(titles, panels):
        v = verdict[(verdict["site"] == site) & (verdict["span"] == span)].sort_values("k0")
        assert title.endswith(" · ".join(f"k0={k}: {x}" for k, x in zip(v["k0"], v["verdict"])) + "</sup>")
    lawful_state_all = [t for t in fig.data if t.name == "lawful" and t.xaxis == "x"][0]
    kept = df[(df["site"] == "state") & (df["span"] == "all") & (df["j"] >= 1) & ~df["coincide"]]
    want = kept.groupby("j")["cls"].apply(lambda c: (c == "lawful").mean())
    assert list(lawful_state_all.x) == [1, 2, 3]
    np.testing.assert_allclose(lawful_state_all.y, want.to_numpy())
    assert sum(t.showlegend is not False for t in fig.data) == 4  # one legend entry per class
    n_left_out = int(df[df["j"] >= 1]["coincide"].sum())  # j = 0 always coincides: not worth a mention
    assert n_left_out == 8 and f"({n_left_out} coinciding entries left out)" in fig.layout.title.text
    one_span = splice_figure(df[df["span"] == "read"].drop(columns=["span", "coincide"]))
    assert [a.text for a in one_span.layout.annotations] == ["state", "block_resid", "reentry_input"]


def test_heads_slider_has_one_step_per_loop(tables):
    df, summary = tables["heads"], tables["heads__summary"]
    fig = heads_figure(df, summary=summary)
    loops = sorted(df["loop"].unique())
    steps = fig.layout.sliders[0].steps
    assert len(steps) == len(loops)
    heats = [t for t in fig.data if t.type == "heatmap"]
    assert len(heats) == len(loops)
    t2 = df[df["loop"] == 2].groupby(["layer", "head"])["target_mass"].mean().unstack()
    np.testing.assert_allclose(np.asarray(heats[1].z, float), t2.to_numpy())
    # Step 2 shows loop 2's heatmap and its retrieval markers, nothing else.
    visible = steps[1].args[0]["visible"]
    shown = [t for t, v in zip(fig.data, visible) if v]
    assert [t.name for t in shown] == ["loop 2", RETRIEVAL_MARK]
    marks = shown[1]
    hits = summary[(summary["loop"] == 2) & summary["is_retrieval"]]
    assert list(zip(marks.x, marks.y)) == list(zip(hits["head"], hits["layer"])) == [(5, 12)]
    # the circles are explained: one legend entry (whichever loop is shown) that states the criterion
    legend = [t for t in fig.data if t.type == "scatter" and t.showlegend is not False]
    assert len(legend) == 1 and "3× its layer's median on at least half the rows" in legend[0].name
    assert fig.layout.showlegend is True


def test_head_concentration_against_null(tables):
    summary = tables["heads__summary"]
    fig = head_concentration_figure(tables["heads"], summary)
    np.testing.assert_allclose(fig.data[0].y, summary.groupby("loop")["concentration"].first().to_numpy())
    np.testing.assert_allclose(fig.data[1].y, 0.01)


def test_linear_probe_panels_and_null(tables):
    df = tables["linear_probe"]
    fig = linear_probe_figure(df)
    assert [a.text for a in fig.layout.annotations] == ["state", "block.12", "block.14"]
    acc = [t for t in fig.data if t.name in ("x_{t−1}", "x_t", "x_{t+1}")]
    nulls = [t for t in fig.data if t.name.endswith("null p95")]
    assert len(acc) == len(nulls) == 9
    chance = [t for t in fig.data if t.name == "chance"]
    assert len(chance) == 3 and all(list(t.y) == [0.0625] * 5 for t in chance)
    x_next_b14 = [t for t in acc if t.name == "x_{t+1}" and t.xaxis == "x3"][0]
    want = df[(df["site"] == "block.14") & (df["target"] == "x_next")].sort_values("loop")["accuracy"]
    np.testing.assert_allclose(x_next_b14.y, want.to_numpy())
    assert all(t.line.dash == "dash" for t in nulls)


def test_drift_angles_and_the_random_null_band(tables):
    df, conc = tables["drift"], tables["drift__concentration"]
    fig = drift_figure(df, concentration=conc)
    assert len(fig.layout.annotations) == 2  # two panels
    mean = named(fig, "loop t vs loop 1: mean angle")
    np.testing.assert_allclose(mean.y, df[df["comparison"] == "vs_loop1"].groupby("loop")["angle_deg"].mean())
    band = named(fig, "random partitions: mean to 95th pct")
    assert band.fill == "tonexty"
    np.testing.assert_allclose(band.y, conc["null_p95"])
    np.testing.assert_allclose(named(fig, "top-3 head share of drift energy").y, conc["top3_share"])
    heads = drift_heads_figure(df, tables["drift__heads"])
    share = tables["drift__heads"]
    want = share[(share["loop"] == 3) & (share["layer"] == 15) & (share["head"] == 2)]["share"].item()
    assert heads.data[0].z[list(heads.data[0].y).index(3)][list(heads.data[0].x).index("L15H2")] == pytest.approx(want)
    alone = drift_figure(df)
    assert len(alone.layout.annotations) == 1 and not any("top-3" in (t.name or "") for t in alone.data)


def test_halting_curve_one_trace_per_method(tables):
    df = tables["halting"]
    fig = halting_figure(df)
    assert [t.name for t in fig.data] == ["distilled head (tau sweep)", "oracle", "fixed depth k", "ACT",
                                          "chosen on calibration rows"]
    sweep = fig.data[0]
    assert list(sweep.x) == sorted(sweep.x) and list(sweep.customdata) == [0.1, 0.3, 0.5, 0.7, 0.9]
    assert fig.data[1].marker.symbol == "star"
    assert list(fig.data[-1].customdata) == ["head", "fixed_k", "oracle", "act"]
    assert fig.layout.annotations[0].text == "best fixed depth k = 6"
    no_method = halting_figure(df[df["method"] == "head"].drop(columns=["method", "chosen"]))
    assert [t.name for t in no_method.data] == ["halting head (threshold sweep)"]
    both = halting_figure(df, difficulty=tables["halting__difficulty"])
    bars = [t for t in both.data if t.type == "bar"]
    assert [b.name for b in bars] == ["hard rows (wrong at loop 1)", "easy rows (right at loop 1)"]
    assert list(bars[0].y) == [4.5, 3.0] and list(bars[1].x) == ["distilled head (tau sweep)", "oracle"]


def test_gradient_audit_log_scale_and_fd_note(tables):
    fig = gradient_audit_figure(tables["gradient_audit"], fd=tables["gradient_audit__fd"])
    assert fig.layout.yaxis.type == "log"
    assert sorted(t.name for t in fig.data) == ["block", "coda", "reentry"]
    np.testing.assert_allclose(named(fig, "reentry").y, [1e-3 * 0.7 ** t for t in range(1, 5)])
    assert "max relative error 0.0002 over 3 directions" in fig.layout.title.text
    # Zeros cannot sit on a log axis; they are the finding, so the title names them.
    ga = tables["gradient_audit"].copy()
    ga.loc[(ga["group"] == "reentry") & (ga["loop"] == 1), "grad_rms"] = 0.0
    ga.loc[ga["group"] == "coda", "grad_rms"] = 0.0
    fig = gradient_audit_figure(ga)
    assert sorted(t.name for t in fig.data) == ["block", "reentry"]
    assert math.isnan(named(fig, "reentry").y[0])
    assert "no gradient at any loop: coda; zero at loop 1: reentry" in fig.layout.title.text


def test_latency_measured_against_predicted(tables):
    fig = latency_figure(tables["latency"])
    assert len(fig.data) == 6
    loops = named(fig, "cost of T loops vs 1 loop: measured")
    np.testing.assert_allclose(loops.y, [0.9, 1.8, 3.6, 7.2])
    assert named(fig, "cost of T loops vs 1 loop: predicted").line.dash == "dash"


@pytest.mark.parametrize("builder, name", [(depth_matrix_figure, "depth_matrix"), (overshoot_figure, "overshoot"),
                                           (heads_figure, "heads"), (latency_figure, "latency")])
def test_bad_tables_are_one_line_errors(tables, builder, name):
    with pytest.raises(WorkbenchError, match=f"{name} table is empty"):
        builder(tables[name].iloc[0:0])
    with pytest.raises(WorkbenchError, match="needs a pandas DataFrame"):
        builder(tables[name].to_dict())


def test_unknown_classes_pool_into_other(rng):
    df, _ = synthetic.overshoot(rng)
    df.loc[df.index[:5], "cls"] = "weird"
    fig = overshoot_figure(df)
    total = sum(np.asarray(t.y, float) for t in fig.data)
    np.testing.assert_allclose(total, 1.0)
    assert isinstance(df, pd.DataFrame)
