"""patching, attribution and paths: the corrupted twins, the exact grid against a planted mechanism, the gradient
map's agreement (and its flagged failures on a saturating and on a cancelling one), the suffix-on-a-cache shortcut
against the whole recomputation, and the paths' reading of a model that carries its answer and one that makes it at the last loop.

The planted models are a fresh tiny-llama retrofit (block 2:4, re-entry the identity at init) with every
attention and MLP output projection zeroed, so each layer passes its input through, and one permanent hook that
writes into the read position's MLP output at (loop, layer) a function of the sum over positions of that layer's
input: the only path from the edited tokens to the answer. Such a hook sums the whole sequence it is handed, so
it is not a causal model under a KV cache: the planted tests recompute whole prompts (`prefix_cache` off), and the
cache shortcut is checked on the unplanted model, where it must give the same numbers.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from workbench.analysis.headlines.attribution import NOT_COMPARABLE
from workbench.errors import WorkbenchError
from workbench.loop.config import Block, RetrofitConfig
from workbench.loop.hooks import hook_name
from workbench.loop.surgery import retrofit
from workbench.models import load_base
from workbench.probes import NotApplicable, attribution, patching, paths

DEPTH = 3


@pytest.fixture(scope="module")
def chase3(rows):
    return [r for r in rows if r["depth"] == DEPTH][:3]


def fresh(zero: bool):
    model, tok = load_base("tiny-llama")
    looped = retrofit(model, RetrofitConfig(Block(2, 4), max_loops=8)).eval()
    for p in looped.parameters():
        p.requires_grad_(False)
    if zero:
        with torch.no_grad():
            for layer in looped.layers:
                layer.self_attn.o_proj.weight.zero_()
                layer.mlp.down_proj.weight.zero_()
    return looped, tok


def plant(model, loop: int, layer: int, write, positions=None):
    """A permanent hook: loop `loop`'s MLP output of `layer` gains write(sum over positions of the layer's input)
    at the last position (over `positions` only, when given). The input is what the layer itself receives (a torch
    pre-hook on the layer, so a patch at the hook point before it is seen); the layer runs once per loop, and its
    MLP right after its input."""
    seen = {}

    def keep(module, args, kwargs):
        x = args[0] if args else kwargs["hidden_states"]
        seen["x"] = x if positions is None else x[:, positions]

    def add(x, hook):
        x = x.clone()
        x[:, -1] = x[:, -1] + write(seen["x"].sum(1))
        return x

    model.layers[layer].register_forward_pre_hook(keep, with_kwargs=True)
    model.add_hook(hook_name("mlp_out", loop, layer), add, is_permanent=True)
    return model


def linear_write(d: int, seed: int = 0, scale: float = 2.0):
    g = torch.Generator().manual_seed(seed)
    M = torch.randn(d, d, generator=g) * scale / d ** 0.5
    return lambda s: s @ M.to(s.dtype)


@pytest.fixture()
def no_cache(monkeypatch):
    monkeypatch.setattr(patching, "prefix_cache", lambda model: False)


def test_twins_change_one_fact_and_keep_the_token_layout(tok, chase3):
    pairs, skipped = patching.corrupt_pairs(tok, chase3, seed=0)
    assert skipped == 0 and len(pairs) == 2 * len(chase3)
    for p in pairs:
        clean, bad = p.clean_ids[0].tolist(), p.corrupt_ids[0].tolist()
        assert len(clean) == len(bad) and p.corrupted_answer != p.row["answer"]
        differ = [i for i, (a, b) in enumerate(zip(clean, bad)) if a != b]
        assert differ and set(differ) <= set(p.positions["edited"])
        every = sorted(i for v in p.positions.values() for i in v)
        assert every == list(range(len(clean)))                    # the classes partition the prompt
        assert p.positions["read"] == [len(clean) - 1]
        if p.corruption == "entry":
            # the edited line is the one loop `step` reads: key x_{step-1}
            x = p.row["start"]
            for _ in range(p.step - 1):
                x = p.row["table"][x]
            assert p.edited.startswith(f"{x} -> ") and p.corrupted_chain[:p.step - 1] == p.row["chain"][:p.step - 1]
            assert p.corrupted_chain[p.step - 1] != p.row["chain"][p.step - 1]
        else:
            assert p.step == 0 and p.positions["start"] == []
    assert sorted(p.step for p in pairs if p.corruption == "entry") == [1, 2, 3]   # steps cycle over the rows


def test_the_suffix_on_a_cache_equals_recomputing_the_prompt(tok, chase3):
    model, _ = fresh(zero=False)
    pairs, _ = patching.corrupt_pairs(tok, chase3[:1])
    cells = patching.grid_cells(DEPTH, [2, 3], list(patching.COMPONENTS))
    for pair in pairs:
        clean = patching.clean_activations(model, pair, DEPTH, cells)
        for position in ("edited", "question", "read"):
            fast = patching.exact_cells(model, pair, DEPTH, cells, position, clean, batch_size=7)
            slow = patching.exact_cells(model, pair, DEPTH, cells, position, clean, use_prefix=False)
            assert np.abs(fast - slow).max() < 1e-4, position
            # and both are the patch itself: each cell recomputed by hand, one prompt, one hook, no replicas
            by_hand = np.array([patched_by_hand(model, pair, clean, cell, position) for cell in cells])
            assert np.abs(fast - by_hand).max() < 1e-4, position
            if position == "edited":  # the patches carry the edit: some cell moves the margin past the tolerance
                assert np.abs(by_hand - patching.margins(model, pair.corrupt_ids, pair, DEPTH)).max() > 2e-4


def patched_by_hand(model, pair, clean: dict, cell, position: str) -> float:
    """LD of the corrupted prompt with the clean activation of `cell` (loop, layer, component) written at the tokens
    of `position`: the whole prompt run once through the model's own hooks."""
    t, i, c = cell
    name, at = patching.site(c, t, i), pair.positions[position]

    def write(x, hook):
        x = x.clone()
        x[0, at] = clean[name][at].to(x.dtype)
        return x

    with torch.no_grad(), model.hooks(fwd_hooks=[(name, write)]):
        return patching.margins(model, pair.corrupt_ids, pair, DEPTH)


