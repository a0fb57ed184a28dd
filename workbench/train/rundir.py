"""Run directories (docs/architecture.md): what a training run writes, and strict loading of it.

    runs/<name>/
      trainable.safetensors   the trained tensors only (block + bridge for full-block runs; LoRA
                              tensors + bridge for LoRA runs; + memory / halting when present),
                              named as in `LoopedLM.named_parameters()`; never the base again
      retrofit.json           base spec + SHA-256 of its weights, split, re-entry, and under
                              "settings" exactly `looped.retrofit_config.to_dict()`
      recipe.toml             the resolved recipe, overrides included
      provenance.json         SHA-256 of every file above and of metrics.jsonl, row manifests,
                              code version, package versions, seeds
      metrics.jsonl           one JSON object per logged step / evaluation
      checkpoints/step_N/     resumable state: trainable.safetensors, optimizer.safetensors +
                              optimizer.json, scheduler.json, rng.safetensors, state.json

No pickle anywhere: tensors go through safetensors, everything else through JSON. Every file
is written to a temporary name and `os.replace`d. Loading is strict: a file whose hash differs
from provenance.json, a base whose weights differ from retrofit.json, or a missing /
unexpected / misshapen tensor is a `WorkbenchError` naming the file or tensor.
"""

from __future__ import annotations

import errno
import importlib.metadata
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import tomllib
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from workbench.defaults import resolve_run, shipped_keepers
from workbench.errors import WorkbenchError
from workbench.io import atomic_path, gate_output, read_json, sha256_file, write_json_atomic
from workbench.loop.config import RetrofitConfig
from workbench.loop.surgery import parameter_groups, retrofit
from workbench.models import load_base, weights_sha256
from workbench.precision import apply_precision
from workbench.train.sharding import full  # an FSDP2-sharded base hashes its full tensors

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from workbench.loop.looped import LoopedLM

TRAINABLE = "trainable.safetensors"
RETROFIT = "retrofit.json"
RECIPE = "recipe.toml"
PROVENANCE = "provenance.json"
METRICS = "metrics.jsonl"
CHECKPOINTS = "checkpoints"
RUN_FILES = (TRAINABLE, RETROFIT, RECIPE, METRICS)
FORMAT = "workbench-run-v1"
PACKAGES = ("torch", "transformers", "peft", "safetensors", "accelerate", "transformer-lens", "workbench")


# ----------------------------------------------------------------------------- atomic files
def save_tensors(path: Path, tensors: dict[str, torch.Tensor], metadata: dict | None = None) -> None:
    """Writes a safetensors file atomically (contiguous CPU copies of the tensors)."""
    with atomic_path(path) as tmp:
        try:
            save_file({k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}, str(tmp), metadata=metadata)
        except SafetensorError as err:  # the machine's failure (a full disk): an OSError, one line and exit 1
            first = str(err).splitlines()[0] if str(err) else "write failed"
            code = errno.ENOSPC if "No space" in first or "StorageFull" in first else errno.EIO
            raise OSError(code, "No space left on device" if code == errno.ENOSPC else first[:160], str(path)) from None


# ----------------------------------------------------------------------------- what is saved
class _StateView:
    """Duck-types `state_dict()` for `weights_sha256` over a filtered state."""

    def __init__(self, state: dict):
        self._state = state

    def state_dict(self) -> dict:
        return self._state


def base_sha256(base: torch.nn.Module) -> str:
    """Returns `weights_sha256` of the base's own (non-LoRA) weights.

    peft renames a wrapped projection's weight `x.base_layer.weight`; the name is mapped back,
    so the hash of a base with an adapter injected equals the hash of the untouched base.
    """
    state = {k.replace(".base_layer.", "."): full(v) for k, v in base.state_dict().items() if "lora_" not in k}
    return weights_sha256(_StateView(state))


def state_sha256(looped: torch.nn.Module, skip: str = "halting.") -> str:
    """Returns `weights_sha256` of every tensor of the retrofit (base, block, re-entry, memory, LoRA) whose name
    does not start with `skip`: Stage 2 asserts with it that only the halting head moved."""
    state = {k: v.reshape(1) if v.dim() == 0 else full(v)  # a scalar (injection's alpha) has no bytes view
             for k, v in looped.state_dict().items() if not k.startswith(skip)}
    return weights_sha256(_StateView(state))


def trained_groups(config: RetrofitConfig, block_trainable: bool) -> list[str]:
    """The parameter groups (`surgery.parameter_groups`) a run of this retrofit trains and saves."""
    groups = ["block"] if block_trainable else []
    if config.lora is not None:
        groups.append("lora")
    groups.append("reentry")
    groups += [g for g in ("memory", "halting", "loop_codes") if getattr(config, g)]
    return groups


def trained_state(looped, groups: list[str]) -> dict[str, torch.Tensor]:
    """Returns {parameter name: tensor} for every parameter of `groups`."""
    named = parameter_groups(looped)
    return {name: p for g in groups for name, p in named[g]}


