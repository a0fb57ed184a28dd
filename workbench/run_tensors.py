"""A run's trained tensors on disk: a whole file, or only what the run trained beside a parent it names.

    whole file (workbench-run-v1, and a v2 run without a parent): every trained tensor, no header metadata.
    delta file (workbench-run-v2, a run continued from a parent: a Stage 2 head, an anneal, a continuation):
        the tensors whose bytes differ from the parent's, under the header metadata
            format          "workbench-run-v2"
            parent          the parent run directory, relative to this run's directory
            parent_sha256   the parent's trainable digest (its provenance.json records the same)

A run's state is its parent's state (resolved the same way, recursively) updated by its own tensors. Its digest,
what provenance.json records for trainable.safetensors and a child's lineage as `trainable_sha256`, is the SHA-256
of that state written as a whole file (`safetensors.torch.save`, no metadata): for a whole file its bytes' SHA-256,
so a v1 run's records read unchanged, and a specimen rewritten to a delta keeps its provenance.json byte for byte.
Every read checks each parent's digest against the one its child names; a missing or changed parent is one line
naming both files.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save, save_file

from workbench.errors import WorkbenchError
from workbench.io import atomic_path, sha256_bytes, sha256_file
from workbench.places import TRAINABLE

DELTA = "workbench-run-v2"   # the header's format of a file holding only what its run trained
MAX_DEPTH = 32               # parents resolved before a chain is called circular


def header(path: Path) -> dict[str, str]:
    """Returns the header metadata of a safetensors file ({} for a whole file written without any).

    Raises:
        WorkbenchError: not a readable safetensors file.
    """
    try:
        with safe_open(str(path), framework="pt") as f:
            return dict(f.metadata() or {})
    except (SafetensorError, OSError) as err:  # a pickle renamed, a file cut short
        raise WorkbenchError(f"{path}: not a readable safetensors file ({str(err).splitlines()[0][:120]})") from None


def is_delta(path: Path) -> bool:
    """Whether `path` holds only its run's own tensors beside a parent it names."""
    return header(path).get("format") == DELTA


def state_sha256(tensors: dict[str, torch.Tensor]) -> str:
    """The digest of a trained state: SHA-256 of the state written as a whole safetensors file."""
    return sha256_bytes(save({k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}))


def read_tensors(path: str | os.PathLike, _depth: int = 0) -> tuple[dict[str, torch.Tensor], str]:
    """Returns (the whole trained state a tensor file stands for, its digest), parents resolved and checked.

    Raises:
        WorkbenchError: an unreadable file, a parent that is missing or whose digest differs from the one the
            child names (the message names both files), or a chain of parents that does not end.
    """
    path = Path(path)
    meta = header(path)
    try:
        own = load_file(str(path))
    except (SafetensorError, OSError) as err:
        raise WorkbenchError(f"{path}: not a readable safetensors file ({str(err).splitlines()[0][:120]})") from None
    if meta.get("format") != DELTA:
        return own, sha256_file(path)
    if "parent" not in meta or "parent_sha256" not in meta:
        raise WorkbenchError(f"{path}: a {DELTA} file without 'parent' and 'parent_sha256' in its header")
    if _depth >= MAX_DEPTH:
        raise WorkbenchError(f"{path}: more than {MAX_DEPTH} parents above it (a circular chain?)")
    parent = Path(os.path.normpath(path.parent / meta["parent"])) / TRAINABLE
    if not parent.is_file():
        raise WorkbenchError(f"{path}: its parent {parent} is missing (this file holds only what its run trained; "
                             "the rest is the parent's)")
    inherited, digest = read_tensors(parent, _depth + 1)
    if digest != meta["parent_sha256"]:
        raise WorkbenchError(f"{path}: its parent {parent} has digest {digest[:12]}..., the file names "
                             f"{meta['parent_sha256'][:12]}... (the parent changed)")
    state = inherited | own
    return state, state_sha256(state)


def trainable_sha256(path: str | os.PathLike) -> str:
    """The digest provenance.json records for a tensor file (its bytes' SHA-256 when it is whole)."""
    return read_tensors(path)[1] if is_delta(Path(path)) else sha256_file(Path(path))


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors have one dtype, one shape and the same bytes (NaN and -0.0 included)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.reshape(-1).contiguous().view(torch.uint8), b.reshape(-1).contiguous().view(torch.uint8))


def own_tensors(state: dict[str, torch.Tensor], inherited: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The tensors of `state` whose bytes differ from the parent's (`inherited`) or that the parent lacks."""
    return {k: v for k, v in state.items() if k not in inherited or not same_bytes(v, inherited[k])}


def write_tensors(path: Path, state: dict[str, torch.Tensor], parent_dir: Path | None = None) -> str:
    """Writes a run's trained state atomically; returns its digest.

    Without `parent_dir` the file is whole. With it, the file holds `own_tensors` and names the parent by its path
    relative to `path`'s directory and by its digest.

    Raises:
        WorkbenchError: the state holds none of the parent's tensors' names yet drops some (not a continuation), or
            the parent fails its own checks.
        OSError: the disk is full.
    """
    state = {k: v.detach().to("cpu").contiguous() for k, v in state.items()}
    if parent_dir is None:
        save_tensors(path, state, None)
        return sha256_file(path)
    inherited, digest = read_tensors(Path(parent_dir) / TRAINABLE)
    dropped = sorted(set(inherited) - set(state))
    if dropped:
        raise WorkbenchError(f"{path}: the parent {parent_dir} holds '{dropped[0]}', which this run does not train; "
                             "a delta file only adds to or replaces its parent's tensors")
    rel = Path(os.path.relpath(Path(parent_dir).resolve(), Path(path).parent.resolve())).as_posix()
    save_tensors(path, own_tensors(state, inherited), {"format": DELTA, "parent": rel, "parent_sha256": digest})
    return state_sha256(state)


def repoint(src: Path, dest: Path, home: Path) -> None:
    """Copies tensor file `src` to `dest`, a delta's parent path rewritten relative to `home`, the run directory the
    copy will stand in (its digest, and so provenance.json, unchanged)."""
    meta = header(src)
    if meta.get("format") != DELTA:
        shutil.copy2(src, dest)
        return
    parent = (src.parent / meta["parent"]).resolve()
    rel = Path(os.path.relpath(parent, Path(home).resolve())).as_posix()
    save_tensors(dest, load_file(str(src)), {**meta, "parent": rel})


def save_tensors(path: Path, tensors: dict[str, torch.Tensor], metadata: dict | None = None) -> None:
    """Writes a safetensors file atomically (contiguous CPU copies of the tensors)."""
    with atomic_path(path) as tmp:
        try:
            save_file({k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}, str(tmp), metadata=metadata)
        except SafetensorError as err:  # the machine's failure (a full disk): an OSError, one line and exit 1
            first = str(err).splitlines()[0] if str(err) else "write failed"
            code = errno.ENOSPC if "No space" in first or "StorageFull" in first else errno.EIO
            raise OSError(code, "No space left on device" if code == errno.ENOSPC else first[:160], str(path)) from None