def test_the_exact_grid_finds_the_planted_write(tok, chase3, no_cache):
    model, _ = fresh(zero=True)
    plant(model, DEPTH, 3, linear_write(model.config.hidden_size))
    tables = patching.run(model, tok, chase3)
    g = tables["patching__grid"].set_index(["corruption", "loop", "layer", "position", "component"])["recovered"]
    for corruption in ("entry", "start"):
        assert g[(corruption, DEPTH, 3, "read", "mlp")] == pytest.approx(1.0, abs=1e-4)
        others = g.loc[corruption].drop((DEPTH, 3, "read", "mlp"))
        parts = others.reset_index()
        assert parts[parts["component"] != "resid"]["recovered"].abs().max() < 1e-4   # no other attn / MLP cell
        assert g[(corruption, DEPTH, 2, "edited", "resid")] == pytest.approx(1.0, abs=1e-4)   # the write's input
        assert g[(corruption, DEPTH, 3, "read", "resid")] == pytest.approx(1.0, abs=1e-4)     # and its output
        assert abs(g[(corruption, DEPTH, 3, "edited", "resid")]) < 1e-4                      # after it was read
        assert parts[(parts["position"].isin(["entries", "question"]))]["recovered"].abs().max() < 1e-4
    steps = tables["patching__steps"].set_index(["step", "loop"])["recovered"]
    assert all(abs(steps[(k, t)]) < 1e-4 for k in (1, 2, 3) for t in (1, 2))   # the edit reaches the read position
    assert patching.first_recovering(tables["patching__steps"]) == {1: 3, 2: 3, 3: 3}   # only at loop 3
    line = patching.headline(tables)
    assert line["steps_at_their_loop"].value == 1 and line["steps_at_their_loop"].n == 3   # step 3 only: fails
    assert "mlp output of layer 3 at loop 3 (read positions)" in line.sentence


