"""--device the machine cannot honour, and accelerate presets it cannot run: one line, exit 2, nothing written."""

from __future__ import annotations

import pytest
import torch

from tests.test_cli_errors import assert_clean_error, invoke
from workbench.devices import resolve_device
from workbench.errors import WorkbenchError


def one_gpu(monkeypatch):
    """Makes torch report one CUDA GPU (cuda:0) without touching CUDA."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)


def test_names_resolve_to_devices(monkeypatch):
    assert resolve_device("cpu") == torch.device("cpu") and resolve_device(" CPU ") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu") and resolve_device(None) == torch.device("cpu")
    one_gpu(monkeypatch)
    assert resolve_device("auto") == torch.device("cuda", 0)
    assert resolve_device("cuda") == resolve_device("cuda:0") == torch.device("cuda", 0)
    with pytest.raises(WorkbenchError, match=r"has 1 CUDA GPU \(cuda:0\)"):
        resolve_device("cuda:1")
    for bad in ("gpu", "cuda:x", "cuda0", "mps", ""):
        with pytest.raises(WorkbenchError, match="not a device name"):
            resolve_device(bad)


COMMANDS = {
    "train": lambda tmp: ["train", "smollm2_lora_chase", "--out", tmp / "out"],
    "probe": lambda tmp: ["probe", "--checkpoint", "untrained:tiny-llama:2:4", "--out", tmp / "out"],
    "identity": lambda tmp: ["identity", "--model", "tiny-llama", "--block", "2:4"],
    "select-block": lambda tmp: ["select-block", "--model", "tiny-llama", "--out", tmp / "out"],
    "demo": lambda tmp: ["demo", "--out", tmp / "out"],
}


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("device, gpus, message", [
    ("cuda", 0, "torch sees no CUDA GPU here"),
    ("cuda:7", 1, "this machine has 1 CUDA GPU (cuda:0)"),
    ("tpu", 0, "is not a device name"),
])
def test_a_device_the_machine_lacks_is_one_line_and_nothing_written(capsys, monkeypatch, tmp_path, command, device,
                                                                       gpus, message):
    if gpus:
        one_gpu(monkeypatch)
    else:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.chdir(tmp_path)
    code, _, err = invoke(capsys, monkeypatch, *COMMANDS[command](tmp_path), "--device", device)
    assert_clean_error(code, err, f"--device {device}" if device != "tpu" else "'tpu'", message)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("preset, message", [
    ({"distributed_type": "DEEPSPEED", "deepspeed_config": {"zero_stage": 2}}, "asks for DeepSpeed, which is not installed"),
    ({"distributed_type": "DEEPSPEED", "deepspeed_config": {"zero_stage": 3}}, "ZeRO stage 3; this trainer drives stage 2 only"),
    ({"distributed_type": "DEEPSPEED", "deepspeed_config": {"zero_stage": 1}}, "ZeRO stage 1; this trainer drives stage 2 only"),
    ({"distributed_type": "DEEPSPEED", "deepspeed_config": {"zero_stage": 2, "offload_optimizer_device": "cpu"}},
     "offload_optimizer_device: cpu; this trainer drives ZeRO-2 without offload"),
    ({"distributed_type": "DEEPSPEED", "deepspeed_config": {"zero_stage": 2, "offload_param_device": "nvme"}},
     "offload_param_device: nvme"),
    ({"distributed_type": "DEEPSPEED", "deepspeed_config": {"deepspeed_config_file": "ds.json"}},
     "gives a DeepSpeed config file (ds.json)"),
    ({"distributed_type": "FSDP", "fsdp_config": {"fsdp_version": 1}}, "FSDP version 1"),
    ({"distributed_type": "TPU"}, "distributed_type TPU is not driven"),
])
def test_a_preset_naming_an_engine_not_installed_or_not_driven_is_one_line(capsys, monkeypatch, tmp_path, preset,
                                                                            message):
    import importlib.util

    import yaml

    if "not installed" in message:   # deepspeed is installed here (make setup): hide it
        find_spec = importlib.util.find_spec
        monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "deepspeed"
                            else find_spec(name, *a))
    path = tmp_path / "preset.yaml"
    path.write_text(yaml.safe_dump(preset))
    monkeypatch.chdir(tmp_path)
    code, _, err = invoke(capsys, monkeypatch, "launch", "smollm2_lora_chase", "--preset", path, "--out", tmp_path / "o")
    assert_clean_error(code, err, message)
    if "not installed" in message:
        assert "pip install deepspeed" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["preset.yaml"]


def test_the_zero2_preset_is_accepted_and_its_accelerate_env_names_zero2(monkeypatch):
    from workbench.commands.launch import check_preset, preset_path
    from workbench.train.sharding import requested_engine

    config = check_preset(preset_path("zero2"), 2, cpu=True)
    assert config["distributed_type"] == "DEEPSPEED" and config["deepspeed_config"]["zero_stage"] == 2
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "2")
    assert requested_engine(2) == "zero2" and requested_engine(1) == "none"
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "3")
    with pytest.raises(WorkbenchError, match="ZeRO stage 3; this trainer drives stage 2 only"):
        requested_engine(2)
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "2")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE", "cpu")
    with pytest.raises(WorkbenchError, match="without offload"):
        requested_engine(2)


def test_a_shipped_preset_needs_its_gpus_unless_told_cpu(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.chdir(tmp_path)
    code, _, err = invoke(capsys, monkeypatch, "launch", "smollm2_lora_chase", "--preset", "fsdp2", "--processes", "2")
    assert_clean_error(code, err, "needs 2 CUDA GPUs; torch sees 0", "--cpu")
    code, _, err = invoke(capsys, monkeypatch, "launch", "smollm2_lora_chase", "--preset", "zero3")
    assert_clean_error(code, err, "'zero3' is not a shipped preset (ddp, fsdp2, zero2)")
    assert list(tmp_path.iterdir()) == []


def test_a_bad_recipe_is_refused_before_any_process_starts(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    code, _, err = invoke(capsys, monkeypatch, "launch", "smollm2_lora_chase", "--cpu", "--set", "optim.lrr=1")
    assert_clean_error(code, err, "optim.lrr")
    code, _, err = invoke(capsys, monkeypatch, "launch", "no_such_recipe", "--cpu")
    assert_clean_error(code, err, "no_such_recipe")
    assert list(tmp_path.iterdir()) == []
