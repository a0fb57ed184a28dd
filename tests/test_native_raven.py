"""The Raven family (Huginn-0125's format) against the reference's own committed numbers.

tests/fixtures/raven holds a tiny checkpoint in the hub's layout and what the reference modeling code
(seal-rg/recurrent-pretraining at 59e0b69, run unmodified in a scratch environment) computed on it: logits at
1, 2, 4, 8, 32 steps and the default, every step's state, the Prelude's output, the adapter's input and output
(README.md there says how). Nothing here imports the reference; the workbench side is `load_looped(dir)`.
"""

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from tests.test_benchmarks import bench  # noqa: F401  (the fixture)
from tests.test_cli_errors import assert_clean_error, invoke
from tests.test_native_cli import MANIFEST
from workbench.errors import WorkbenchError
from workbench.generation import generate
from workbench.loop.hooks import hook_name
from workbench.models import load_looped
from workbench.models.native.raven_exits import CRITERIA, DEFAULTS, ZeroShotExit, exit_steps, zero_shot_read
from workbench.probes import exit_rules
from workbench.probes.common import split_rows
from workbench.tasks import build_rows

FIXTURE = Path(__file__).parent / "fixtures" / "raven"
CHECKPOINT = FIXTURE / "checkpoint"
STEPS = (1, 2, 4, 8, 32)
BF16_TOLERANCE = 0.1  # max |Δlogit| of the bf16 load against the reference fp32 logits (seen: 0.029; logits within ±2.2)


@pytest.fixture(scope="module")
def ref():
    return load_file(FIXTURE / "reference.safetensors")


@pytest.fixture(scope="module")
def raven():
    return load_looped(CHECKPOINT)


def _diff(a, b) -> float:
    return float((a.float() - b.float()).abs().max())


@pytest.mark.parametrize("prompt", ["a", "b"])
def test_logits_at_every_step_count_equal_the_reference(raven, ref, prompt):
    looped, _ = raven
    ids, s0 = ref[f"{prompt}.ids"], ref[f"{prompt}.s0"]
    with torch.no_grad():
        for k in STEPS:
            assert _diff(looped(ids, loops=k, init_state=s0).logits, ref[f"{prompt}.logits.{k}"]) <= 1e-5, k
        assert looped.native_loops == 32
        assert _diff(looped(ids, init_state=s0).logits, ref[f"{prompt}.logits.default"]) <= 1e-5


def test_every_step_and_the_family_sites_equal_the_reference(raven, ref):
    looped, _ = raven
    ids, s0 = ref["a.ids"], ref["a.s0"]
    names = [hook_name("state", t) for t in range(1, 33)] + ["hook_prelude", "hook_init_state"]
    names += [f"loop.{t}.adapter.hook_{io}" for t in range(1, 5) for io in ("in", "out")]
    with torch.no_grad():
        _, cache = looped.run_with_cache(ids, loops=32, init_state=s0, names_filter=names)
    states = torch.cat([cache[hook_name("state", t)] for t in range(1, 33)])
    assert _diff(states, ref["a.states"]) <= 1e-5
    assert _diff(cache["hook_prelude"], ref["a.prelude"]) <= 1e-5
    assert torch.equal(cache["hook_init_state"], s0)
    for io in ("in", "out"):
        got = torch.cat([cache[f"loop.{t}.adapter.hook_{io}"] for t in range(1, 5)])
        assert _diff(got, ref[f"a.adapter_{io}"]) <= 1e-5, io
    assert _diff(looped.final_norm(states[-1:]), ref["a.latent"]) <= 1e-5


def test_read_decodes_every_step_as_the_reference_at_that_step_count(raven, ref):
    looped, _ = raven
    ids, s0 = ref["a.ids"], ref["a.s0"]
    with torch.no_grad():
        scores = looped.read(ids, loops=32, init_state=s0, positions=torch.arange(7)[None]).scores
    for k in STEPS:
        assert _diff(scores[0, k - 1], ref[f"a.logits.{k}"][0]) <= 1e-5, k


def test_a_left_padded_batch_reads_each_row_as_its_own_unpadded_reference(raven, ref):
    looped, tok = raven
    a, b = ref["a.ids"], ref["b.ids"]
    pad = a.shape[1] - b.shape[1]
    ids = torch.cat([a, torch.cat([torch.full((1, pad), tok.pad_token_id), b], dim=1)])
    mask = torch.cat([torch.ones_like(a), torch.cat([torch.zeros(1, pad, dtype=torch.long),
                                                     torch.ones_like(b)], dim=1)])
    s0 = torch.cat([ref["a.s0"], torch.cat([torch.zeros(1, pad, 32), ref["b.s0"]], dim=1)])
    with torch.no_grad():
        for k in (1, 8, 32):
            logits = looped(ids, attention_mask=mask, loops=k, init_state=s0).logits
            assert _diff(logits[0], ref[f"a.logits.{k}"][0]) <= 1e-5
            assert _diff(logits[1, pad:], ref[f"b.logits.{k}"][0]) <= 1e-5


