"""`workbench launch`: `workbench train` on several processes through `accelerate launch` and a preset.

A preset is an accelerate config file; the shipped ones are in training/accelerate/ (ddp, fsdp2,
zero2; docs/gpu.md). The preset, its engine and the GPUs it needs are checked before anything
starts, so a preset naming an engine that is not installed or not driven here (DeepSpeed other
than ZeRO-2) or more GPUs than the machine has is one line and exit status 2, with nothing written.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import List, Optional

import typer

from workbench.commands.output import JSON, QUIET, Output
from workbench.errors import WorkbenchError

PRESETS = Path(__file__).resolve().parents[2] / "training" / "accelerate"


def preset_path(preset: str) -> Path:
    """A shipped preset's file (ddp, fsdp2, zero2) or the given YAML file."""
    path = Path(preset)
    if path.suffix in (".yaml", ".yml"):
        if not path.is_file():
            raise WorkbenchError(f"--preset '{preset}' does not exist")
        return path
    shipped = PRESETS / f"{preset}.yaml"
    if not shipped.is_file():
        names = sorted(p.stem for p in PRESETS.glob("*.yaml")) if PRESETS.is_dir() else []
        raise WorkbenchError(f"--preset '{preset}' is not a shipped preset ({', '.join(names) or 'none found'}) "
                             "nor a .yaml file")
    return shipped


def check_preset(path: Path, processes: int, cpu: bool) -> dict:
    """Reads a preset and checks its engine is installed and driven here, and that the GPUs exist; returns it."""
    import torch
    import yaml

    from workbench.train.sharding import check_deepspeed

    try:
        config = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise WorkbenchError(f"--preset {path}: not valid YAML ({str(err).splitlines()[0]})") from None
    kind = str(config.get("distributed_type", "NO")).upper()
    if kind == "DEEPSPEED":
        ds = config.get("deepspeed_config") or {}
        check_deepspeed(f"--preset {path}", ds.get("zero_stage", 2), ds.get("offload_optimizer_device"),
                        ds.get("offload_param_device"), ds.get("deepspeed_config_file"))
    elif kind == "FSDP":
        version = int((config.get("fsdp_config") or {}).get("fsdp_version", 1))
        if version != 2:
            raise WorkbenchError(f"--preset {path} asks for FSDP version {version}; this trainer shards with FSDP2 "
                                 "only (fsdp_version: 2, --preset fsdp2)")
        if importlib.util.find_spec("torch.distributed.fsdp") is None or not torch.distributed.is_available():
            raise WorkbenchError(f"--preset {path} asks for FSDP2, which this torch build lacks")
    elif kind not in ("MULTI_GPU", "MULTI_CPU", "NO"):
        raise WorkbenchError(f"--preset {path}: distributed_type {kind} is not driven by this trainer "
                             "(accepted: MULTI_GPU, MULTI_CPU, FSDP with fsdp_version 2, DEEPSPEED with zero_stage 2)")
    if processes < 1:
        raise WorkbenchError(f"--processes {processes}: at least 1")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if not cpu and kind != "MULTI_CPU" and gpus < processes:
        raise WorkbenchError(f"--preset {path.stem} with {processes} processes needs {processes} CUDA GPUs; torch "
                             f"sees {gpus} (--cpu runs the processes on the CPU over gloo)")
    return config


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(
    recipe: str = typer.Argument(..., help="A TOML recipe file or a shipped recipe's name (as for train)."),
    preset: str = typer.Option("ddp", "--preset", help="ddp, fsdp2, zero2 (training/accelerate/) or an accelerate config "
                               ".yaml."),
    processes: int = typer.Option(2, "--processes", help="Processes (one per GPU)."),
    cpu: bool = typer.Option(False, "--cpu", help="Run the processes on the CPU over gloo (tests, no GPU)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Run directory (default runs/<recipe name>)."),
    overrides: List[str] = typer.Option([], "--set", help="Override a recipe key: key=value (repeatable)."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the run directory's latest checkpoint."),
    quiet: bool = QUIET,
    as_json: bool = JSON,
) -> None:
    """Train a recipe on several processes: accelerate launch with a preset, each rank on its own device.

    --quiet and --json pass to the main rank's `workbench train`, which alone prints."""
    from workbench.defaults import resolve
    from workbench.guard import RUN_OUTPUT, guard_output, safe_child  # a run's kind, declared without the model stack
    from workbench.train.recipe import Recipe

    path = preset_path(preset)
    check_preset(path, processes, cpu)
    recipe_path = resolve("recipe", recipe)
    resolved = Recipe.from_toml(recipe_path, overrides)   # a bad recipe or --set: one line here, not one per rank
    run_dir = Path(out) if out is not None else safe_child("runs", resolved.name, "recipe name")

    with guard_output(run_dir, "launch", kind=RUN_OUTPUT, resume=resume, reading=[recipe_path]):
        pass   # decided before any process starts; the main rank's `train` takes the guard (and its lock) itself
    accelerate = shutil.which("accelerate", path=str(Path(sys.executable).parent)) or shutil.which("accelerate")
    if accelerate is None:
        raise WorkbenchError("accelerate's launcher is not installed next to this Python")
    cmd = [accelerate, "launch", "--config_file", str(path), "--num_processes", str(processes),
           "--main_process_port", str(_free_port()), "-m", "workbench", "train", recipe,
           "--device", "cpu" if cpu else "auto"]
    if out is not None:
        cmd += ["--out", str(out)]
    for o in overrides:
        cmd += ["--set", o]
    if resume:
        cmd.append("--resume")
    ui = Output(quiet, as_json)
    cmd += ["--quiet"] * ui.quiet + ["--json"] * ui.as_json
    # DeepSpeed picks its accelerator itself: on the CPU it must be told (its CPU accelerator, over gloo here).
    env = {**os.environ, **({"ACCELERATE_USE_CPU": "1", "DS_ACCELERATOR": "cpu"} if cpu else {})}
    raise typer.Exit(subprocess.run(cmd, env=env).returncode)