def test_the_steps_table_finds_each_step_at_the_loop_that_reads_it(tok, chase3, no_cache):
    """A planted lookup that enters step by step: loop t writes into the read position a function of the tokens of
    the table line step t reads (one row, so its lines lie at fixed positions). An entry edited at step k then
    first reaches the read position's state at loop k: patching that state with the clean one recovers none of the
    margin before loop k and all of it from loop k on; the headline counts the three steps at their loops."""
    rows = [chase3[0]] * DEPTH                           # one row, its entry edited at steps 1, 2, 3 in turn
    pairs, _ = patching.corrupt_pairs(tok, rows, corruptions=("entry",))
    lines = {p.step: p.positions["edited"] for p in pairs}
    assert sorted(lines) == [1, 2, 3]
    model, _ = fresh(zero=True)
    for t in (1, 2, 3):
        plant(model, t, 3, linear_write(model.config.hidden_size, seed=t), positions=lines[t])
    tables = patching.run(model, tok, rows, corruptions=("entry",))
    steps = tables["patching__steps"].set_index(["step", "loop"])["recovered"]
    for k in (1, 2, 3):
        for t in (1, 2, 3):
            assert steps[(k, t)] == pytest.approx(1.0 if t >= k else 0.0, abs=1e-4), (k, t)
    assert patching.first_recovering(tables["patching__steps"]) == {1: 1, 2: 2, 3: 3}
    line = patching.headline(tables)
    assert line["steps_at_their_loop"].value == 3 and line["steps_at_their_loop"].n == 3


def test_the_gradient_map_agrees_on_a_linear_write_and_is_flagged_on_a_saturated_one(tok, chase3, no_cache):
    model, _ = fresh(zero=True)
    d = model.config.hidden_size
    plant(model, DEPTH, 3, linear_write(d, scale=0.5))
    tables = attribution.run(model, tok, chase3, corruptions=("entry",), check_pairs=3)
    check = tables["attribution__check"].set_index(["loop", "layer", "position", "component"])
    assert check.loc[(DEPTH, 3, "read", "mlp"), "exact"] == pytest.approx(1.0, abs=1e-4)
    assert check.loc[(DEPTH, 3, "read", "mlp"), "gradient"] == pytest.approx(1.0, abs=0.15)
    best = check[check.index.get_level_values("component") != "resid"]
    assert best["gradient"].abs().idxmax() == (DEPTH, 3, "read", "mlp")          # the mass where it was planted
    # The whole effect runs through 7 of the 90 cells (the edited tokens' residual up to the write, the write and the
    # residual after it), all near 1: too few to rank, so the trust rule (issue 58) reads the table not comparable.
    linear = tables["attribution__agreement"].set_index("component").loc["all"]
    assert (linear["verdict"], linear["cleared"]) == (NOT_COMPARABLE, 7) and linear["sign_share"] == 1.0

    # Saturation: on one pair, the write is 20 u tanh(200 v . (s - m)), m the midpoint of the pair's clean and
    # corrupted sums and v their direction: full strength either way, flat at both runs. The patch flips the
    # answer; the gradient upstream of the tanh (the layer's input at the edited tokens) says nothing. The
    # agreement headline must not trust the map.
    model, _ = fresh(zero=True)
    pair = patching.corrupt_pairs(tok, chase3[:1], corruptions=("entry",))[0][0]
    clean_sum, corrupt_sum = (layer_input_sum(model, ids, pair, DEPTH, 3) for ids in (pair.clean_ids, pair.corrupt_ids))
    middle, v = (clean_sum + corrupt_sum) / 2, (clean_sum - corrupt_sum) / (clean_sum - corrupt_sum).norm()
    u = torch.randn(d, generator=torch.Generator().manual_seed(1))
    plant(model, DEPTH, 3, lambda s: 20 * torch.tanh(200 * ((s - middle.to(s.dtype)) @ v.to(s.dtype)))[..., None] * u)
    tables = attribution.run(model, tok, chase3[:1], corruptions=("entry",), check_pairs=1)
    check = tables["attribution__check"].set_index(["loop", "layer", "position", "component"])
    assert check.loc[(DEPTH, 3, "read", "mlp"), "exact"] == pytest.approx(1.0, abs=1e-4)
    upstream = check.loc[(DEPTH, 2, "edited", "resid")]
    assert upstream["exact"] == pytest.approx(1.0, abs=1e-4) and abs(upstream["gradient"]) < 1e-3
    verdict = tables["attribution__agreement"].set_index("component").loc["all"]
    assert not verdict["trusted"] and verdict["verdict"] == NOT_COMPARABLE
    assert "can be trusted" not in attribution.headline(tables).sentence