def test_bf16_stays_within_the_stated_tolerance_of_the_fp32_reference(ref):
    looped, _ = load_looped(CHECKPOINT, dtype=torch.bfloat16)
    assert looped.base.transformer.wte.weight.dtype == torch.bfloat16
    with torch.no_grad():
        for k in (1, 8, 32):
            got = looped(ref["a.ids"], loops=k, init_state=ref["a.s0"]).logits
            assert got.dtype == torch.bfloat16
            assert _diff(got, ref[f"a.logits.{k}"]) <= BF16_TOLERANCE, k


def test_the_initial_state_is_seeded_per_position(raven, ref):
    looped, _ = raven
    ids = ref["a.ids"]
    with torch.no_grad():
        first = looped(ids, loops=4).logits
        assert torch.equal(first, looped(ids, loops=4).logits)          # two reads of a prompt agree
        assert torch.equal(first, looped(ids, loops=4, init_seed=0).logits)
        other = looped(ids, loops=4, init_seed=7).logits
        assert _diff(first, other) > 1e-3                                 # the seed is the state's
        _, cache = looped.run_with_cache(ids, loops=1, init_seed=7, names_filter="hook_init_state")
        s0 = cache["hook_init_state"]
        assert torch.equal(looped(ids, loops=4, init_state=s0).logits, other)
        # s_0 at a position does not depend on what comes after it (each position has its own generator)
        _, short = looped.run_with_cache(ids[:, :3], loops=1, init_seed=7, names_filter="hook_init_state")
        assert torch.equal(short["hook_init_state"], s0[:, :3])
    std = (2 / 5) ** 0.5  # sqrt(d) * sqrt(2 / (5 d)); truncated at 3 std
    assert s0.abs().max() <= 3 * std and 0.5 * std < s0.std() < 1.5 * std


def test_a_weights_only_directory_loads_with_no_tokenizer_and_code_is_never_imported(tmp_path, ref, caplog):
    bare = tmp_path / "weights-only"
    bare.mkdir()
    for f in CHECKPOINT.iterdir():
        if f.suffix in (".safetensors", ".json") and not f.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(f, bare / f.name)
    (bare / "raven_modeling_minimal.py").write_text("raise SystemExit('the directory code ran')\n")
    with caplog.at_level(logging.WARNING):
        looped, tok = load_looped(bare)
    assert tok is None
    assert any("never imports" in r.getMessage() for r in caplog.records)
    with torch.no_grad():
        assert _diff(looped(ref["b.ids"], loops=2, init_state=ref["b.s0"]).logits, ref["b.logits.2"]) <= 1e-5


def _copy(tmp_path) -> Path:
    out = tmp_path / "copy"
    shutil.copytree(CHECKPOINT, out)
    return out


def _edit_config(path: Path, **changes) -> None:
    config = json.loads((path / "config.json").read_text())
    config.update(changes)
    (path / "config.json").write_text(json.dumps(config))


def test_bad_directories_are_one_line_errors(tmp_path):
    path = _copy(tmp_path)
    _edit_config(path, intermediate_size=48)
    with pytest.raises(WorkbenchError, match=r"tensor transformer\.\w+\.0\.mlp\.fc\.weight has shape \(128, 32\)"):
        load_looped(path)
    path = _copy(tmp_path / "2")
    (path / "model-00003-of-00004.safetensors").unlink()
    with pytest.raises(WorkbenchError, match="names shard .model-00003-of-00004.safetensors., which is not a file"):
        load_looped(path)
    path = _copy(tmp_path / "3")
    _edit_config(path, injection_type="add")
    with pytest.raises(WorkbenchError, match="injection_type='add'; the raven family implements linear"):
        load_looped(path)
    path = tmp_path / "bin"
    path.mkdir()
    shutil.copy(CHECKPOINT / "config.json", path / "config.json")
    (path / "pytorch_model.bin").write_bytes(b"not unpickled")
    with pytest.raises(WorkbenchError, match="only pickled .bin weights"):
        load_looped(path)


