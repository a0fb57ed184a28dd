"""The benchmarks: their cost model, timing helpers, and a smoke run of each on a tiny model."""

import importlib
import json
import math
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from workbench.loop.config import Block, RetrofitConfig

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def bench():
    """Imports benchmark modules by name (they import each other as top-level modules)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(BENCH))
        yield importlib.import_module


def _counted(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def test_layer_counts_of_the_embedded_split_and_the_papers(bench):
    flops = bench("flops")
    smollm = flops.Split(d=576, heads=9, kv_heads=3, head_dim=64, d_ff=1536, vocab=49152, n_layers=30, a=10, b=16)
    assert flops.layers_one_pass_read(smollm, 14) == 10 + 14 * 6 + 14 * 14 == 290
    assert flops.layers_reruns(smollm, 14) == sum(10 + 6 * t + 14 for t in range(1, 15)) == 966
    paper = flops.Split(d=896, heads=14, kv_heads=2, head_dim=64, d_ff=4864, vocab=151936, n_layers=24, a=6, b=18)
    for T in (1, 4, 8, 12):  # the retrofit paper: T loops cost (1 + T) / 2 of a base forward
        assert flops.layers_last_loop(paper, T) / paper.n_layers == (1 + T) / 2
    assert smollm.layer_params == 2 * 576 * 576 + 2 * 576 * 192 + 3 * 576 * 1536


def test_analytic_flops_equal_torch_flop_counter(bench, tiny):
    """The documented formula counts exactly the matmul FLOPs torch's own counter sees."""
    common, flops, training_step = bench("common"), bench("flops"), bench("training_step")
    from workbench.loop.surgery import retrofit

    looped = retrofit(tiny[0], RetrofitConfig(Block(1, 4)))
    ids, mask, cand = common.chase_inputs(tiny[1], 2)
    s, (rows, seq) = flops.split_of(looped), ids.shape
    every = torch.arange(seq).unsqueeze(0).expand(rows, -1)
    with torch.no_grad():
        assert _counted(lambda: looped.read(ids, mask, loops=4, candidates=cand)) == \
            flops.one_pass_read_flops(s, rows, seq, 4, len(cand))
        assert _counted(lambda: looped(ids, mask, loops=3)) == flops.forward_flops(s, rows, seq, 3)
        assert _counted(lambda: looped.read_final(ids, mask, loops=3, candidates=cand)) == \
            flops.last_loop_flops(s, rows, seq, 3, len(cand))
        assert _counted(lambda: looped.read(ids, mask, loops=2, positions=every)) == \
            flops.full_stack_flops(s, rows, seq, 2)
    batch, opt, params, clip = training_step.setup(looped, tiny[1], 2, 2, 8, 0)
    b, q = batch["input_ids"].shape
    looped.train()
    for loss, full in ((training_step.trainer_loss, False), (training_step.full_vocab_loss, True)):
        counted = _counted(lambda: training_step.step(loss, looped, batch, opt, params, clip))
        assert counted == flops.train_step_flops(s, b, q, 2, 8, full_vocab=full)


def test_interleave_alternates_and_discards_warmup(bench):
    common = bench("common")
    calls = []

    def busy():  # burns CPU, so CPU time is measurable
        calls.append("B")
        sum(i * i for i in range(200_000))

    times = common.interleave({"A": lambda: calls.append("A"), "B": busy}, reps=3, warmup=1, progress=False)
    assert calls == ["A", "B", "B", "A", "A", "B", "B", "A"]
    assert [len(v) for v in times.wall.values()] == [3, 3] and [len(v) for v in times.cpu.values()] == [3, 3]
    assert all(c > 0 for c in times.cpu["B"])
    # the ratio is taken round by round from what was recorded (which case is faster is the machine's to say)
    for clock in ("wall", "cpu"):
        recorded = getattr(times, clock)
        rounds = sorted(b / a for a, b in zip(recorded["A"], recorded["B"]))
        assert times.ratio("B", "A")[clock]["median"] == rounds[1]


def test_paired_ratio_is_per_round(bench):
    common = bench("common")
    s = common.paired_ratio({"x": [2.0, 6.0, 3.0], "y": [1.0, 2.0, 3.0]}, "x", "y")
    assert (s["median"], s["min"], s["max"], s["n"]) == (2.0, 1.0, 3.0, 3)
    assert s["spread"] == 1.0


