"""Adaptive inference: rows stop where their halting head says, leave the batch, and the work is counted."""

import pytest
import torch

from tests.conftest import PROMPTS, perturb
from workbench.errors import WorkbenchError
from workbench.loop.config import Block, RetrofitConfig
from workbench.loop.halting import HaltPolicy, halt_depth
from workbench.loop.identity import base_logits
from workbench.loop.surgery import retrofit

T = 5


@pytest.fixture
def model(tiny, batch):
    """A perturbed inject + memory + halting retrofit (later loops differ from loop 1), with its base."""
    base, _ = tiny
    looped = retrofit(base, RetrofitConfig(Block(2, 4), reentry="inject", memory=True, halting=True, max_loops=T)).eval()
    perturb(looped.reentry, 0.5, seed=1)
    perturb(looped.memory, 0.05, seed=2)
    perturb(looped.halting, 0.5, seed=3)
    return looped, base


def _split_tau(looped, batch) -> tuple[float, torch.Tensor]:
    """A tau between the continue probabilities of the batch, so some rows stop early and some do not."""
    with torch.no_grad():
        probs = looped.read(batch.input_ids, batch.attention_mask, loops=T).halt_probs   # [b, T]
    values = probs[:, :-1].flatten().sort().values
    return float((values[len(values) // 2 - 1] + values[len(values) // 2]) / 2), probs


def test_a_policy_that_never_stops_early_is_bit_identical_to_the_fixed_depth_read(model, batch):
    looped, _ = model
    cand = torch.arange(50, 70)
    with torch.no_grad():
        fixed = looped.read(batch.input_ids, batch.attention_mask, loops=T, candidates=cand)
        out = looped.adaptive_read(batch.input_ids, batch.attention_mask, policy=HaltPolicy(tau=0.0), candidates=cand)
    assert torch.equal(out.scores, fixed.scores[:, -1])                      # bit for bit, not allclose
    assert out.loops_used.tolist() == [T] * len(PROMPTS) and out.row_loops == len(PROMPTS) * T
    assert torch.equal(out.halt_probs, fixed.halt_probs)


def test_stopping_every_row_at_loop_one_is_the_base_model_exactly(model, batch):
    looped, base = model
    every = torch.arange(batch.input_ids.shape[1]).expand(len(PROMPTS), -1)
    with torch.no_grad():
        out = looped.adaptive_read(batch.input_ids, batch.attention_mask, policy=HaltPolicy(tau=1.0), positions=every)
    ref = base_logits(base, batch.input_ids, batch.attention_mask)
    real = batch.attention_mask.bool()
    assert (out.scores - ref).abs()[real].max().item() == 0.0                 # max |dlogit| = 0.0
    assert out.loops_used.tolist() == [1, 1, 1] and out.row_loops == 3
    assert torch.isnan(out.halt_probs[:, 1:]).all()                          # nothing ran past loop 1


def test_rows_stop_at_the_heads_depth_and_leave_the_batch(model, batch):
    looped, _ = model
    tau, probs = _split_tau(looped, batch)
    expected = halt_depth(probs, tau, t_min=2)
    assert len(set(expected.tolist())) > 1, expected                          # the test needs a mix of depths
    with torch.no_grad():
        fixed = looped.read(batch.input_ids, batch.attention_mask, loops=T, candidates=torch.arange(50, 70))
    running = []                                                             # rows through the block, per loop
    for t in range(1, T + 1):
        looped.loop[str(t)].hook_state.add_hook(lambda x, hook: running.append(x.shape[0]))
    with torch.no_grad():
        out = looped.adaptive_read(batch.input_ids, batch.attention_mask, policy=HaltPolicy(tau=tau, min_loops=2),
                                   candidates=torch.arange(50, 70))
    looped.reset_hooks()
    assert out.loops_used.tolist() == expected.tolist()
    assert sum(running) == out.row_loops == int(expected.sum()) < len(PROMPTS) * T
    assert running == [int((expected >= t).sum()) for t in range(1, int(expected.max()) + 1)]
    for i, t in enumerate(expected.tolist()):                                # each row read at its own loop
        torch.testing.assert_close(out.scores[i], fixed.scores[i, t - 1], rtol=1e-5, atol=1e-5)
        assert torch.isnan(out.halt_probs[i, t:]).all() and not torch.isnan(out.halt_probs[i, :t]).any()


def test_loops_used_is_a_hook_point_that_reads_and_patches(model, batch):
    looped, _ = model
    seen = []

    def patch(x, hook):
        seen.append(x.clone())
        return x + 100

    looped.hook_loops_used.add_hook(patch)
    with torch.no_grad():
        out = looped.adaptive_read(batch.input_ids, batch.attention_mask, policy=HaltPolicy(tau=0.0, max_loops=2))
    looped.reset_hooks()
    assert seen[0].tolist() == [2, 2, 2] and out.loops_used.tolist() == [102, 102, 102]
    assert "hook_loops_used" in looped.hook_dict


def test_adaptive_errors_name_what_was_given(model, batch, tiny):
    looped, _ = model
    with pytest.raises(WorkbenchError, match=r"tau=1.5 must be a number in \[0, 1\]"):
        HaltPolicy(tau=1.5)
    with pytest.raises(WorkbenchError, match="min_loops=3, max_loops=2"):
        HaltPolicy(tau=0.5, min_loops=3, max_loops=2)
    with pytest.raises(WorkbenchError, match="loops=9 is outside 1..5"):
        looped.adaptive_read(batch.input_ids, batch.attention_mask, policy=HaltPolicy(tau=0.5, max_loops=9))
    plain = retrofit(tiny[0], RetrofitConfig(Block(2, 4), max_loops=3))
    with pytest.raises(WorkbenchError, match="needs a halting head"):
        plain.adaptive_read(batch.input_ids, batch.attention_mask, policy=HaltPolicy(tau=0.5))


def test_early_exit_benchmark_counts_the_work_saved_and_times_it_in_one_run(monkeypatch):
    import importlib
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    bench = importlib.import_module("early_exit")
    common = importlib.import_module("common")
    looped, tok = common.load_looped("tiny-llama", "2:4", max_loops=8, reentry="inject", memory=True, halting=True)
    ids, mask, cand = common.chase_inputs(tok, 4)
    rows_through = []  # rows each decoder layer ran on, call by call: the work the timings stand for
    hooks = [layer.register_forward_hook(lambda m, args, out: rows_through.append(args[0].shape[0]))
             for layer in looped.layers]
    try:
        r = bench.run(looped, ids, mask, cand, loops=8, reps=1, warmup=0, progress=False)
    finally:
        for h in hooks:
            h.remove()
    assert r["row_loops"] == {"fixed": 32, "half_at_1": 2 * 1 + 2 * 8, "all_at_1": 4}
    assert r["predicted_layers"]["all_at_1"] == pytest.approx(6 / 20)       # (2 + 2 + 2) / (2 + 8 * 2 + 2)
    # the layer model the ratios are compared with is the work done: each case ran twice (its count, one round),
    # a stopped row left the batch (no later loop, one Coda); the time ratios themselves are the benchmark's table
    fixed = 4 * (2 + 8 * 2 + 2)
    assert sum(rows_through) == 2 * fixed * (1 + sum(r["predicted_layers"].values()))
    assert set(r["ratio_to_fixed"]) == {"half_at_1", "all_at_1"}


def test_read_final_is_the_last_loop_of_read_and_runs_the_coda_once(model, batch):
    """The forced-depth call (latency's path): loop T's scores bit for bit, the Coda's readout hook hit once."""
    looped, _ = model
    cand = torch.arange(50, 70)
    hits = []
    for t in range(1, T + 1):
        looped.loop[str(t)].hook_readout.add_hook(lambda x, hook: hits.append(hook.name))
    with torch.no_grad():
        fixed = looped.read(batch.input_ids, batch.attention_mask, loops=T, candidates=cand)
        n_read = len(hits)
        final = looped.read_final(batch.input_ids, batch.attention_mask, loops=T, candidates=cand)
    looped.reset_hooks()
    assert torch.equal(final, fixed.scores[:, -1])
    assert n_read == T and hits[n_read:] == [f"loop.{T}.hook_readout"]