def test_step_counts_past_the_family_are_refused(raven, ref):
    looped, _ = raven
    assert looped.max_loops == 64
    for bad in (0, 65, 2.0):
        with pytest.raises(WorkbenchError, match="outside 1..64"):
            looped(ref["a.ids"], loops=bad)
    with pytest.raises(WorkbenchError, match="init_state of shape"):
        looped(ref["a.ids"], loops=1, init_state=ref["b.s0"])
    with pytest.raises(WorkbenchError, match="init_seed"):
        looped(ref["a.ids"], loops=1, init_seed=-1)


@pytest.mark.slow
def test_probe_runs_on_tiny_raven_and_says_why_not_for_retrofit_probes(capsys, monkeypatch, tmp_path):
    out = tmp_path / "res"
    code, stdout, err = invoke(capsys, monkeypatch, "probe", "--checkpoint", "tiny-raven", "--out", out,
                               "--only", "logit_lens,drift,identity,latency,halting,gradient_audit")
    assert code == 0, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["model"]["settings"]["family"] == "huginn_raven"
    probes = summary["probes"]
    for name in ("identity", "latency", "halting", "gradient_audit"):
        assert probes[name]["status"] == "not_applicable" and probes[name]["reason"], name
    assert "reference's own forward" in probes["identity"]["reason"]
    assert "headline" in probes["logit_lens"] and "headline" in probes["drift"]
    lens = pd.read_parquet(out / "logit_lens.parquet")
    assert set(lens["loop"]) == {1, 2, 3, 4} and "not applicable" in stdout   # the battery's default loops


def test_bad_raven_input_on_the_command_line_is_one_line_and_writes_nothing(capsys, monkeypatch, tmp_path):
    out = tmp_path / "res"
    path = _copy(tmp_path)
    _edit_config(path, n_embd=48)
    code, _, err = invoke(capsys, monkeypatch, "probe", "--checkpoint", path, "--out", out)
    assert_clean_error(code, err, "tensor freqs_cis has shape (1, 64, 1, 4, 2) but the config implies (1, 64, 1, 6, 2)")
    path = _copy(tmp_path / "2")
    (path / "model-00001-of-00004.safetensors").unlink()
    code, _, err = invoke(capsys, monkeypatch, "probe", "--checkpoint", path, "--out", out)
    assert_clean_error(code, err, "names shard 'model-00001-of-00004.safetensors', which is not a file")
    battery = tmp_path / "b.toml"
    battery.write_text(f'[battery]\nmanifest = "{MANIFEST}"\n[probes.depth_matrix]\nloops = 17\n')
    code, _, err = invoke(capsys, monkeypatch, "probe", "--checkpoint", "tiny-raven", "--out", out, "--battery", battery)
    assert code == 2 and err.strip().splitlines()[-1] == ("error: loops=17 is outside 1..16 for this huginn_raven "
                                                          "model (native 8; the adapter reads up to twice that)")
    code, _, err = invoke(capsys, monkeypatch, "identity", "--model", CHECKPOINT)
    assert_clean_error(code, err, "a family the workbench writes itself")
    bare = tmp_path / "weights-only"
    shutil.copytree(CHECKPOINT, bare, ignore=shutil.ignore_patterns("tokenizer*", "special_tokens*"))
    code, _, err = invoke(capsys, monkeypatch, "probe", "--checkpoint", bare, "--out", out)
    assert_clean_error(code, err, "has no tokenizer files (weights only)")
    code, _, err = invoke(capsys, monkeypatch, "generate", bare, "--prompt", "the cat")
    assert code == 2 and "has no tokenizer files (weights only)" in err.strip().splitlines()[-1]
    assert not out.exists()


def test_zero_shot_exits_equal_the_reference_evaluators(raven, ref):
    looped, _ = raven
    _, values = zero_shot_read(looped, ref["a.ids"], loops=32, init_state=ref["a.s0"])
    for criterion in CRITERIA:
        assert _diff(values[criterion][0], ref[f"exit.{criterion}.values"]) <= 1e-5, criterion
        theirs = ref[f"exit.{criterion}.exits"].nonzero()
        first = int(theirs[0]) + 1 if len(theirs) else 32        # the reference's loop breaks at the first exit
        assert int(exit_steps(values[criterion], criterion)[0]) == first, criterion
    # the fixture's criteria stop at different steps, so a rule confused with another shows
    assert len({int(exit_steps(values[c], c)[0]) for c in CRITERIA}) >= 3


