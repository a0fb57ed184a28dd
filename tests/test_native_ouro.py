"""Ouro, written here, against the reference modeling code's own outputs (tests/fixtures/ouro/README.md).

The tiny checkpoint is read through `load_looped` exactly as a user's Ouro-1.4B directory would be; every number
it is compared with came from the reference run unmodified on it (kschwethelm/ouro_rl at 93e095e).
"""

import json
import logging
import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.test_benchmarks import bench  # noqa: F401  (the fixture)
from tests.test_cli_errors import assert_clean_error, invoke
from workbench.errors import WorkbenchError
from workbench.loop.hooks import hook_name
from workbench.models import load_looped
from workbench.models.native.ouro import GateExit
from workbench.probes import exit_rules
from workbench.probes.common import encode_prompts
from workbench.tasks import build_rows

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "ouro"
CHECKPOINT = FIXTURE / "tiny-ouro"
EXACT = 1e-5          # fp32 against the reference's fp32
BF16_VS_FP32 = 0.1    # bf16 against the fp32 reference (measured 0.0625 at step 4)


@pytest.fixture(scope="module")
def ref():
    return load_file(str(FIXTURE / "reference.safetensors"))


@pytest.fixture(scope="module")
def ouro():
    return load_looped(CHECKPOINT)[0]


def gap(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max())


@torch.no_grad()
def test_every_step_is_the_reference_exit_at_step(ouro, ref):
    for k in range(1, 9):     # 5..8: the stack run past the trained 4, as the reference runs it
        assert gap(ouro(ref["input_ids"], loops=k).logits, ref[f"logits_step{k}"]) <= EXACT, k
    assert gap(ref["logits_step2"], ref["logits_step1"]) > 0.5     # steps differ: a wrong step would show


@torch.no_grad()
def test_states_and_exit_gate_per_step_by_hook_name(ouro, ref):
    _, cache = ouro.run_with_cache(ref["input_ids"], loops=4)
    for t in range(1, 5):
        assert gap(cache[hook_name("state", loop=t)], ref["states"][t - 1]) <= EXACT, t
        lam = torch.sigmoid(ref["gate_logits"][..., t - 1])
        assert gap(cache[f"loop.{t}.exit.hook_prob"], lam) <= EXACT, t
    assert gap(ouro.exit_probabilities(ref["input_ids"]), torch.sigmoid(ref["gate_logits"]).transpose(1, 2)) <= EXACT


@torch.no_grad()
def test_the_default_is_the_reference_threshold_rule(ouro, ref):
    ids = ref["input_ids"]
    assert gap(ouro(ids).logits, ref["logits_default"]) <= EXACT
    for tau in (0.3, 0.6, 0.9, 1.0):
        assert gap(ouro(ids, exit_threshold=tau).logits, ref[f"logits_threshold_{tau}"]) <= EXACT, tau
    steps = ouro.exit_steps(ouro.exit_probabilities(ids))
    assert set(steps.unique().tolist()) == {1, 2}      # the committed prompts exit at different steps under 0.6
    assert (ouro.exit_steps(ouro.exit_probabilities(ids), 1.0) == 4).all()


@torch.no_grad()
def test_padded_batch_against_the_reference_and_each_row_alone(ouro, ref):
    ids, mask = ref["padded_ids"], ref["padded_mask"]
    reference_positions = torch.arange(ids.shape[1]).expand(ids.shape)   # the reference counts padding
    real = mask.bool()
    for k in range(1, 5):
        ours = ouro(ids, mask, loops=k, position_ids=reference_positions).logits
        assert gap(ours[real], ref[f"padded_logits_step{k}"][real]) <= EXACT, k
        alone = ouro(ids, mask, loops=k).logits           # the workbench's positions: each row as if unpadded
        assert gap(alone[0, 3:], ref[f"short_logits_step{k}"][0]) <= EXACT, k
        assert gap(alone[1], ref[f"logits_step{k}"][0]) <= EXACT, k
    assert gap(ouro(ids, mask, position_ids=reference_positions).logits[real], ref["padded_logits_default"][real]) \
        <= EXACT