def test_the_gradient_map_is_flagged_where_two_contributions_cancel(tok, chase3, no_cache):
    """Cancellation (AtP's other failure, Kramar et al. 2024): the planted write is c u (x - sin x), x the
    layer input's coordinate along the pair's difference, 0 at the corrupted run and pi at the clean one. Its
    two terms' slopes cancel where the gradient is taken (1 - cos 0 = 0) while the patch moves the write by
    c u pi: the exact grid recovers the whole margin through the cell upstream and the gradient map none of it.
    The agreement headline must not trust the map."""
    model, _ = fresh(zero=True)
    d = model.config.hidden_size
    pair = patching.corrupt_pairs(tok, chase3[:1], corruptions=("entry",))[0][0]
    clean_sum, corrupt_sum = (layer_input_sum(model, ids, pair, DEPTH, 3) for ids in (pair.clean_ids, pair.corrupt_ids))
    diff = clean_sum - corrupt_sum
    v, k = diff / diff.norm(), torch.pi / diff.norm()
    u = torch.randn(d, generator=torch.Generator().manual_seed(2))

    def write(s):
        x = k.to(s.dtype) * ((s - corrupt_sum.to(s.dtype)) @ v.to(s.dtype))
        return 10 * (x - torch.sin(x))[..., None] * u.to(s.dtype)

    plant(model, DEPTH, 3, write)
    tables = attribution.run(model, tok, chase3[:1], corruptions=("entry",), check_pairs=1)
    check = tables["attribution__check"].set_index(["loop", "layer", "position", "component"])
    upstream = check.loc[(DEPTH, 2, "edited", "resid")]
    assert upstream["exact"] == pytest.approx(1.0, abs=1e-3) and abs(upstream["gradient"]) < 1e-3
    verdict = tables["attribution__agreement"].set_index("component").loc["all"]
    assert not verdict["trusted"] and verdict["verdict"] == NOT_COMPARABLE
    assert "can be trusted" not in attribution.headline(tables).sentence


def layer_input_sum(model, ids, pair, loop: int, layer: int) -> torch.Tensor:
    """The sum over positions of block layer `layer`'s input at `loop` (what `plant`'s write reads), [d]."""
    name = hook_name("input", loop) if layer == model.a else hook_name("block_resid", loop, layer - 1)
    acts = patching.clean_activations(model, patching.Pair(**{**pair.__dict__, "clean_ids": ids}), loop,
                                      [(loop, layer - 1, "resid")] if layer > model.a else [])
    return acts[name].sum(0) if name in acts else None


def test_paths_tell_a_carried_answer_from_one_made_at_the_last_loop(tok, chase3):
    """One start-corrupted pair; the write is M (s - s_corrupted), so the corrupted run writes nothing and the clean
    run writes M delta: written at loop 1 and carried (re-entry is the identity), or written at the last loop."""
    read = {}
    for name, loop in (("carried", 1), ("made", DEPTH)):
        model, _ = fresh(zero=True)
        pair = patching.corrupt_pairs(tok, chase3[:1], corruptions=("start",))[0][0]
        base = layer_input_sum(model, pair.corrupt_ids, pair, loop, 3)
        M = linear_write(model.config.hidden_size)
        plant(model, loop, 3, lambda s, base=base, M=M: M(s - base.to(s.dtype)))
        tables = paths.run(model, tok, chase3[:1], corruptions=("start",))
        routes = tables["paths__routes"].set_index(["route", "source", "read"])["recovered"]
        read[name] = paths.reading(tables["paths__routes"])
        assert routes[("loops", 1, DEPTH)] == pytest.approx(1.0, abs=1e-4)
        assert routes[("readout", 1, DEPTH)] == pytest.approx(1.0 if name == "carried" else 0.0, abs=1e-4)
    assert read["carried"] == {("start", 1): "read at the end", ("start", 2): "read at the end"}
    assert read["made"] == {("start", 1): "iterated", ("start", 2): "iterated"}