def test_write_result_is_one_json_line_and_atomic(bench, tmp_path):
    common = bench("common")
    path = common.write_result("demo", {"x": 1.5, "nested": {"y": [1, 2]}}, tmp_path)
    path = common.write_result("demo", {"x": 2.5}, tmp_path)  # replaced, not appended
    text = path.read_text()
    assert text.count("\n") == 1 and json.loads(text) == {"x": 2.5}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo.json"]


def _positive(x) -> bool:
    return isinstance(x, float) and math.isfinite(x) and x > 0


TINY = ["--model", "tiny-llama", "--block", "1:4", "--reps", "1", "--warmup", "0", "--no-progress"]
SMOKE = {
    "forced_read": ["--rows", "2", "--loops", "3", "--styles", "last_loop,forward,read"],
    "readout_memory": ["--rows", "2", "--loops", "2"],
    "hook_overhead": ["--rows", "2", "--loops", "2"],
    "loop_cost": ["--rows", "2", "--max-t", "3"],
    "training_step": ["--batch", "3", "--depth", "3"],
    "cpu_efficiency": ["--rows", "2", "--loops", "2", "--batch", "2", "--depth", "2"],
    "precision": ["--batch", "2", "--depth", "2", "--read-rows", "2", "--read-loops", "2", "--mm-reps", "1"],
    "early_exit": ["--rows", "4", "--loops", "3", "--alphabet", "4"],
    "prompt_lens": ["--loops", "3"],
}


def _clocks(s: dict) -> list[float]:
    return [s["wall"]["median"], s["cpu"]["median"]]


def _ratios(name: str, r: dict) -> list[float]:
    if name == "forced_read":
        return [x for v in r["styles"].values() for x in _clocks(v["ratio"]) + [v["predicted"]["layers"]]]
    if name == "readout_memory":
        return [v for v in r["ratios"].values() if v is not None]
    if name == "hook_overhead":
        return [x for v in r["ratios"].values() for x in _clocks(v)]
    if name == "loop_cost":
        return [x for e in r["per_T"] for k in ("forward", "last_loop") for x in _clocks(e[k])]
    if name == "training_step":
        return _clocks(r["speedup"]) + [v["median"] for v in r["tokens_per_s"].values()]
    if name == "early_exit":
        return [x for v in r["ratio_to_fixed"].values() for x in _clocks(v)] + list(r["predicted_layers"].values())
    if name == "prompt_lens":
        return _clocks(r["ratio_per_loop_to_lens"]) + _clocks(r["times"]["lens_one_forward"])
    if name == "precision":
        return (_clocks(r["train_speedup"]) + _clocks(r["read_speedup"]) + list(r["achieved_gflops"].values())
                + [v for k, m in r["matmul"].items() if k != "weighted" for v in m["gflops"].values()])
    return [v["median"] for key in ("fraction", "fraction_cpu", "gflops", "gflops_cpu") for v in r[key].values()]


@pytest.fixture(scope="module")
def smoke(bench, tmp_path_factory):
    """Every benchmark's main run once on a tiny model with tiny sizes: (results dir, {name: record})."""
    out = tmp_path_factory.mktemp("bench")
    return out, {name: bench(name).main(TINY + args + ["--out", str(out)]) for name, args in SMOKE.items()}


@pytest.mark.parametrize("name", list(SMOKE))
def test_benchmark_runs_on_a_tiny_model(smoke, name):
    out, records = smoke
    rec = records[name]
    ratios = _ratios(name, rec["results"])
    assert ratios and all(_positive(float(x)) for x in ratios), ratios
    written = json.loads((out / f"{name}.json").read_text())
    assert written["results"] == json.loads(json.dumps(rec["results"]))
    assert written["command"].startswith(f".venv/bin/python benchmarks/{name}.py --model tiny-llama")
    r = rec["results"]
    if name == "forced_read":  # every rerun style computes the one-pass read's numbers
        assert all(v["max_abs_diff"] < 1e-4 for v in r["styles"].values())
        assert r["styles"]["last_loop"]["predicted"]["layers"] == (3 * 1 + 3 * 6 + 3 * 2) / (1 + 3 * 3 + 3 * 2)
    if name == "readout_memory":  # the stack holds seq x vocab floats per (row, loop); the read C
        assert r["ratios"]["output_bytes"] == r["seq"] * r["vocab"] / r["candidates"]
        assert r["full_stack"]["allocator_peak_bytes"] >= r["full_stack"]["output_bytes"]
    if name == "hook_overhead":
        assert r["cached_tensors"]["read_cached"] == 4 * 2 and r["cached_tensors"]["forward_cached"] == 3 * 2 + 1
    if name == "training_step":
        assert r["loss_check"]["trainer"] == pytest.approx(r["loss_check"]["full_vocab"], rel=1e-5)
    if name == "early_exit":  # who stops is fixed by hooks: the work done is known exactly
        assert r["row_loops"] == {"fixed": 4 * 3, "half_at_1": 2 * 1 + 2 * 3, "all_at_1": 4}
        a, k, c = r["split"]
        assert r["predicted_layers"]["all_at_1"] == pytest.approx((a + k + c) / (a + 3 * k + c))
    if name == "prompt_lens":  # the lens's last loop is the model's own output
        assert r["max_abs_diff_last_loop"] < 1e-5 and r["loops"] == 3
    if name == "precision":  # the same model in both precisions: the same loss up to bf16 rounding
        assert r["loss_check"]["bf16"] == pytest.approx(r["loss_check"]["fp32"], rel=0.05)
        assert r["step_flops"] > 0 and 0 < r["read_argmax_agreement"] <= 1