@torch.no_grad()
def test_bf16_is_the_reference_bf16_run(ref):
    looped, _ = load_looped(CHECKPOINT, dtype=torch.bfloat16)
    assert looped.base.lm_head.weight.dtype == torch.bfloat16
    for k in range(1, 5):
        ours = looped(ref["input_ids"], loops=k).logits
        assert gap(ours, ref[f"bf16_logits_step{k}"]) <= EXACT, k      # the same bf16 ops as the reference's
        assert gap(ours, ref[f"logits_step{k}"]) <= BF16_VS_FP32, k
    assert gap(looped(ref["input_ids"]).logits, ref["bf16_logits_default"]) <= EXACT


def test_weights_only_directory_loads_without_its_code(tmp_path, caplog):
    local = tmp_path / "ouro"
    shutil.copytree(CHECKPOINT, local)
    (local / "modeling_ouro.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w')\nraise SystemExit(1)\n")
    with caplog.at_level(logging.WARNING, logger="workbench.models.native.own"):
        looped, tok = load_looped(local)
    assert tok is None and looped.family == "ouro" and not (tmp_path / "ran").exists()
    assert any("(modeling_ouro.py); the workbench reads its config and weights only and never imports" in r.getMessage()
               for r in caplog.records)


def _copy(tmp_path, name="bad") -> Path:
    out = tmp_path / name
    shutil.copytree(CHECKPOINT, out)
    return out


