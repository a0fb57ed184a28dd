"""Block selection: angular distance, Kneedle boundaries with their guards, window ablation, the CLI."""

import copy
import json
import math
import warnings

import pytest
import torch
import typer
from kneed import KneeLocator
from typer.testing import CliRunner

import workbench.selection.stage1 as selection
from workbench.commands.select_block import SELECTION_HTML, SELECTION_JSON
from workbench.commands.select_block import select_block as select_block_command
from workbench.errors import WorkbenchError
from workbench.loop.config import Block, RetrofitConfig
from workbench.loop.positions import last_real_token, position_ids
from workbench.loop.surgery import retrofit
from workbench.models import load_base
from workbench.plots.selection import curve_frame, windows_frame
from workbench.selection.stage1 import (
    BlockSelection,
    angular_distance_between,
    angular_distances,
    candidate_windows,
    default_window,
    find_boundaries,
    find_knee,
    load_corpus,
    next_token_loss,
    resolve_block,
    select_block,
    split_texts,
    window_ablation,
)
from workbench.tasks.guardrail import guardrail_rows

TEXTS = [
    "The river runs to the sea.",
    "def add(a, b):\n    # why: keep integers exact\n    return a + b",
    "She opened the door slowly, half expecting the room to be empty, but the old man was still there.",
    "Hi.",
    "Preheat the oven to 180 degrees, grease a tin, and mix the flour, sugar and butter.",
    "\"Are you coming tomorrow?\" asked Maria. \"Only if it stops raining,\" said her brother.",
    "Glaciers form where more snow falls in winter than melts in summer.",
    "Water boils at one hundred degrees Celsius at sea level.",
]
U_CURVE = [0.5, 0.25, 0.12, 0.1, 0.09, 0.085, 0.08, 0.085, 0.09, 0.1, 0.12, 0.25, 0.45]


@pytest.fixture(scope="module")
def tiny_ro():
    """A tiny-llama the tests here only read (nothing edits its weights)."""
    return load_base("tiny-llama")


# ------------------------------------------------------------------ the formula
def test_angular_distance_between_known_vectors():
    x = torch.tensor([[1.0, 0.0]] * 5)
    y = torch.tensor([[1.0, 0.0], [3.0, 0.0], [0.0, 2.0], [1.0, 1.0], [-1.0, 0.0]])
    d = angular_distance_between(x, y)
    assert d.dtype == torch.float64
    assert d.tolist() == pytest.approx([0.0, 0.0, 0.5, 0.25, 1.0], abs=1e-7)
    # Through a real width: a vector at angle theta from x has distance theta / pi.
    g = torch.Generator().manual_seed(0)
    u, v = torch.randn(2, 576, generator=g)
    v = v - (v @ u) / (u @ u) * u  # orthogonal to u
    theta = 0.3
    w = math.cos(theta) * u / u.norm() + math.sin(theta) * v / v.norm()
    assert angular_distance_between(u, 7.0 * w).item() == pytest.approx(theta / math.pi, abs=1e-6)


def _reference_curve(model, tok, texts):
    """HF hidden states for layers 0..L-2 and the raw last-layer output read from LoopedLM hooks.

    Also returns, per text, the last value as HF's `output_hidden_states` would give it.
    """
    L = len(model.model.layers)
    looped = retrofit(model, RetrofitConfig(Block(L - 1, L), max_loops=1))
    rows, normed = [], []
    for text in texts:
        enc = tok(text, return_tensors="pt")
        with torch.no_grad():
            hs = model.model(**enc, output_hidden_states=True).hidden_states  # body only: no LM head
            _, cache = looped.run_with_cache(enc.input_ids, loops=1,
                                             names_filter=lambda n: n in ("loop.1.hook_input", "loop.1.hook_state"))
        assert torch.equal(cache["loop.1.hook_input"][0, -1], hs[L - 1][0, -1])
        states = [h[0, -1] for h in hs[:L]] + [cache["loop.1.hook_state"][0, -1]]
        rows.append([angular_distance_between(states[i], states[i + 1]).item() for i in range(L)])
        normed.append(angular_distance_between(hs[L - 1][0, -1], hs[L][0, -1]).item())
    return torch.tensor(rows, dtype=torch.float64).mean(0).tolist(), sum(normed) / len(normed)