def load_trained(looped, path: Path, groups: list[str]) -> None:
    """Copies the tensors of `path` into `looped`, strictly (load_state_dict(strict=True) semantics).

    Raises:
        WorkbenchError: a tensor the model expects is missing, the file holds one it does not
            expect, or a shape / dtype differs; the message names the file and the tensor.
    """
    expected = trained_state(looped, groups)
    try:
        loaded = load_file(str(path))
    except (SafetensorError, OSError) as err:  # a pickle renamed, a file cut short
        raise WorkbenchError(f"{path}: not a readable safetensors file ({str(err).splitlines()[0][:120]})") from None
    missing = sorted(set(expected) - set(loaded))
    unexpected = sorted(set(loaded) - set(expected))
    if missing:
        raise WorkbenchError(f"{path}: missing tensor '{missing[0]}' ({len(missing)} missing) for groups {groups}")
    if unexpected:
        raise WorkbenchError(f"{path}: unexpected tensor '{unexpected[0]}' ({len(unexpected)} unexpected) "
                             f"for groups {groups}")
    with torch.no_grad():
        for name, param in expected.items():
            value = loaded[name]
            if value.shape != param.shape or value.dtype != param.dtype:
                raise WorkbenchError(f"{path}: tensor '{name}' is {tuple(value.shape)} {value.dtype}, "
                                     f"the model has {tuple(param.shape)} {param.dtype}")
            if value.is_floating_point() and not torch.isfinite(value).all():
                raise WorkbenchError(f"{path}: tensor '{name}' holds NaN or inf; a run's trained tensors must be "
                                     "finite (the run diverged, or the file was edited)")
            param.copy_(value)


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
        "files": {name: sha256_file(run_dir / name) for name in RUN_FILES if (run_dir / name).exists()},
        "manifests": manifests,
        "code_version": code_version(),
        "packages": package_versions(),
        "seeds": seeds,
        **(extra or {}),
    }
    write_json_atomic(run_dir / PROVENANCE, record)
    return record


def verify_files(run_dir: Path) -> dict:
    """Returns provenance.json after checking every file it lists (and every run file) by hash."""
    run_dir = Path(run_dir)
    prov_path = run_dir / PROVENANCE
    if not prov_path.is_file():
        raise WorkbenchError(f"'{run_dir}' is not a finished run directory: {PROVENANCE} is missing")
    prov = read_json(prov_path, "provenance")
    if prov.get("status") == "stopped_by_guardrail":
        g = prov.get("guardrail") or {}
        raise WorkbenchError(f"'{run_dir}' was stopped by the capability guardrail at step {prov.get('stopped_at_step')} "
                             f"({g.get('final')}/{g.get('total')} against the base's {g.get('base')}, allowed drop "
                             f"{g.get('max_drop')} points) and yields no checkpoint to load or export; its last passing "
                             f"state is {prov.get('last_passing_checkpoint')}")
    for name in (TRAINABLE, RETROFIT, RECIPE):
        if name not in prov.get("files", {}):
            raise WorkbenchError(f"{prov_path}: no SHA-256 recorded for '{name}'")
    for name, digest in prov["files"].items():
        path = run_dir / name
        if not path.is_file():
            raise WorkbenchError(f"{path}: file listed in {PROVENANCE} is missing")
        if sha256_file(path) != digest:
            raise WorkbenchError(f"{path}: SHA-256 differs from the one recorded in {PROVENANCE}")
    return prov


def set_run_precision(looped, groups: list[str], precision: str) -> int:
    """Stores every tensor outside the trained `groups` in `precision` (trained ones stay fp32), as the trainer
    does (`workbench.precision.apply_precision`); returns how many tensors were cast."""
    trained = {id(p) for p in trained_state(looped, groups).values()}
    flags = {p: p.requires_grad for p in looped.parameters()}
    for p in looped.parameters():
        p.requires_grad_(id(p) in trained)
    try:
        return apply_precision(looped, precision)
    finally:
        for p, flag in flags.items():
            p.requires_grad_(flag)


RECORD_FIELDS = {"base": dict, "settings": dict, "trained_groups": list}
BASE_FIELDS = {"spec": str, "sha256": str, "dtype": str, "attn_implementation": str}
DTYPES = ("float32", "bfloat16", "float16")
GROUPS = ("block", "lora", "reentry", "memory", "halting", "loop_codes")  # `trained_groups`


