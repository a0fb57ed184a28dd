"""The run format and its reading side: a finished run (or a shipped keeper) loaded for probing, every
`--checkpoint` spec resolved, without the trainer.

    runs/<name>/
      trainable.safetensors   the trained tensors only (block + bridge for full-block runs; LoRA
                              tensors + bridge for LoRA runs; + memory / halting when present),
                              named as in `LoopedLM.named_parameters()`; never the base again. A run
                              continued from a parent (v2) holds only the tensors it changed and names
                              the parent by path and digest (`workbench.run_tensors`)
      retrofit.json           base spec + SHA-256 of its weights, split, re-entry, and under
                              "settings" exactly `looped.retrofit_config.to_dict()`
      recipe.toml             the resolved recipe, overrides included
      provenance.json         SHA-256 of every file above and of metrics.jsonl, row manifests,
                              code version, package versions, seeds
      metrics.jsonl           one JSON object per logged step / evaluation
      checkpoints/            a run in progress (`workbench.train.rundir` writes them, `workbench.train.resume`
                              reads them)

`load_run(run_dir)` rebuilds a run's `LoopedLM`, strictly checked: every file's SHA-256 against provenance.json,
the base's weights against retrofit.json, every tensor present, of its shape and finite (`load_trained`);
`read_retrofit` reads the retrofit record alone, `resolve_run` turns a shipped keeper's name (`smollm2-chase`)
into its directory, `export_run` copies a finished run without its checkpoints, and `load_checkpoint` loads every
`--checkpoint` / `--model` spec a command takes, parsed once into a `workbench.checkpoints.Checkpoint` (a run
directory or keeper name, a native looped model, `untrained:RUN_DIR`, `untrained:BASE:A:B`, and for the reading
commands a base with `--block`). `load_run` and `load_checkpoint`'s run and untrained kinds share one path: a
`Rebuild` says what to build, read before anything loads, and builds it in one pass. Probes, notebooks and the
public API (`workbench.load_run`) read runs through here; training writes them through `workbench.train.rundir`,
which imports this module, never the other way.

The file names above and `holds_run` are declared in `workbench.places`, below the output guard, and the run's output
kind (`RUN_OUTPUT`) in `workbench.guard.in_place`, which every guard asks to recognise its own before any output
whatever the writer; they are imported here and may be taken from either.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import tomllib
import torch

from workbench.checkpoints import NATIVE, RUN, Checkpoint
from workbench.defaults import resolve_run, shipped_keepers
from workbench.errors import WorkbenchError
from workbench.guard import RUN_OUTPUT, WHOLE, OutputKind, guard_output  # noqa: F401  (RUN_OUTPUT: importers take it here)
from workbench.io import sha256_bytes, sha256_file
from workbench.loop.config import RetrofitConfig
from workbench.loop.surgery import parameter_groups, retrofit
from workbench.models import load_base, load_looped, weights_sha256
from workbench.models.native import require_tokenizer
from workbench.places import (  # noqa: F401  (the run's file names and kind: importers keep taking them from here)
    CHECKPOINTS,
    FORMAT,
    METRICS,
    PROVENANCE,
    RECIPE,
    RETROFIT,
    RUN_ENTRIES,
    RUN_FILES,
    TRAINABLE,
    holds_run,
)
from workbench.precision import PRECISION_DTYPES, apply_precision
from workbench.readers import read_json
from workbench.run_tensors import read_tensors, repoint, trainable_sha256

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from workbench.loop.looped import LoopedLM

# What `export_run` writes: a finished run without its checkpoints, written whole into a new directory.
EXPORT_OUTPUT = OutputKind("exported run", WHOLE)


class StateView:
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
    state = {k.replace(".base_layer.", "."): v for k, v in base.state_dict().items() if "lora_" not in k}
    return weights_sha256(StateView(state))


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
            expect, or a shape / dtype differs; the message names the file and the tensor. A delta
            file's missing or changed parent (`run_tensors.read_tensors`).
    """
    expected = trained_state(looped, groups)
    loaded, _ = read_tensors(path)   # a delta file's parents resolved and checked by digest
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


def verify_files(run_dir: Path) -> dict:
    """Returns provenance.json after checking every file it lists (and every run file) by hash.

    trainable.safetensors is checked by its state's digest (`run_tensors.trainable_sha256`: a whole file's
    SHA-256; a delta's parents resolved, each checked against the digest its child names).
    """
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
        if (trainable_sha256 if name == TRAINABLE else sha256_file)(path) != digest:
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