def _edit_config(path: Path, **fields) -> None:
    config = json.loads((path / "config.json").read_text())
    config.update(fields)
    (path / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("case, fragments", [
    ("hidden", ("tensor 'model.embed_tokens.weight' is (96, 32) in the weights", "(96, 48)")),
    ("shard", ("names shard 'model-00002-of-00002.safetensors', which is not a file",)),
    ("bin", ("holds no model.safetensors", "safetensors weights only")),
    ("extra", ("hold 1 tensors an Ouro config does not describe (first: 'model.extra')",)),
    ("threshold", ("early_exit_threshold is 1.5", "(0, 1]")),
    ("sliding", ("use_sliding_window = True is not supported",)),
    ("layers", ("layer_types = ['full_attention', 'sliding_attention'] is not supported",)),
])
def test_bad_directories_are_one_line(tmp_path, case, fragments):
    path = _copy(tmp_path)
    if case == "hidden":
        _edit_config(path, hidden_size=48, num_attention_heads=4)
    elif case == "shard":
        (path / "model-00002-of-00002.safetensors").unlink()
    elif case == "bin":
        for f in path.glob("model*"):
            f.unlink()
        (path / "pytorch_model.bin").write_bytes(b"not unpickled")
    elif case == "extra":
        shard = path / "model-00002-of-00002.safetensors"
        tensors = load_file(str(shard)) | {"model.extra": torch.zeros(2)}
        save_file(tensors, str(shard))
    elif case == "threshold":
        _edit_config(path, early_exit_threshold=1.5)
    elif case == "sliding":
        _edit_config(path, use_sliding_window=True)
    else:
        _edit_config(path, layer_types=["full_attention", "sliding_attention"])
    with pytest.raises(WorkbenchError) as err:
        load_looped(path)
    message = str(err.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message


def test_step_count_and_threshold_out_of_range(ouro, ref):
    with pytest.raises(WorkbenchError, match=r"loops=9 is outside 1\.\.8 for this ouro model"):
        ouro(ref["input_ids"], loops=9)
    for tau in (0.0, -0.1, 1.01, True):
        with pytest.raises(WorkbenchError, match=r"exit_threshold is .*\(0, 1\]"):
            ouro(ref["input_ids"], exit_threshold=tau)
    with pytest.raises(WorkbenchError, match="with loops= every token reads that step"):
        ouro(ref["input_ids"], loops=2, exit_threshold=0.5)


@torch.no_grad()
def test_the_gate_is_a_learned_exit_for_read_and_adaptive_read(ouro):
    ids = torch.randint(3, 96, (6, 9), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[0, :3] = mask[2, :5] = 0
    lam = ouro.exit_probabilities(ids, mask)                                  # [6, 4, 9]
    read = ouro.read(ids, mask, loops=4)
    assert ouro.halt_rule == "cdf" and gap(read.halt_probs, 1 - lam[..., -1]) == 0.0   # continue probabilities
    out = ouro.adaptive_read(ids, mask, policy=GateExit(0.4))
    expected = ouro.exit_steps(lam, 0.4)[:, -1]
    assert out.loops_used.tolist() == expected.tolist() and len(set(expected.tolist())) == 2
    assert out.row_loops == int(expected.sum()) < 6 * 4                      # stopped rows left the batch
    assert gap(out.scores[:, -1], ouro(ids, mask, exit_threshold=0.4).logits[:, -1]) <= EXACT
    later = ouro.adaptive_read(ids, mask, policy=GateExit(0.4, min_loops=3))
    assert (later.loops_used >= 3).all()
    with pytest.raises(WorkbenchError, match="GateExit threshold is 0"):
        GateExit(0)


@torch.no_grad()
def test_exit_rules_sets_the_gate_beside_the_post_hoc_rules():
    looped, tok = load_looped("tiny-ouro")
    rows = build_rows("chase", depths=[1, 2, 3], per_depth=8, seed=0, tokenizer=tok)
    tables = exit_rules.run(looped, tok, rows, loops=4)
    head = tables["exit_rules"].set_index(["method", "threshold"]).loc["head"]
    split = tables["exit_rules__rows"].drop_duplicates("row_id").set_index("row_id")["split"]
    reported = [r for r in rows if split[r["row_id"]] != "calibration"]
    answers = tables["exit_rules__rows"].set_index(["row_id", "loop"])["predicted"]
    for tau in (0.3, 0.5, 0.7):           # the gate's own steps at the read position, row by row
        steps = [int(looped.adaptive_read(**encode_prompts(tok, [r["prompt"]]), policy=GateExit(tau)).loops_used)
                 for r in reported]
        assert head.loc[tau, "mean_loops"] == pytest.approx(sum(steps) / len(steps)), tau
        agree = [answers[r["row_id"], t] == answers[r["row_id"], 4] for r, t in zip(reported, steps)]
        assert head.loc[tau, "agree_last"] == pytest.approx(sum(agree) / len(agree)), tau
    assert head["mean_loops"].nunique() > 1 and set(tables["exit_rules__matched"]["reference"]) == {"head"}


@torch.no_grad()
def test_step_cache_decodes_as_recomputing(ouro, ref):
    ids, mask = ref["padded_ids"], ref["padded_mask"]
    extra = torch.randint(3, 96, (2, 5), generator=torch.Generator().manual_seed(1))
    for k in (1, 4, 8):
        cache = ouro.new_cache(k)
        cached = [ouro(ids, mask, loops=k, cache=cache).logits[:, -1]]
        for j in range(extra.shape[1]):
            whole = torch.cat([mask, torch.ones(2, j + 1, dtype=mask.dtype)], dim=1)
            cached.append(ouro(extra[:, j:j + 1], whole, loops=k, cache=cache).logits[:, -1])
        full_ids, full_mask = torch.cat([ids, extra], dim=1), torch.cat([mask, torch.ones_like(extra)], dim=1)
        recomputed = ouro(full_ids, full_mask, loops=k).logits[:, ids.shape[1] - 1:]
        assert gap(torch.stack(cached, dim=1), recomputed) <= EXACT, k
        # one key and one value slot per (step, layer): 2 x k x layers x kv heads x head size x tokens x 4 bytes
        assert len(cache.slots) == k * 2 and cache.nbytes() == 2 * k * 2 * 2 * 8 * full_ids.numel() * 4


def test_generate_on_the_cache_writes_what_recomputing_writes():
    from workbench.generation import generate

    looped, tok = load_looped("tiny-ouro")
    prompts = ["The cat sat on", "A"]
    cached = generate(looped, tok, prompts, loops=[1, 4, 8], max_new_tokens=6, stop_at_eos=False)
    fresh = generate(looped, tok, prompts, loops=[1, 4, 8], max_new_tokens=6, stop_at_eos=False, cache=False)
    assert cached["tokens"].tolist() == fresh["tokens"].tolist() and cached["cached"].all()
    assert cached.groupby("prompt_index")["text"].nunique().max() > 1      # the step count changes the text


@pytest.mark.slow
def test_probe_runs_the_battery_on_tiny_ouro(capsys, monkeypatch, tmp_path):
    out = tmp_path / "res"
    code, stdout, err = invoke(capsys, monkeypatch, "probe", "--checkpoint", "tiny-ouro", "--out", out, "--only",
                               "exit_rules,logit_lens,identity,halting,gradient_audit,latency")
    assert code == 0, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["model"]["settings"] == {"family": "ouro", "native_loops": 4, "max_loops": 8, "block": [0, 2]}
    probes = summary["probes"]
    for name in ("identity", "halting", "gradient_audit", "latency"):
        assert probes[name]["status"] == "not_applicable" and probes[name]["reason"], name
    assert "reference modeling code" in probes["identity"]["reason"] and "not applicable" in stdout
    assert "learned exit is read by exit_rules" in probes["halting"]["reason"]
    rules = pd.read_parquet(out / "exit_rules.parquet")
    assert {"head", "fixed_k", "kl", "stable"} <= set(rules["method"])      # the gate beside the post-hoc rules
    assert pd.read_parquet(out / "logit_lens.parquet")["loop"].max() == 4


def test_bad_ouro_input_on_the_command_line_is_one_line_and_writes_nothing(capsys, monkeypatch, tmp_path):
    out = tmp_path / "res"
    code, _, err = invoke(capsys, monkeypatch, "probe", "--checkpoint", CHECKPOINT, "--out", out)
    assert_clean_error(code, err, "has no tokenizer files (weights only)")
    bad = _copy(tmp_path)
    _edit_config(bad, early_exit_threshold=0)
    code, _, err = invoke(capsys, monkeypatch, "probe", "--checkpoint", bad, "--out", out)
    assert_clean_error(code, err, "early_exit_threshold is 0")
    code, _, err = invoke(capsys, monkeypatch, "generate", "tiny-ouro", "--loops", "9", "--prompt", "Hi")
    assert code == 2 and err.strip().splitlines()[-1] == "error: loops=9 is outside 1..8 for this model (its max_loops)"
    code, _, err = invoke(capsys, monkeypatch, "identity", "--model", "tiny-ouro")
    assert_clean_error(code, err, "a family the workbench writes itself", "tests/fixtures/")
    assert not out.exists()


def test_capture_benchmark_measures_what_it_says(bench, tmp_path):  # noqa: F811
    rec = bench("ouro_capture").main(["--quick", "--reps", "1", "--warmup", "0", "--rows", "2", "--no-progress",
                                      "--out", str(tmp_path)])
    r = rec["results"]
    assert r["cached_tensors"] == 4 * r["steps"] and json.loads((tmp_path / "ouro_capture.json").read_text())
    tokens = r["rows"] * r["seq"]
    assert r["kv_cache_bytes"] == {k: k * tokens * r["kv_bytes_per_token_step_fp32"] for k in range(1, 9)}
    assert r["kv_bytes_per_token_step_fp32"] == 2 * 2 * 2 * 16 * 4     # 2 layers, 2 kv heads of 16, fp32
    assert all(v["cpu"]["median"] > 0 for v in r["ratios"].values())


@torch.no_grad()
def test_identity_hooks_on_every_site_keep_the_logits_and_a_patch_acts_at_its_step(ouro, ref):
    ids, mask = ref["padded_ids"], ref["padded_mask"]
    plain = ouro(ids, mask, loops=4).logits
    every = [(name, lambda x, hook: x) for name in ouro.hook_dict if name.startswith(("hook_prelude", "loop."))
             and int(name.split(".")[1] if name.startswith("loop.") else 1) <= 4]
    assert any(n.endswith("attn.hook_pattern") for n, _ in every) and any(n.endswith("exit.hook_prob") for n, _ in every)
    assert torch.equal(ouro.run_with_hooks(ids, attention_mask=mask, loops=4, fwd_hooks=every).logits, plain)
    double = [("loop.2.block.1.attn.hook_out", lambda x, hook: 2 * x)]
    read, patched = ouro.read(ids, mask, loops=4), None
    with ouro.hooks(fwd_hooks=double):
        patched = ouro.read(ids, mask, loops=4)
    assert torch.equal(patched.scores[:, 0], read.scores[:, 0])               # step 1 untouched
    assert not torch.equal(patched.scores[:, 1], read.scores[:, 1])           # the patch acts at step 2 ...
    assert not torch.equal(patched.scores[:, 3], read.scores[:, 3])           # ... and carries to the steps after
    gate = [("loop.3.exit.hook_prob", lambda x, hook: torch.ones_like(x))]    # the gate says exit at step 3
    with ouro.hooks(fwd_hooks=gate):
        exited = ouro(ids, mask, exit_threshold=0.99).logits
    assert (ouro.exit_steps(ouro.exit_probabilities(ids, mask), 0.99) == 4).all()   # unpatched: every token at 4
    assert torch.equal(exited, ouro(ids, mask, loops=3).logits)