def test_adaptive_read_stops_each_row_where_its_criterion_says(raven, ref):
    looped, _ = raven
    ids, s0 = ref["a.ids"], ref["a.s0"]
    out = looped.adaptive_read(ids, policy=ZeroShotExit("latent-diff", max_loops=32), init_state=s0)
    step = int(out.loops_used[0])
    assert step == int(exit_steps(out.halt_probs, "latent-diff")[0]) and out.row_loops == 32
    assert _diff(out.scores[0, 0], ref["a.logits.32"][0, -1] if step == 32 else
                 looped(ids, loops=step, init_state=s0).logits[0, -1]) <= 1e-5
    with pytest.raises(WorkbenchError, match="out of range"):
        ZeroShotExit("cosine", threshold=3.0)
    with pytest.raises(WorkbenchError, match="whole number of steps"):
        ZeroShotExit("argmax-stability", threshold=0.5)
    with pytest.raises(WorkbenchError, match="ZeroShotExit policy"):
        looped.adaptive_read(ids, policy=object())


def test_exit_rules_puts_the_zero_shot_exits_beside_the_post_hoc_rules():
    looped, tok = load_looped("tiny-raven")
    rows = build_rows("chase", [1, 2], 4, 11, alphabet=8, tokenizer=tok)
    tables = exit_rules.run(looped, tok, rows, loops=6, rules=("kl", "stable"))
    f = tables["exit_rules"]
    enc = tok([r["prompt"] for r in rows], return_tensors="pt", padding=True)
    values = looped.zero_shot(enc["input_ids"], enc["attention_mask"], loops=6)
    rep = ~np.isin([r["row_id"] for r in rows], [r["row_id"] for r in split_rows(rows, 0.5, 0)[0]])
    answers = tables["exit_rules__rows"].pivot(index="row_id", columns="loop", values="predicted")
    answers = answers.loc[[r["row_id"] for r in rows]].to_numpy()                  # [R, T], the rows' order
    for criterion in CRITERIA:
        row = f[f["method"] == f"zero_shot_{criterion}"]
        assert len(row) == 1 and row["threshold"].iloc[0] == pytest.approx(DEFAULTS[criterion]), criterion
        steps = exit_steps(values[criterion], criterion).numpy()
        assert row["mean_loops"].iloc[0] == pytest.approx(steps[rep].mean()), criterion
        agree = answers[np.arange(len(rows)), steps - 1] == answers[:, -1]
        assert row["agree_last"].iloc[0] == pytest.approx(agree[rep].mean()), criterion
    assert {"kl", "stable", "fixed_k", "oracle"} <= set(f["method"])


def test_generation_on_the_per_step_cache_equals_recomputing(raven):
    looped, tok = raven
    enc = tok(["the cat sat", "a"], return_tensors="pt", padding=True)
    ids, mask = enc["input_ids"], enc["attention_mask"]
    with torch.no_grad():
        for T in (1, 4, 32):
            cache = looped.new_cache(T)
            logits = looped(ids, mask, loops=T, cache=cache).logits[:, -1]
            seq = ids
            for _ in range(4):
                chosen = logits.argmax(-1, keepdim=True)
                seq, mask_ = torch.cat([seq, chosen], 1), torch.cat([mask, torch.ones_like(chosen)], 1)
                recomputed = looped(seq, mask_, loops=T).logits[:, -1]
                logits = looped(chosen, mask_, loops=T, cache=cache).logits[:, -1]
                assert _diff(logits, recomputed) <= 1e-5, T
                mask = mask_
            # a slot per Prelude layer, per recurrent layer per step, per Coda layer: keys and values, fp32
            slots = 2 + 2 * T + 2
            assert len(cache.keys) == slots
            assert cache.nbytes() == slots * 2 * seq.numel() * 32 * 4
            mask = enc["attention_mask"]
    frame = generate(looped, tok, ["the cat sat", "a"], loops=[2, 32], max_new_tokens=5, stop_at_eos=False)
    again = generate(looped, tok, ["the cat sat", "a"], loops=[2, 32], max_new_tokens=5, stop_at_eos=False,
                     cache=False)
    assert frame["tokens"].tolist() == again["tokens"].tolist()
    s0 = torch.randn(1, 3, 32)
    out = looped.generate(ids[1:, -3:], max_new_tokens=3, loops=4, init_state=s0, init_seed=5)
    step = looped(ids[1:, -3:], loops=4, init_state=s0).logits[:, -1].argmax(-1)
    assert int(out[0, 3]) == int(step[0]) and out.shape == (1, 6)