def test_rows_without_a_table_and_bad_options_are_refused(tok, chase3):
    model, _ = fresh(zero=False)
    user = [{"row_id": "u1", "prompt": "The capital of France is", "answer": "Paris", "symbols": ["Paris", "Rome"],
             "depth": 0, "task": "user"}]
    for probe in (patching, attribution, paths):
        with pytest.raises(NotApplicable, match="needs a corrupted twin: a function-table row whose one fact it corrupts"):
            probe.run(model, tok, user)
    with pytest.raises(WorkbenchError, match="not a block layer; accepted: 2..3"):
        patching.run(model, tok, chase3, layers=[5])
    with pytest.raises(WorkbenchError, match="component 'ffn' is unknown"):
        patching.run(model, tok, chase3, components=["ffn"])
    with pytest.raises(WorkbenchError, match="position class 'middle' is unknown"):
        attribution.run(model, tok, chase3, positions=["middle"])
    with pytest.raises(WorkbenchError, match="corruption 'table' is unknown"):
        patching.run(model, tok, chase3, corruptions=["table"])
    with pytest.raises(WorkbenchError, match="route 'skip' is unknown"):
        paths.run(model, tok, chase3, routes=["skip"])
    with pytest.raises(WorkbenchError, match="check_pairs must be a non-negative integer"):
        attribution.run(model, tok, chase3, check_pairs=-1)


def test_a_users_rows_with_their_own_twins_are_patched(tok, no_cache):
    """Rows from a file that give `corrupt` (workbench rows --from): the twins are taken as given, the classes are
    the tokens that differ, the rest, and the read position; on the planted model (the write at loop 2, layer 3)
    the grid finds the write, its input at the edited tokens, and nothing at the tokens the twins share."""
    from workbench.tasks.user import check_user_rows

    model, _ = fresh(zero=True)
    plant(model, 2, 3, linear_write(model.config.hidden_size))
    raw = [{"prompt": f"The capital of {a} is", "answer": x, "corrupt": {"prompt": f"The capital of {b} is", "answer": y}}
           for (a, x), (b, y) in [(("France", "Paris"), ("Italy", "Rome")), (("Spain", "Madrid"), ("Japan", "Tokyo"))]]
    rows, meta = check_user_rows(list(enumerate(raw, 1)), tok, "test")
    assert rows[0]["corrupt"] == raw[0]["corrupt"] and sorted(rows[0]["symbols"]) == ["Madrid", "Paris", "Rome", "Tokyo"]
    tables = patching.run(model, tok, rows, loops=2)
    g = tables["patching__grid"]
    assert set(g["corruption"]) == {"user"} and set(g["position"]) == {"edited", "other", "read"}
    cell = g.set_index(["loop", "layer", "position", "component"])["recovered"]
    assert cell[(2, 3, "read", "mlp")] == pytest.approx(1.0, abs=1e-4)
    assert cell[(2, 2, "edited", "resid")] == pytest.approx(1.0, abs=1e-4)
    assert g[g["position"] == "other"]["recovered"].abs().max() < 1e-4        # the same tokens in both twins
    assert set(tables["patching__pairs"]["edited"]) == {"the row's corrupt prompt"}
    routes = paths.run(model, tok, rows, loops=2)["paths__routes"]
    assert set(routes["read"]) == {2}                                        # no chain: the last loop only