@dataclass(frozen=True)
class Rebuild:
    """What a retrofit checkpoint is rebuilt from, read before anything loads; `build` makes its model in one pass.

    A finished run's (`of_run`: every file checked by hash, its trained tensors loaded on top), an untrained
    control's (its run's architecture alone, nothing trained) or a fresh retrofit's (a base at a block).

    Attributes:
        base: the base model's spec; `dtype` and `attn_implementation`: how it is loaded.
        config: the retrofit's architecture.
        run_dir: the run read (a run, or the run an untrained control copies); None for a base at a block.
        record: that run's retrofit.json.
        trained: whether the run's trained tensors load on top (its base's SHA-256 checked against `record`).
        provenance, recipe: a trained run's provenance.json and resolved recipe.
    """

    base: str
    dtype: torch.dtype
    attn_implementation: str
    config: RetrofitConfig
    run_dir: Path | None = None
    record: dict | None = None
    trained: bool = False
    provenance: dict | None = None
    recipe: dict | None = None

    @classmethod
    def of_checkpoint(cls, checkpoint: Checkpoint) -> Rebuild:
        """A parsed retrofit `Checkpoint`'s (kind "run" or "untrained")."""
        if checkpoint.kind == RUN:
            return cls.of_run(checkpoint.run_dir)
        if checkpoint.run_dir is None:
            return cls(checkpoint.base, torch.float32, "eager", RetrofitConfig(block=checkpoint.block))
        return cls.of_record(checkpoint.run_dir, *read_retrofit(checkpoint.run_dir))

    @classmethod
    def of_run(cls, run_dir: Path, base: str | None = None, dtype: torch.dtype | None = None) -> Rebuild:
        """A finished run's, its files checked against provenance.json first (`load_run` gives the arguments)."""
        if not run_dir.is_dir():
            raise WorkbenchError(f"run directory '{run_dir}' {'is a file' if run_dir.exists() else 'does not exist'}; "
                                 f"give a run directory or a shipped keeper's name: {', '.join(shipped_keepers())}")
        prov = verify_files(run_dir)
        record, config = read_retrofit(run_dir)
        return cls.of_record(run_dir, record, config, base, dtype, trained=True, provenance=prov,
                             recipe=tomllib.loads((run_dir / RECIPE).read_text()))

    @classmethod
    def of_record(cls, run_dir: Path, record: dict, config: RetrofitConfig, base: str | None = None,
                  dtype: torch.dtype | None = None, **trained) -> Rebuild:
        """From a run's retrofit record (`read_retrofit`): its base loaded as recorded unless `base` / `dtype` say
        otherwise; `trained` holds the fields of a trained run."""
        return cls(base or record["base"]["spec"], dtype or getattr(torch, record["base"]["dtype"]),
                   record["base"]["attn_implementation"], config, run_dir, record, **trained)

    def build(self) -> tuple[LoopedLM, PreTrainedTokenizerBase, str]:
        """Returns (looped, tokenizer, the base's `base_sha256`): the base loaded and hashed once (a trained run's
        digest checked against its record), retrofitted, a run's trained tensors loaded, every parameter frozen, in
        eval mode.

        Raises:
            WorkbenchError: a base whose SHA-256 differs from the record, settings no retrofit takes, a missing,
                unexpected or non-finite trained tensor (`load_trained`).
        """
        model, tok = load_base(self.base, dtype=self.dtype, attn_implementation=self.attn_implementation)
        digest = base_sha256(model)
        if self.trained and digest != self.record["base"]["sha256"]:
            raise WorkbenchError(f"base model '{self.base}' has weights SHA-256 {digest[:12]}..., but "
                                 f"{self.run_dir / RETROFIT} records {self.record['base']['sha256'][:12]}... "
                                 "(a different base)")
        try:
            looped = retrofit(model, self.config)  # a LoRA adapter is present with B = 0: it changes nothing
        except (TypeError, KeyError, ValueError) as err:  # settings edited by hand: a value no retrofit takes
            if self.record is None:
                raise
            raise WorkbenchError(f"{self.run_dir / RETROFIT}: its settings do not rebuild a retrofit "
                                 f"({type(err).__name__}: {str(err).splitlines()[0][:160] if str(err) else ''})") from None
        if self.trained:
            load_trained(looped, self.run_dir / TRAINABLE, self.record["trained_groups"])
        looped.eval()
        for p in looped.parameters():
            p.requires_grad_(False)
        return looped, tok, digest

    def info(self, checkpoint: Checkpoint, looped: LoopedLM, digest: str) -> dict:
        """`load_checkpoint`'s info of the model `build` made from the base of SHA-256 `digest`: a trained run is
        identified by its provenance.json, an untrained retrofit by its base, base digest and settings."""
        settings = looped.retrofit_config.to_dict()
        if self.trained:
            if "block" in self.record["trained_groups"]:   # a trained block is the base's own layers (weights
                digest = base_sha256(looped.base)          # shared): the base is recorded as loaded
            stages = self.recipe.get("stages", [])
            depths = [d for s in stages if s.get("kind", "chain") != "halting" for d in s.get("depths", [])]
            path, support = str(self.run_dir), max(depths) if depths else None
            provenance = sha256_file(self.run_dir / PROVENANCE)
        else:
            identity = {"untrained": True, "base": self.base, "base_sha256": digest, "settings": settings}
            path, support = checkpoint.given, None
            provenance = sha256_bytes(json.dumps(identity, sort_keys=True).encode())
        return {"path": path, "kind": checkpoint.kind, "support": support, "provenance_sha256": provenance,
                "base": self.base, "base_sha256": digest, "settings": settings}