def test_the_library_generation_decodes_from_the_given_initial_state():
    """`workbench.generation.generate` (the CLI's path) takes each prompt's s_0: the same s_0 gives the same text,
    cached or recomputed and as `looped.generate` unpadded; another s_0 changes it."""
    looped, tok = load_looped("tiny-raven")
    prompts = ["the cat sat", "a"]                   # "a" is left padded in the batch
    lengths = [len(tok(p)["input_ids"]) for p in prompts]
    g = torch.Generator().manual_seed(0)
    s0, other = ([torch.randn(n, looped.config.n_embd, generator=g) for n in lengths] for _ in range(2))
    kw = {"loops": [2, 4], "max_new_tokens": 6, "stop_at_eos": False}
    first = generate(looped, tok, prompts, init_state=s0, **kw)
    again = generate(looped, tok, prompts, init_state=[s.clone() for s in s0], cache=False, **kw)
    assert first["tokens"].tolist() == again["tokens"].tolist()
    for i, p in enumerate(prompts):
        ids = torch.tensor([tok(p)["input_ids"]])
        alone = looped.generate(ids, max_new_tokens=6, loops=2, init_state=s0[i][None])[0, lengths[i]:]
        assert first[(first["prompt_index"] == i) & (first["loops"] == 2)]["tokens"].iloc[0] == alone.tolist()
    moved = generate(looped, tok, prompts, init_state=other, **kw)
    assert all(a != b for a, b in zip(first["tokens"], moved["tokens"]))
    with pytest.raises(WorkbenchError, match=r"init_state of prompt 2 has shape \(2, 64\)"):
        generate(looped, tok, prompts, init_state=[s0[0], torch.zeros(2, 64)], **kw)
    base, base_tok = load_looped("tiny-ouro")
    with pytest.raises(WorkbenchError, match="has none"):
        generate(base, base_tok, prompts, init_seed=3, **kw)


@pytest.mark.slow
def test_the_raven_benchmark_measures_captures_reruns_and_cache_growth(bench, tmp_path):  # noqa: F811
    rec = bench("raven_overhead").main(["--quick", "--reps", "1", "--warmup", "0", "--no-progress",
                                        "--out", str(tmp_path)])
    r = rec["results"]
    assert r["steps"] == 8 and r["cached_tensors"] == 4 * 8
    assert all(v["wall"]["median"] > 0 for v in r["ratios"].values())
    for steps, g in r["kv_cache"].items():   # tiny-raven: 2 + 2 steps x 2 + 2 slots, keys and values, d 64, fp32
        assert g["bytes_per_token"] == (2 + 2 * steps + 2) * 2 * 64 * 4
    assert set(r["kv_cache"]) == {4, 8}
    assert bench("raven_overhead").huginn_bytes_per_token(32) == 132 * 2 * 5280 * 2   # 2.66 MiB a token


def test_nnsight_reads_and_patches_one_step_and_the_adapter_by_name(raven, ref):
    from nnsight import NNsight

    looped, _ = raven
    ids, s0 = ref["a.ids"], ref["a.s0"]
    wrapped = NNsight(looped)
    with wrapped.trace(ids, loops=4, init_state=s0):
        adapter_in = wrapped.loop["2"].adapter.hook_in.output.save()   # in the order the forward runs them
        s3 = wrapped.loop["3"].hook_state.output.save()
    assert _diff(s3[0], ref["a.states"][2]) <= 1e-5 and _diff(adapter_in[0], ref["a.adapter_in"][1]) <= 1e-5
    with wrapped.trace(ids, loops=4, init_state=s0):
        wrapped.loop["2"].adapter.hook_out.output[:] = 0
        logits = wrapped.output.logits.save()
    zero = [("loop.2.adapter.hook_out", lambda x, hook: torch.zeros_like(x))]
    with looped.hooks(fwd_hooks=zero):
        expected = looped(ids, loops=4, init_state=s0).logits
    assert torch.equal(logits, expected) and _diff(logits, ref["a.logits.4"]) > 1e-2


@pytest.mark.slow
def test_lens_agreement_reads_raven_through_its_own_final_norm_and_the_report_takes_full_agreement():
    from workbench.plots.loop_dynamics import lens_causal_figure
    from workbench.probes import lens_agreement

    looped, tok = load_looped("tiny-raven")
    rows = build_rows("chase", [1, 2], 4, 11, alphabet=8, tokenizer=tok)
    tables = lens_agreement.run(looped, tok, rows, loops=4, max_causal=4)
    assert tables["lens_agreement__identity"]["holds"].all()      # the coda lens at t = T is the model's output
    f = tables["lens_agreement"]
    assert set(f["lens"]) == {"logit", "coda", "tuned"} and set(f["loop"]) == {1, 2, 3, 4}
    empty = tables["lens_agreement__causal"].iloc[0:0]
    fig = lens_causal_figure(f, empty)
    assert "agree on every row at every pass" in fig.layout.annotations[0].text
