"""bf16 mixed precision: what is cast, what stays exact, hardware fallback, and the battery in bf16."""

from __future__ import annotations

import pytest
import torch

from workbench import precision as P
from workbench.errors import WorkbenchError
from workbench.loop.config import Block, RetrofitConfig
from workbench.loop.surgery import attach_lora, retrofit
from workbench.models import load_base


@pytest.fixture
def tiny():
    torch.manual_seed(0)
    base, tok = load_base("tiny-llama")
    looped = retrofit(base, RetrofitConfig(Block(1, 3), max_loops=3))
    attach_lora(looped, r=4, alpha=8)
    return looped, tok


def test_apply_precision_casts_only_frozen_tensors_and_reads_come_back_fp32(tiny):
    looped, tok = tiny
    enc = tok(["A -> B\nB -> A\nStart at A.\nAnswer:", "hello world"], return_tensors="pt", padding=True,
              padding_side="left")
    with torch.no_grad():
        ref = looped.read(enc.input_ids, enc.attention_mask, loops=3).scores
    for name, p in looped.named_parameters():
        p.requires_grad_("lora_" in name or name.startswith("reentry."))
    n = P.apply_precision(looped, "bf16")
    dtypes = {name: p.dtype for name, p in looped.named_parameters()}
    assert n == sum(d == torch.bfloat16 for d in dtypes.values()) > 0
    assert all(d == torch.float32 for name, d in dtypes.items() if "lora_" in name or name.startswith("reentry."))
    assert looped.precision == "bf16"
    with torch.no_grad():
        got = looped.read(enc.input_ids, enc.attention_mask, loops=3).scores
        logits = looped(enc.input_ids, enc.attention_mask, loops=2).logits
    assert got.dtype == torch.float32 and logits.dtype == torch.float32
    assert 0 < (got - ref).abs().max() < 0.1 * ref.abs().max()   # bf16 moves the scores a little, not a lot
    # the readout is taken in fp32: scores are not on bf16's grid (steps of 2^-7 relative)
    assert not torch.equal(got, got.to(torch.bfloat16).float())


def test_fp32_is_untouched_and_exact(tiny):
    looped, tok = tiny
    before = {n: p.clone() for n, p in looped.named_parameters()}
    assert P.apply_precision(looped, "fp32") == 0
    assert all(torch.equal(before[n], p) for n, p in looped.named_parameters())
    enc = tok(["one two three"], return_tensors="pt")
    with torch.no_grad():
        assert torch.equal(looped(enc.input_ids, loops=1).logits, looped.base(enc.input_ids).logits)


def test_unknown_precision_and_no_bf16_units_fall_back_with_a_warning(monkeypatch):
    with pytest.raises(WorkbenchError, match="accepted: fp32, bf16"):
        P.resolve_precision("fp16")
    monkeypatch.setattr(P, "detect_hardware", lambda device="cpu": P.Hardware("cpu", "old CPU", [], False))
    said = []
    used, record = P.resolve_precision("bf16", warn=said.append)
    assert used == "fp32" and record["used"] == "fp32" and record["requested"] == "bf16"
    assert said and "using fp32" in said[0] and "no bf16 units" in record["fallback_reason"]
    assert P.resolve_precision("fp32")[0] == "fp32"


def test_detect_hardware_reads_this_machine():
    hw = P.detect_hardware("cpu")
    assert hw.device == "cpu" and hw.name
    assert hw.bf16_supported == (any(u in hw.bf16_units for u in ("avx512_bf16", "amx_bf16"))
                                 and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()))


def test_a_bf16_battery_runs_identity_in_fp32_first(tiny_run, tmp_path, monkeypatch):
    # The order is the battery's, whatever CPU runs the suite: on one without bf16 units bf16 falls back to fp32
    # and nothing would move, so the hardware is read as having them (bf16 then runs emulated on the tiny model).
    import workbench.precision as precision
    from workbench.models import load_tokenizer

    monkeypatch.setattr(precision, "detect_hardware", lambda device="cpu": precision.Hardware(
        "cpu", "a CPU with bf16 units", ["avx512_bf16"], True))
    from workbench.probes.battery import run_battery
    from workbench.tasks import build_rows
    from workbench.tasks.manifest import write_manifest

    rows = tmp_path / "rows.jsonl"
    write_manifest(build_rows("chase", [1, 2], 2, 5, alphabet=4, tokenizer=load_tokenizer("tiny-llama")), rows)
    battery = tmp_path / "b.toml"
    battery.write_text(f'[battery]\nmanifest = "{rows}"\n[probes.depth_matrix]\n[probes.identity]\nloops = 1\n'
                       'n_rows = 1\nlora = false\nfresh = false\nguardrail = false\n')
    summary = run_battery(str(tiny_run), battery, tmp_path / "out", progress=False, precision="bf16")
    assert list(summary["probes"]) == ["identity", "depth_matrix"]      # the exact probe moved first
    assert summary["precision"]["requested"] == "bf16" and "identity" in summary["precision"]["fp32_probes"]
    assert summary["probes"]["identity"]["checkpoint_self"] == 0.0


