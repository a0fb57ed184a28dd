"""Writing a run directory (the trainer's side): the run files, their provenance, and resumable checkpoints.

The format, and reading a finished run, are `workbench.runs`'. This module adds what only training writes:

    checkpoints/step_N/     resumable state: trainable.safetensors, optimizer.safetensors +
                            optimizer.json, scheduler.json, rng.safetensors, state.json

No pickle anywhere: tensors go through safetensors, everything else through JSON. Every file
is written to a temporary name and `os.replace`d.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
from pathlib import Path

import torch
from safetensors.torch import load_file

from workbench.errors import WorkbenchError
from workbench.io import sha256_file, write_json_atomic
from workbench.models.bases import weights_sha256
from workbench.readers import read_json
from workbench.run_tensors import save_tensors, trainable_sha256
from workbench.runs import CHECKPOINTS, FORMAT, PROVENANCE, RUN_FILES, TRAINABLE, StateView, load_trained, trained_state
from workbench.train.sharding import full  # an FSDP2-sharded model hashes its full tensors

PACKAGES = ("torch", "transformers", "peft", "safetensors", "accelerate", "transformer-lens", "workbench")


# ----------------------------------------------------------------------------- what is saved
def state_sha256(looped: torch.nn.Module, skip: str = "halting.") -> str:
    """Returns `weights_sha256` of every tensor of the retrofit (base, block, re-entry, memory, LoRA) whose name
    does not start with `skip`: the halting stage asserts with it that only the halting head moved."""
    state = {k: v.reshape(1) if v.dim() == 0 else full(v)  # a scalar (injection's alpha) has no bytes view
             for k, v in looped.state_dict().items() if not k.startswith(skip)}
    return weights_sha256(StateView(state))


# ----------------------------------------------------------------------------- run files
def retrofit_record(looped, base_spec: str, base_hash: str, groups: list[str]) -> dict:
    """Returns the content of retrofit.json: enough to rebuild the model without the recipe."""
    cfg = looped.config
    return {
        "format": FORMAT,
        "base": {"spec": base_spec, "sha256": base_hash, "model_type": cfg.model_type,
                 "n_layers": looped.n_layers, "d_model": cfg.hidden_size,
                 "dtype": str(next(looped.parameters()).dtype).removeprefix("torch."),
                 "attn_implementation": cfg._attn_implementation},
        "split": {"prelude": [0, looped.a], "block": [looped.a, looped.b], "coda": [looped.b, looped.n_layers]},
        "reentry": looped.retrofit_config.reentry,
        "settings": looped.retrofit_config.to_dict(),
        "trained_groups": groups,
        "tensors": {k: list(v.shape) for k, v in trained_state(looped, groups).items()},
    }


def code_version() -> str | None:
    """`git describe --always --dirty` of the workbench source tree, or None outside a checkout."""
    root = Path(__file__).resolve().parent.parent
    try:
        out = subprocess.run(["git", "-C", str(root), "describe", "--always", "--dirty"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def package_versions() -> dict[str, str | None]:
    """Installed versions of the packages a run depends on."""
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def write_provenance(run_dir: Path, manifests: dict, seeds: dict, extra: dict | None = None) -> dict:
    """Writes provenance.json over the run files present; returns it."""
    run_dir = Path(run_dir)
    record = {
        "format": FORMAT,
        "files": {name: (trainable_sha256 if name == TRAINABLE else sha256_file)(run_dir / name)
                  for name in RUN_FILES if (run_dir / name).exists()},
        "manifests": manifests,
        "code_version": code_version(),
        "packages": package_versions(),
        "seeds": seeds,
        **(extra or {}),
    }
    write_json_atomic(run_dir / PROVENANCE, record)
    return record


# ----------------------------------------------------------------------------- checkpoints
def _flatten_optimizer(state: dict, names: list[list[str]]) -> tuple[dict, dict]:
    tensors, scalars = {}, {}
    for idx, entry in state["state"].items():
        for key, value in entry.items():
            slot = f"state.{idx}.{key}"
            if torch.is_tensor(value):
                tensors[slot] = value
            else:
                scalars[slot] = value
    return tensors, {"param_groups": state["param_groups"], "param_names": names, "scalars": scalars}


def _unflatten_optimizer(tensors: dict, meta: dict) -> dict:
    state: dict[int, dict] = {}
    for slot, value in [*tensors.items(), *meta["scalars"].items()]:
        _, idx, key = slot.split(".", 2)
        state.setdefault(int(idx), {})[key] = value
    groups = [{k: tuple(v) if k == "betas" else v for k, v in g.items()} for g in meta["param_groups"]]
    return {"state": state, "param_groups": groups}


def save_checkpoint(run_dir: Path, step: int, looped, groups: list[str], optimizer, param_names: list[list[str]],
                    scheduler, trainer_state: dict, keep: int = 2, protect: int | None = None) -> Path:
    """Writes checkpoints/step_N/ atomically (a temporary directory renamed into place).

    `param_names` are the parameter names of each optimizer group, as `workbench.train.optim.make_optimizer`
    returns them; they are stored beside the optimizer state and checked when it is loaded.

    Keeps the `keep` newest checkpoints, and step `protect` (the last one that passed the guardrail).
    """
    root = Path(run_dir) / CHECKPOINTS
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step}"
    tmp = root / f".step_{step}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        save_tensors(tmp / TRAINABLE, trained_state(looped, groups))
        tensors, meta = _flatten_optimizer(optimizer.state_dict(), param_names)
        save_tensors(tmp / "optimizer.safetensors", tensors)
        write_json_atomic(tmp / "optimizer.json", meta)
        write_json_atomic(tmp / "scheduler.json", scheduler.state_dict())  # LambdaLR: numbers and [None] lambdas
        save_tensors(tmp / "rng.safetensors", {"torch_cpu": torch.get_rng_state()})
        write_json_atomic(tmp / "state.json", {**trainer_state, "step": step})
    except BaseException:  # Ctrl-C, SIGTERM (workbench.cli) or a full disk mid-save: no half checkpoint stays
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    for old in sorted(checkpoints(run_dir))[:-keep]:
        if old != protect:
            shutil.rmtree(root / f"step_{old}")
    return final


def discard_partial_checkpoints(run_dir: Path) -> None:
    """Removes the temporary directories of checkpoint saves that never finished (a killed run)."""
    for partial in (Path(run_dir) / CHECKPOINTS).glob(".step_*.tmp*"):
        shutil.rmtree(partial, ignore_errors=True)


def checkpoints(run_dir: Path) -> list[int]:
    """Steps of the complete checkpoints in a run directory, ascending."""
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    return sorted(int(p.name[5:]) for p in root.iterdir() if p.name.startswith("step_") and p.name[5:].isdigit())


def read_checkpoint_state(ckpt: Path) -> dict:
    """The trainer state (state.json) of a checkpoint directory: an object with an integer step and an optimizer.

    Raises:
        WorkbenchError: the file is not such an object (edited, or cut short).
    """
    path = Path(ckpt) / "state.json"
    state = read_json(path, "checkpoint state")
    if not isinstance(state.get("step"), int) or isinstance(state.get("step"), bool) or state["step"] < 1 \
            or not isinstance(state.get("optimizer"), str):
        raise WorkbenchError(f"{path}: needs an integer 'step' >= 1 and an 'optimizer' name; the checkpoint was edited")
    return state


def load_checkpoint(ckpt: Path, looped, groups: list[str], optimizer, param_names: list[list[str]],
                    scheduler) -> dict:
    """Restores trained tensors, optimizer, scheduler and RNG from `ckpt`; returns its trainer state.

    Raises:
        WorkbenchError: `param_names` (this run's optimizer groups) differ from the checkpoint's.
    """
    ckpt = Path(ckpt)
    load_trained(looped, ckpt / TRAINABLE, groups)
    meta = json.loads((ckpt / "optimizer.json").read_text())
    if param_names != meta["param_names"]:
        raise WorkbenchError(f"{ckpt / 'optimizer.json'}: optimizer parameters differ from this run's groups")
    optimizer.load_state_dict(_unflatten_optimizer(load_file(str(ckpt / "optimizer.safetensors")), meta))
    scheduler.load_state_dict(json.loads((ckpt / "scheduler.json").read_text()))
    torch.set_rng_state(load_file(str(ckpt / "rng.safetensors"))["torch_cpu"])
    return read_checkpoint_state(ckpt)