def test_table_lists_every_benchmark(bench, smoke):
    out, records = smoke
    text = bench("table").main([str(out)])
    assert (out / "TABLE.md").read_text() == text
    assert "not run" not in text
    forced = records["forced_read"]["results"]["styles"]["last_loop"]["ratio"]["wall"]
    assert f"{forced['median']:.2f}×" in text  # the table shows the measured ratio, not a stale one
    for name in SMOKE:
        assert records[name]["command"] in text


def _run(wall: float, losses: list[float], acc: float = 1.0, guard: int = 46) -> dict:
    cells = {"1": {"1": 1.0}, "2": {"1": 1.0, "2": acc}}
    return {"wall_s": wall, "losses": losses, "final_eval": cells, "guardrail": {"correct": guard, "total": 64}}


def test_compile_whole_run_rule_fails_the_policies_it_must(bench):
    """The whole-run rule (fixed before the run): 1.15x, loss windows and held-out cells; planted runs on each side."""
    cw = bench("compile_whole_run")
    losses = [0.5 + 0.1 * ((7 * i) % 5) for i in range(45)]           # 3 windows: 20, 20, 5 steps
    same = [x + 1e-3 for x in losses]

    def judge(eager: dict, compiled: dict) -> dict:
        return cw.verdict([{"eager": eager, "compiled": compiled}], per_depth=64)

    v = judge(_run(120.0, losses), _run(100.0, same))
    assert v["adopt"] and v["speedup"]["median"] == pytest.approx(1.2)
    assert v["windows_matched"] == [3, 3] and v["cells_matched"] == [3, 3]
    # "always adopt" fails on time alone: identical training, 1.10x
    v = judge(_run(110.0, losses), _run(100.0, same))
    assert not v["adopt"] and v["checks"] == {"time": False, "loss_curve": True, "held_out": True}
    # fast but training differently: a loss curve shifted by a window's spread, a cell off, the guardrail off
    assert not judge(_run(200.0, losses), _run(100.0, [x + 0.2 for x in losses]))["checks"]["loss_curve"]
    assert not judge(_run(200.0, losses), _run(100.0, same, acc=0.8))["checks"]["held_out"]
    assert not judge(_run(200.0, losses), _run(100.0, same, guard=30))["checks"]["held_out"]
    # the median of rounds decides, with each ratio taken within its round
    rounds = [{"eager": _run(e, losses), "compiled": _run(c, same)} for e, c in ((120, 100), (300, 200), (90, 100))]
    assert cw.verdict(rounds, 64)["speedup"]["median"] == pytest.approx(1.2)
    lo, hi = cw.wilson(64, 64)
    assert hi == 1.0 and lo == pytest.approx(0.9434, abs=1e-4)
    with pytest.raises(ValueError, match="logged 45 and 44"):
        cw.loss_windows(losses, same[:-1])


def test_the_committed_whole_run_verdict_is_its_rule_applied_to_its_rounds(bench):
    """benchmarks/results/compile_whole_run.json: the verdict the README quotes follows from the runs it records."""
    cw = bench("compile_whole_run")
    rec = json.loads((BENCH / "results" / "compile_whole_run.json").read_text())["results"]
    assert cw.verdict(rec["rounds"], per_depth=64) == rec["verdict"]
    assert not rec["verdict"]["adopt"] and round(rec["verdict"]["speedup"]["median"], 2) == 0.86
    assert all(r["compiled"]["recompile_limit_hit"] == 0 for r in rec["rounds"])