def test_angular_distances_one_value_per_layer_without_final_norm(tiny_ro):
    model, tok = tiny_ro
    curve = angular_distances(model, tok, TEXTS, batch_size=3, progress=False)
    assert len(curve) == len(model.model.layers) == 6
    assert all(0.0 <= v <= 1.0 for v in curve)
    reference, _ = _reference_curve(model, tok, TEXTS)
    assert curve == pytest.approx(reference, abs=1e-6)
    # A final norm with a non-uniform gain: the curve must not move, HF's last hidden state does.
    normed_model = copy.deepcopy(model)
    with torch.no_grad():
        normed_model.model.norm.weight.uniform_(0.2, 3.0, generator=torch.Generator().manual_seed(0))
    assert angular_distances(normed_model, tok, TEXTS, progress=False) == pytest.approx(curve, abs=1e-6)
    _, hf_last = _reference_curve(normed_model, tok, TEXTS[:3])
    assert abs(hf_last - angular_distances(normed_model, tok, TEXTS[:3], progress=False)[-1]) > 0.01


def test_angular_distances_ignore_padding_and_batch_size(tiny_ro):
    model, tok = tiny_ro
    left = angular_distances(model, tok, TEXTS, batch_size=4, progress=False)
    one = angular_distances(model, tok, TEXTS, batch_size=1, progress=False)
    right_tok = copy.deepcopy(tok)
    right_tok.padding_side = "right"
    right = angular_distances(model, right_tok, TEXTS, batch_size=8, progress=False)
    assert one == pytest.approx(left, abs=1e-6)
    assert right == pytest.approx(left, abs=1e-6)
    assert max(left) - min(left) > 1e-3  # the layers really differ, so agreement is not vacuous


def test_position_ids_count_real_tokens_only():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0]])
    assert position_ids(mask)[0, 2:].tolist() == [0, 1, 2]
    assert position_ids(mask)[1, :3].tolist() == [0, 1, 2]
    assert last_real_token(mask).tolist() == [4, 2]
    assert last_real_token(torch.ones(2, 3, dtype=torch.long)).tolist() == [2, 2]


# ------------------------------------------------------------------ Kneedle and its guards
def test_u_shaped_curve_gives_one_knee_per_side():
    left, right = find_boundaries(U_CURVE)
    assert (left.layer, right.layer) == (2, 10)
    assert "layer 2" in left.reason and "falling" in left.reason
    assert "layer 10" in right.reason and "rising" in right.reason


def test_flat_curve_reports_no_knee_with_a_reason():
    left, right = find_boundaries([0.1] * 12)
    assert left.layer is None and right.layer is None
    assert "needs at least 3" in left.reason  # argmin of a constant curve is layer 0
    assert "flat" in right.reason
    # A straight decreasing side has no curvature: Kneedle finds nothing and we say so.
    ramp = find_knee(list(range(7)), [0.5 - 0.05 * i for i in range(7)], "convex", "decreasing", "falling")
    assert ramp.layer is None and "found none" in ramp.reason


def test_endpoint_knee_is_rejected():
    layers, concave = list(range(7)), [0.5, 0.49, 0.47, 0.43, 0.35, 0.2, 0.05]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        raw = KneeLocator(layers, concave, curve="convex", direction="decreasing").knee
    assert raw == 0  # what kneed silently returns for the wrong curvature
    knee = find_knee(layers, concave, "convex", "decreasing", "falling")
    assert knee.layer is None and "endpoint layer 0" in knee.reason
    wrong = find_knee(list(range(7)), U_CURVE[:7], "concave", "decreasing", "falling")
    assert wrong.layer is None and "endpoint" in wrong.reason


# ------------------------------------------------------------------ windows and their ablation
def test_default_window_and_candidates():
    assert [default_window(n) for n in (6, 24, 28, 30)] == [2, 5, 6, 6]
    windows = candidate_windows((2, 26), 6, 4)
    assert windows == [(2, 8), (6, 12), (10, 16), (14, 20), (18, 24), (20, 26)]
    assert candidate_windows((0, 6), 2, 1) == [(0, 2), (1, 3), (2, 4), (3, 5), (4, 6)]


