"""Loading a finished run (or a shipped keeper) for probing, without the trainer.

`load_run(run_dir)` rebuilds a run's `LoopedLM` from its directory, strictly checked (every
file's SHA-256 against provenance.json, the base's weights against retrofit.json, every tensor
present and of its shape); `read_retrofit` reads the retrofit record alone, and
`resolve_run` turns a shipped keeper's name (`smollm2-chase`) into its directory, and
`load_checkpoint` / `load_model` resolve every `--checkpoint` spec a command takes (a run directory
or keeper name, a native looped model, `untrained:RUN_DIR`, `untrained:BASE:A:B`, and for the reading
commands a base with `--block`). The run directory's format is described in `workbench.train.rundir`,
which writes it; this module is the reading side that probes, notebooks and the public API
(`workbench.load_run`) use, so that none of them imports the training loop, its recipes or its optimizer.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from workbench.defaults import EMBEDDED_DEFAULT, resolve_run, shipped_keepers
from workbench.errors import WorkbenchError
from workbench.io import sha256_bytes, sha256_file
from workbench.loop.config import RetrofitConfig
from workbench.loop.surgery import retrofit
from workbench.models import TINY_CONFIGS, load_base, load_looped, weights_sha256
from workbench.models.native import native_family
from workbench.train.rundir import (
    PROVENANCE,
    RECIPE,
    RETROFIT,
    TRAINABLE,
    base_sha256,
    load_run,
    read_retrofit,
    verify_files,
)

__all__ = ["PROVENANCE", "RECIPE", "RETROFIT", "TRAINABLE", "UNTRAINED", "base_sha256", "load_checkpoint",
           "load_model", "load_run", "read_retrofit", "resolve_run", "verify_files"]

UNTRAINED = "untrained:"


def load_checkpoint(spec: str):
    """Returns (looped, tokenizer, info) for a run directory or an untrained retrofit.

    `spec` is a native looped model (`workbench.models.native`: a transformers Inkling2Loop or HRM-Text directory,
    `tiny-inkling2-loop`, `tiny-hrm-text`; kind "native"), a run directory or a shipped keeper's name
    (`workbench.train.rundir.load_run`: strictly checked) or
    `untrained:RUN_DIR` (the run's base and architecture with fresh re-entry and untrained block,
    the control of that run) or `untrained:BASE:A:B` (a fresh split-bridge retrofit of base
    model BASE at block A:B, max_loops 16). `info` holds path, kind, provenance_sha256, support
    (the max trained depth, None when untrained), base and settings.
    """
    if spec.startswith(UNTRAINED):
        return _untrained(spec)
    if native_family(spec) is not None:  # a native looped model (workbench.models.native): its own passes, nothing trained
        return _native(spec)

    spec = str(resolve_run(spec))
    looped, tok, info = load_run(spec)
    stages = info["recipe"].get("stages", [])
    depths = [d for s in stages if s.get("kind", "chain") != "halting" for d in s.get("depths", [])]
    return looped, tok, {
        "path": str(spec), "kind": "run", "provenance_sha256": sha256_file(Path(spec) / PROVENANCE),
        "support": max(depths) if depths else None, "base": info["retrofit"]["base"]["spec"],
        "base_sha256": base_sha256(looped.base), "settings": looped.retrofit_config.to_dict(),
    }


def load_model(spec: str, block: str | None = None):
    """Returns (looped, tokenizer, info) for any model a reading command takes (`lens`, `generate`).

    `spec` is what `load_checkpoint` takes (a run directory or keeper name, a native looped model,
    `untrained:...`), or a base model (an HF directory, a .gguf, the embedded default, a tiny config) with
    `block` "A:B": a fresh, untrained retrofit of that base looping layers A..B-1 (`untrained:BASE:A:B`).

    Raises:
        WorkbenchError: a base without `block`, a `block` beside a model that has its own, a malformed block.
    """
    spec = str(spec)
    if block is not None:
        lo, sep, hi = str(block).partition(":")
        if not sep or not lo.isdigit() or not hi.isdigit():
            raise WorkbenchError(f"--block '{block}' is not A:B (e.g. 10:16: layers 10..15 looped)")
        if spec.startswith(UNTRAINED) or native_family(spec) is not None or _is_run(spec):
            raise WorkbenchError(f"--block is for a base model; '{spec}' has its own block (drop --block)")
        return load_checkpoint(f"{UNTRAINED}{spec}:{lo}:{hi}")
    if not spec.startswith(UNTRAINED) and native_family(spec) is None and not _is_run(spec) and _is_base(spec):
        raise WorkbenchError(f"'{spec}' is a base model: give --block A:B to loop its layers A..B-1 "
                             f"(e.g. --block 10:16), or a run directory, keeper or native looped model")
    return load_checkpoint(spec)


def _is_run(spec: str) -> bool:
    return (resolve_run(spec) / RETROFIT).is_file()


def _is_base(spec: str) -> bool:
    path = Path(spec).expanduser()
    return spec in TINY_CONFIGS or spec == EMBEDDED_DEFAULT or path.suffix == ".gguf" or (path / "config.json").is_file()


def _native(spec: str):
    looped, tok = load_looped(spec)
    digest = weights_sha256(looped.base)
    settings = {"family": looped.family, "native_loops": looped.native_loops, "max_loops": looped.max_loops,
                "block": [looped.a, looped.b]}
    return looped, tok, {
        "path": spec, "kind": "native", "support": None, "base": spec, "base_sha256": digest,
        "settings": settings, "provenance_sha256": sha256_bytes(json.dumps({"native": settings, "weights": digest},
                                                                           sort_keys=True).encode()),
    }


def _untrained(spec: str):
    rest = str(resolve_run(spec[len(UNTRAINED):]))
    if (Path(rest) / RETROFIT).is_file():
        record, config = read_retrofit(rest)
        base = record["base"]["spec"]
        dtype, attn = getattr(torch, record["base"]["dtype"]), record["base"]["attn_implementation"]
    else:
        parts = rest.rsplit(":", 2)
        if len(parts) != 3 or not parts[0] or not all(p.isdigit() for p in parts[1:]):
            raise WorkbenchError(f"--checkpoint '{spec}' is not untrained:RUN_DIR or untrained:BASE:A:B "
                                 f"(e.g. untrained:{EMBEDDED_DEFAULT}:10:16); shipped keepers (RUN_DIR by name): "
                                 f"{', '.join(shipped_keepers())}")
        base, config = parts[0], RetrofitConfig(block=(int(parts[1]), int(parts[2])))
        dtype, attn = torch.float32, "eager"
    model, tok = load_base(base, dtype=dtype, attn_implementation=attn)
    looped = retrofit(model, config)  # a LoRA adapter is present with B = 0: it changes nothing
    looped.eval()
    for p in looped.parameters():
        p.requires_grad_(False)
    digest = base_sha256(looped.base)
    settings = looped.retrofit_config.to_dict()
    identity = {"untrained": True, "base": base, "base_sha256": digest, "settings": settings}
    return looped, tok, {
        "path": spec, "kind": "untrained", "support": None, "base": base, "base_sha256": digest,
        "settings": settings,
        "provenance_sha256": sha256_bytes(json.dumps(identity, sort_keys=True).encode()),
    }