def load_run(run_dir: str | os.PathLike, base: str | None = None, dtype: torch.dtype | None = None,
             precision: str | None = None) -> tuple[LoopedLM, PreTrainedTokenizerBase, dict]:
    """Returns `(looped, tokenizer, info)` rebuilt from a run directory, strictly checked.

    Args:
        run_dir: a finished run directory, or a shipped keeper's name (`smollm2-chase`, as the README and
            docs/api.md promise) or directory (training/keepers/smollm2-chase).
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
    return rebuild_run(resolve_run(run_dir), base, dtype, precision)


def rebuild_run(run_dir: Path, base: str | None = None, dtype: torch.dtype | None = None,
                precision: str | None = None) -> tuple[LoopedLM, PreTrainedTokenizerBase, dict]:
    """`load_run` of a run directory already resolved (a parsed `Checkpoint`'s `run_dir`)."""
    plan = Rebuild.of_run(run_dir, base, dtype)
    looped, tok, _ = plan.build()
    if precision == "recorded":
        precision = (plan.provenance.get("precision") or {}).get("used", "fp32")
    if precision is not None:
        set_run_precision(looped, plan.record["trained_groups"], precision)
    return looped, tok, {"retrofit": plan.record, "provenance": plan.provenance, "recipe": plan.recipe,
                         "run_dir": str(run_dir)}


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
    guard = guard_output(dest, "export", kind=EXPORT_OUTPUT, reading=[run_dir])  # before any work; re-checked at the move
    prov = verify_files(run_dir)
    tmp = dest.with_name(f".{dest.name}.tmp{os.getpid()}")
    tmp.mkdir(parents=True)
    try:
        for name in [*prov["files"], PROVENANCE]:
            if name == TRAINABLE:   # a delta's parent path is re-pointed from the new place; its digest holds
                repoint(run_dir / name, tmp / name, dest)
            else:
                shutil.copy2(run_dir / name, tmp / name)
        if dest.exists():
            raise WorkbenchError(f"'{dest}' appeared while the run was copied; nothing replaced")
        guard.commit_dir(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def load_checkpoint(checkpoint: Checkpoint):
    """Returns (looped, tokenizer, info) for a parsed `--checkpoint` / `--model` spec.

    `checkpoint` (`workbench.checkpoints.parse_checkpoint` / `parse_model`) is a native looped model (its own
    passes, nothing trained; stored in the checkpoint's precision), a run directory (`load_run`: strictly checked)
    or an untrained retrofit: a run's architecture with fresh re-entry and untrained block (the control of that
    run), or a fresh split-bridge retrofit of a base at a block (max_loops 16). A retrofit comes back in fp32, exact;
    `workbench.precision.apply_precision` switches it to bf16 reads. `info` holds path, kind, provenance_sha256,
    support (the max trained depth, None when untrained), base and settings.
    """
    if checkpoint.kind == NATIVE:
        return _native(checkpoint)
    plan = Rebuild.of_checkpoint(checkpoint)
    looped, tok, digest = plan.build()
    return looped, tok, plan.info(checkpoint, looped, digest)


def _native(checkpoint: Checkpoint):
    spec = checkpoint.given
    looped, tok = load_looped(spec, dtype=PRECISION_DTYPES[checkpoint.precision])
    looped.precision = checkpoint.precision   # a label: a native model runs in the dtype it is stored in
    require_tokenizer(tok, spec)
    digest = weights_sha256(looped.base)
    settings = {"family": looped.family, "native_loops": looped.native_loops, "max_loops": looped.max_loops,
                "block": [looped.a, looped.b]}
    return looped, tok, {
        "path": spec, "kind": "native", "support": None, "base": spec, "base_sha256": digest,
        "settings": settings, "provenance_sha256": sha256_bytes(json.dumps({"native": settings, "weights": digest},
                                                                           sort_keys=True).encode()),
    }