def test_split_texts_holds_out_every_fourth():
    rest, held = split_texts([str(i) for i in range(10)])
    assert held == ["3", "7"] and not set(held) & set(rest) and len(rest) == 8


def test_window_ablation_ranks_windows_by_damage(tiny_ro):
    model, tok = tiny_ro
    rows = guardrail_rows()[:8]
    windows = [(1, 3), (2, 4), (3, 5)]
    ranked = window_ablation(model, tok, windows, TEXTS[:4], rows, batch_size=4, progress=False)
    assert sorted(tuple(w["block"]) for w in ranked) == windows
    assert [w["rank"] for w in ranked] == [1, 2, 3]
    assert [w["damage"] for w in ranked] == sorted(w["damage"] for w in ranked)
    # Loop 1 is the base model: its loss equals the HF model's own next-token loss.
    enc = tok(TEXTS[:4], return_tensors="pt", padding=True)
    with torch.no_grad():
        logits = model(**enc, position_ids=position_ids(enc.attention_mask)).logits[:, :-1]
    mask = enc.attention_mask[:, 1:].bool() & enc.attention_mask[:, :-1].bool()
    hf_loss = torch.nn.functional.cross_entropy(logits[mask], enc.input_ids[:, 1:][mask]).item()
    for w in ranked:
        assert w["loss_loop1"] == pytest.approx(hf_loss, rel=1e-5)
        assert w["damage"] == pytest.approx(w["loss_increase"] / w["loss_loop1"] + w["accuracy_drop"])
        assert w["loss_loop2"] != w["loss_loop1"]  # applying the window twice changes something
    looped = retrofit(model, RetrofitConfig(Block(2, 4), max_loops=2))
    batches = [tok(TEXTS[:4], return_tensors="pt", padding=True)]
    loop2 = next(w for w in ranked if w["block"] == [2, 4])["loss_loop2"]
    assert next_token_loss(looped, batches, loops=2) == pytest.approx(loop2, rel=1e-6)


def test_select_block_windows_lie_inside_the_span(tiny_ro):
    model, tok = tiny_ro
    sel = select_block(model, tok, texts=TEXTS, window=2, rows=guardrail_rows()[:8], progress=False)
    assert isinstance(sel, BlockSelection)
    assert len(sel.angular_distance) == 6
    assert all(sel.prelude_end <= w["block"][0] and w["block"][1] <= sel.coda_start for w in sel.windows)
    assert all(w["block"][1] - w["block"][0] == 2 for w in sel.windows)
    assert list(sel.recommended) == sel.windows[0]["block"]
    for key in ("prelude_end", "coda_start"):
        assert sel.knees[key]["reason"]
    d = json.loads(sel.to_json())
    assert {"angular_distance", "prelude_end", "coda_start", "windows", "recommended", "knees"} <= set(d)
    curve = curve_frame(sel.to_dict())
    assert curve["region"].tolist().count("span") == sel.coda_start - sel.prelude_end
    assert curve["region"].tolist()[:sel.prelude_end] == ["prelude"] * sel.prelude_end
    windows = windows_frame(d)  # drawn from the JSON record, as the report draws it
    assert windows["a"].tolist() == [w["block"][0] for w in sel.windows] and windows["rank"].tolist()[0] == 1


def test_select_block_refuses_bad_options(tiny_ro):
    model, tok = tiny_ro
    with pytest.raises(WorkbenchError, match="window=0"):
        select_block(model, tok, texts=TEXTS, window=0, progress=False)
    with pytest.raises(WorkbenchError, match="does not fit the span"):
        select_block(model, tok, texts=TEXTS, window=7, rows=guardrail_rows()[:2], progress=False)
    with pytest.raises(WorkbenchError, match="task 'nope'"):
        select_block(model, tok, texts=TEXTS, task="nope", progress=False)