def read_retrofit(run_dir: str | os.PathLike) -> tuple[dict, RetrofitConfig]:
    """Returns (retrofit.json of a run directory, its RetrofitConfig) after checking the fields `load_run`
    rebuilds the model from; hashes are not checked here.

    Raises:
        WorkbenchError: no retrofit.json, not a JSON object, a field missing or of the wrong type, or
            settings that do not form a RetrofitConfig.
    """
    path = Path(run_dir) / RETROFIT
    if not path.is_file():
        raise WorkbenchError(f"'{run_dir}' is not a run directory: {RETROFIT} is missing")
    record = read_json(path, "retrofit record")
    for fields, node, where in ((RECORD_FIELDS, record, ""), (BASE_FIELDS, record.get("base"), "base.")):
        for name, kind in fields.items():
            if not isinstance(node, dict) or not isinstance(node.get(name), kind):
                raise WorkbenchError(f"{path}: field '{where}{name}' is missing or not a {kind.__name__}; the "
                                     "file is incomplete or was edited")
    for key, accepted in (("dtype", DTYPES), ("attn_implementation", ("eager", "sdpa"))):
        if record["base"][key] not in accepted:
            raise WorkbenchError(f"{path}: base.{key} {record['base'][key]!r} is not one of {', '.join(accepted)}")
    unknown = [g for g in record["trained_groups"] if g not in GROUPS]
    if unknown:
        raise WorkbenchError(f"{path}: trained group {unknown[0]!r} is unknown; groups: {', '.join(GROUPS)}")
    try:
        return record, RetrofitConfig.from_dict(record["settings"])
    except (TypeError, KeyError, ValueError, WorkbenchError) as err:
        first = str(err).splitlines()[0][:160] if str(err) else type(err).__name__
        raise WorkbenchError(f"{path}: its settings are not a retrofit's ({first})") from None


def load_run(run_dir: str | os.PathLike, base: str | None = None, dtype: torch.dtype | None = None,
             precision: str | None = None) -> tuple[LoopedLM, PreTrainedTokenizerBase, dict]:
    """Returns `(looped, tokenizer, info)` rebuilt from a run directory, strictly checked.

    Args:
        run_dir: a finished run directory (or a shipped keeper such as training/keepers/smollm2-chase).
        base: load the base from here instead of retrofit.json's spec (its hash must still match).
        dtype: parameter dtype; default the one recorded in retrofit.json.
        precision: None (fp32, exact), "fp32", "bf16", or "recorded": the precision the run trained in
            (provenance.json), frozen tensors cast exactly as the trainer cast them, so its evaluations
            are reproduced bit for bit.
    Returns:
        looped: the LoopedLM in eval mode; tokenizer: the base's; info: dict with `retrofit`,
        `provenance`, `recipe` (the resolved recipe) and `run_dir`.
    Raises:
        WorkbenchError: a file whose hash differs from provenance.json, a base whose SHA-256
            differs from retrofit.json, or a missing / unexpected tensor.
    """
    run_dir = resolve_run(run_dir)   # a shipped keeper's name, as the README and docs/api.md promise
    if not run_dir.is_dir():
        raise WorkbenchError(f"run directory '{run_dir}' {'is a file' if run_dir.exists() else 'does not exist'}; "
                             f"give a run directory or a shipped keeper's name: {', '.join(shipped_keepers())}")
    prov = verify_files(run_dir)
    record, config = read_retrofit(run_dir)
    spec = base or record["base"]["spec"]
    dtype = dtype or getattr(torch, record["base"]["dtype"])
    model, tok = load_base(spec, dtype=dtype, attn_implementation=record["base"]["attn_implementation"])
    digest = base_sha256(model)
    if digest != record["base"]["sha256"]:
        raise WorkbenchError(f"base model '{spec}' has weights SHA-256 {digest[:12]}..., but {run_dir / RETROFIT} "
                             f"records {record['base']['sha256'][:12]}... (a different base)")
    try:
        looped = retrofit(model, config)
    except (TypeError, KeyError, ValueError) as err:  # settings edited by hand: a value no retrofit takes
        raise WorkbenchError(f"{run_dir / RETROFIT}: its settings do not rebuild a retrofit ({type(err).__name__}: "
                             f"{str(err).splitlines()[0][:160] if str(err) else ''})") from None
    load_trained(looped, run_dir / TRAINABLE, record["trained_groups"])
    looped.eval()
    for p in looped.parameters():
        p.requires_grad_(False)
    if precision == "recorded":
        precision = (prov.get("precision") or {}).get("used", "fp32")
    if precision is not None:
        set_run_precision(looped, record["trained_groups"], precision)
    recipe = tomllib.loads((run_dir / RECIPE).read_text())
    return looped, tok, {"retrofit": record, "provenance": prov, "recipe": recipe, "run_dir": str(run_dir)}


def export_run(run_dir: str | os.PathLike, dest: str | os.PathLike) -> Path:
    """Copies a finished run without its checkpoints (a keeper to ship), after verifying it.

    Raises:
        WorkbenchError: the run fails its provenance check, or `dest` already exists.
    """
    run_dir, dest = Path(run_dir), Path(dest)
    if dest.exists() or dest.is_symlink():
        raise WorkbenchError(f"'{dest}' already exists; remove it or choose another destination")
    if run_dir.resolve() in dest.resolve().parents:
        raise WorkbenchError(f"'{dest}' lies inside '{run_dir}', which this command reads; export elsewhere")
    gate = gate_output(dest, "export", reading=[run_dir])  # before any work; re-checked at the move
    prov = verify_files(run_dir)
    tmp = dest.with_name(f".{dest.name}.tmp{os.getpid()}")
    tmp.mkdir(parents=True)
    try:
        for name in [*prov["files"], PROVENANCE]:
            shutil.copy2(run_dir / name, tmp / name)
        if dest.exists():
            raise WorkbenchError(f"'{dest}' appeared while the run was copied; nothing replaced")
        gate.commit_dir(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


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
