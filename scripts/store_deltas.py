"""Rewrites committed runs continued from a parent to delta files (`workbench.run_tensors`), checked, idempotent.

    .venv/bin/python scripts/store_deltas.py training/halting/keeper-oracle [RUN_DIR ...]
    .venv/bin/python scripts/store_deltas.py --limit 10 [--dry-run]

A run qualifies when its provenance.json names a parent under `lineage` and its trainable.safetensors is still whole.
The parent is the directory `lineage.parents[0].run` names (relative to the run or to any directory above it) whose
provenance.json has the recorded SHA-256. Before the write: the run verifies (`runs.verify_files`) and its state's
digest reproduces the file's bytes (`run_tensors.state_sha256`), so provenance.json, and every child's lineage and
battery table that records it, stay true unchanged. After it: every tensor read back through the parents equals
the old file's byte for byte, the digest equals the recorded one, and no tensor of the delta equals its parent's;
otherwise the old file is put back. A run already stored as a delta is left as it is, and so is one that shares no
tensor with its parent (a continuation that trained every tensor: a delta would hold the same bytes). Prints one
JSON line per run. With neither names nor --limit, lists the runs that qualify.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from safetensors.torch import load_file

from workbench.io import sha256_file
from workbench.readers import read_json
from workbench.run_tensors import is_delta, read_tensors, same_bytes, state_sha256, write_tensors
from workbench.runs import PROVENANCE, TRAINABLE, verify_files

ROOT = Path(__file__).resolve().parents[1]


def lineage_parent(run: Path) -> Path | None:
    """The directory of a run's first recorded parent, found by its provenance digest; None without a lineage."""
    parents = (read_json(run / PROVENANCE, "provenance").get("lineage") or {}).get("parents") or []
    if not parents:
        return None
    link = parents[0]
    for above in [run, *run.parents]:
        candidate = (above / link["run"]).resolve()
        if (candidate / PROVENANCE).is_file() and sha256_file(candidate / PROVENANCE) == link["provenance_sha256"]:
            return candidate
    sys.exit(f"error: {run}: no directory '{link['run']}' above it has the parent's provenance "
             f"{link['provenance_sha256'][:12]}...")


def whole_children(root: Path) -> list[Path]:
    """Runs under `root`/training with a recorded parent whose tensors are still one whole file, sorted."""
    runs = sorted(p.parent for p in (root / "training").rglob(TRAINABLE) if "checkpoints" not in p.parts)
    return [r for r in runs if (r / PROVENANCE).is_file() and not is_delta(r / TRAINABLE)
            and (read_json(r / PROVENANCE, "provenance").get("lineage") or {}).get("parents")]


def store(run: Path, dry_run: bool) -> dict:
    """Rewrites one run's tensors as a delta on its parent; returns what was checked."""
    path = run / TRAINABLE
    if is_delta(path):
        return {"run": _shown(run), "stored": "already a delta"}
    recorded = verify_files(run)["files"][TRAINABLE]
    parent = lineage_parent(run)
    old_bytes = path.read_bytes()
    old = load_file(str(path))
    if state_sha256(old) != recorded:
        sys.exit(f"error: {path}: its tensors written whole do not reproduce its bytes; left as it is")
    inherited, _ = read_tensors(parent / TRAINABLE)
    record = {"run": _shown(run), "parent": _shown(parent), "digest": recorded,
              "bytes_before": len(old_bytes), "tensors": len(old)}
    own = sum(k not in inherited or not same_bytes(v, inherited[k]) for k, v in old.items())
    if own == len(old):   # a continuation that trained every tensor: a delta would hold the same bytes
        return record | {"stored": "whole: shares no tensor with its parent", "own": own}
    if dry_run:
        return record | {"stored": "would store", "own": own}
    write_tensors(path, old, parent)
    try:
        state, digest = read_tensors(path)
        own = load_file(str(path))
        assert digest == recorded, f"digest {digest} != recorded {recorded}"
        assert state.keys() == old.keys() and all(same_bytes(state[k], v) for k, v in old.items()), "tensors differ"
        assert not [k for k, v in own.items() if k in inherited and same_bytes(v, inherited[k])], "a parent tensor"
        verify_files(run)
    except BaseException:
        path.write_bytes(old_bytes)
        raise
    return record | {"stored": "delta", "own": len(own), "bytes_after": path.stat().st_size,
                     "file_sha256": sha256_file(path)}


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="*", type=Path)
    p.add_argument("--limit", type=int, help="store the first N runs that qualify (sorted by path)")
    p.add_argument("--dry-run", action="store_true", help="check and report, write nothing")
    args = p.parse_args(argv)
    runs = [r.resolve() for r in args.runs] or whole_children(ROOT)[: args.limit]
    if not args.runs and args.limit is None:
        print("\n".join(str(r.relative_to(ROOT)) for r in runs))
        return
    for run in runs:
        print(json.dumps(store(run, args.dry_run)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