def test_resolve_block_given_and_auto(tiny_ro, monkeypatch):
    model, tok = tiny_ro
    assert resolve_block(model, tok, "2:5") == ((2, 5), {"source": "given", "block": [2, 5]})
    assert resolve_block(model, tok, (1, 3))[0] == (1, 3)
    with pytest.raises(WorkbenchError, match="auto"):
        resolve_block(model, tok, "middle")
    with pytest.raises(WorkbenchError, match="invalid"):
        resolve_block(model, tok, "4:9")
    # "auto" runs select_block with its defaults; a smaller corpus and task keep the test fast.
    monkeypatch.setattr(selection, "load_corpus", lambda path=None: TEXTS)
    monkeypatch.setattr(selection, "task_rows", lambda tokenizer, task="guardrail": guardrail_rows()[:4])
    block, record = resolve_block(model, tok, "auto")
    assert record["source"] == "auto" and record["block"] == list(block)
    assert list(block) == record["selection"]["windows"][0]["block"]


def test_load_corpus_builtin_and_file(tmp_path):
    texts = load_corpus()
    assert 80 <= len(texts) <= 150 and len(set(texts)) == len(texts)
    path = tmp_path / "c.txt"
    path.write_text("one\n\ntwo\nthree\nfour\n")
    assert load_corpus(path) == ["one", "two", "three", "four"]
    with pytest.raises(WorkbenchError, match="does not exist"):
        load_corpus(tmp_path / "missing.txt")


# ------------------------------------------------------------------ the command
def test_cli_writes_json_and_html_and_refuses_non_empty_out(tmp_path, monkeypatch):
    monkeypatch.setattr(selection, "task_rows", lambda tokenizer, task="guardrail": guardrail_rows()[:4])
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(TEXTS))
    app = typer.Typer()
    app.command()(select_block_command)
    out = tmp_path / "sel"
    args = ["--model", "tiny-llama", "--corpus", str(corpus), "--window", "2", "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    record = json.loads((out / SELECTION_JSON).read_text())
    assert record["model"] == "tiny-llama" and len(record["weights_sha256"]) == 64
    assert len(record["angular_distance"]) == 6 and record["recommended"] == record["windows"][0]["block"]
    html = (out / SELECTION_HTML).read_text()
    assert "plotly" in html.lower() and len(html) > 1_000_000  # plotly.js embedded: works offline
    assert "recommended block" in result.output
    again = CliRunner().invoke(app, args)
    assert isinstance(again.exception, WorkbenchError) and "not empty" in str(again.exception)
    assert CliRunner().invoke(app, args + ["--overwrite"]).exit_code == 0


@pytest.mark.slow
def test_smollm2_knees_near_2_and_26():
    model, tok = load_base("smollm2-135m-instruct")
    curve_texts, _ = split_texts(load_corpus())
    curve = angular_distances(model, tok, curve_texts[:48], progress=False)
    left, right = find_boundaries(curve)
    assert len(curve) == 30
    assert left.layer is not None and abs(left.layer - 2) <= 3, left.reason
    assert right.layer is not None and abs(right.layer - 26) <= 3, right.reason
    assert curve[0] > 0.4 and max(curve[5:20]) < 0.15  # steep encoder, flat middle


def test_the_trainer_is_handed_block_selection_for_auto(tmp_path, monkeypatch):
    """Training sits below block selection (Stage 2 trains): a recipe's block = "auto" is resolved by the chooser
    the caller hands in (`workbench train` and `workbench.train_recipe` hand Stage 1's `resolve_block`); a trainer
    handed none refuses "auto" in one line before it trains."""
    import tomli_w

    import workbench as wb
    import workbench.api
    from tests.training.conftest import TINY_RECIPE, merge
    from workbench.train.trainer import train

    recipe = tmp_path / "auto.toml"
    recipe.write_text(tomli_w.dumps(merge(TINY_RECIPE, {"model": {"block": "auto"},
                                                        "stages": [{"name": "a", "depths": [1], "steps": 1}]})))
    with pytest.raises(WorkbenchError, match="block = 'auto' needs block selection"):
        train(recipe, tmp_path / "refused", progress=False)
    asked = []

    def chooser(base, tok, block):
        asked.append(block)
        return (2, 4), {"source": "auto", "block": [2, 4], "selection": {"planted": True}}

    monkeypatch.setattr(workbench.api, "resolve_block", chooser)
    summary = wb.train_recipe(recipe, tmp_path / "run", progress=False)
    assert asked == ["auto"] and summary["finished"]
    record = json.loads((tmp_path / "run" / "retrofit.json").read_text())
    assert record["block_selection"]["selection"] == {"planted": True}
