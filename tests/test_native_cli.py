"""`workbench probe --checkpoint DIR` on native looped models: the battery end to end, and bad input (exit 2)."""

import json
from pathlib import Path

import pandas as pd
import pytest

from tests.test_cli_errors import assert_clean_error, invoke
from workbench.models import load_looped

MANIFEST = Path(__file__).resolve().parents[1] / "workbench" / "data" / "probes" / "chase_n8_d1-7.jsonl"


@pytest.fixture(scope="module")
def saved_hrm(tmp_path_factory):
    looped, tok = load_looped("tiny-hrm-text")
    out = tmp_path_factory.mktemp("hrm") / "tiny-hrm"
    looped.base.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def test_probe_runs_the_native_battery_on_a_saved_directory(capsys, monkeypatch, tmp_path, saved_hrm):
    out = tmp_path / "res"
    code, stdout, err = invoke(capsys, monkeypatch, "probe", "--checkpoint", saved_hrm, "--out", out,
                               "--only", "depth_matrix,overshoot,logit_lens,splice,identity,gradient_audit,halting")
    assert code == 0, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["checkpoint"]["kind"] == "native" and summary["model"]["settings"]["family"] == "hrm_text"
    probes = summary["probes"]
    for name in ("identity", "gradient_audit", "halting"):
        assert probes[name]["status"] == "not_applicable" and probes[name]["reason"], name
    assert "exactness against transformers" in probes["identity"]["reason"]
    for name in ("depth_matrix", "overshoot", "logit_lens", "splice"):
        assert "headline" in probes[name], name
    lens = pd.read_parquet(out / "logit_lens.parquet")
    assert set(lens["lens"]) == {"coda", "raw", "tuned"} and lens["loop"].max() == 4   # passes beyond the native 2
    assert (out / "report.html").is_file() and "not applicable" in stdout
    assert "native model has no base to reproduce" in (out / "report.html").read_text()


def test_native_battery_probes_the_whole_default_set_on_inkling(capsys, monkeypatch, tmp_path):
    out = tmp_path / "res"
    code, _, err = invoke(capsys, monkeypatch, "probe", "--checkpoint", "tiny-inkling2-loop", "--out", out,
                          "--only", "heads,drift,loop_accuracy,latency")
    assert code == 0, err
    probes = json.loads((out / "summary.json").read_text())["probes"]
    assert probes["latency"]["status"] == "not_applicable"
    heads = pd.read_parquet(out / "heads.parquet")
    assert set(heads["loop"]) == {1, 2, 3} and set(heads["layer"]) == {1, 2}   # the looped layers, by pass
    assert "headline" in probes["drift"] and "headline" in probes["loop_accuracy"]


def test_bad_native_input_is_one_line_and_writes_nothing(capsys, monkeypatch, tmp_path, saved_hrm):
    out = tmp_path / "res"   # (--precision bf16 is accepted: tests/test_checkpoints.py)
    ouro = tmp_path / "ouro"
    ouro.mkdir()
    (ouro / "config.json").write_text(json.dumps({"model_type": "ouro"}))
    code, _, err = invoke(capsys, monkeypatch, "probe", "--checkpoint", ouro, "--out", out)
    assert_clean_error(code, err, "holds no model.safetensors", "safetensors weights only")
    battery = tmp_path / "b.toml"
    battery.write_text(f'[battery]\nmanifest = "{MANIFEST}"\n[probes.depth_matrix]\nloops = 5\n')
    code, _, err = invoke(capsys, monkeypatch, "probe", "--checkpoint", saved_hrm, "--out", out, "--battery", battery)
    assert code == 2 and err.strip().splitlines()[-1] == ("error: loops=5 is outside 1..4 for this hrm_text model "
                                                          "(native 2; the adapter reads up to twice that)")  # after progress
    code, _, err = invoke(capsys, monkeypatch, "select-block", "--model", saved_hrm)
    assert_clean_error(code, err, "is a native looped model (hrm_text)", "workbench probe --checkpoint")
    assert not out.exists()


def test_identity_compares_a_native_model_with_transformers_at_every_pass(capsys, monkeypatch, saved_hrm):
    code, out, err = invoke(capsys, monkeypatch, "identity", "--model", saved_hrm, "--json")
    assert code == 0, err
    record = json.loads(out)
    assert record["family"] == "hrm_text" and record["native_passes"] == 2
    assert record["per_pass"] == {"1": 0.0, "2": 0.0, "3": 0.0, "4": 0.0} and record["max_abs_diff"] == 0.0
    code, out, _ = invoke(capsys, monkeypatch, "identity", "--model", "tiny-inkling2-loop")
    assert code == 0 and out.strip().endswith("max |Δlogit| = 0.0") and "passes 1..6 (native 3)" in out


def test_rows_takes_a_native_model_directory_for_its_tokenizer(capsys, monkeypatch, tmp_path, saved_hrm):
    out = tmp_path / "rows.jsonl"
    code, _, err = invoke(capsys, monkeypatch, "rows", "--task", "chase", "--alphabet", "4", "--depths", "1-2",
                          "--per-depth", "2", "--seed", "1", "--model", saved_hrm, "--out", out)
    assert code == 0, err
    assert len(out.read_text().splitlines()) == 4
