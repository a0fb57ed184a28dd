"""Every committed specimen continued from a parent stores only what it trained (`workbench.run_tensors`): a delta
file holds no tensor equal to its parent's and names the parent its lineage records; a child still stored as one
whole file (a continuation that trained every tensor, where a delta would hold the same bytes) holds none either."""

from __future__ import annotations

import json
import os
from functools import cache
from pathlib import Path

from safetensors.torch import load_file

from workbench.io import sha256_file
from workbench.run_tensors import DELTA, header, read_tensors, same_bytes
from workbench.runs import PROVENANCE, TRAINABLE

ROOT = Path(__file__).resolve().parents[2]

def _runs() -> dict[str, Path]:
    """{path relative to the root: run directory} of every committed run holding a tensor file."""
    files = (p for p in (ROOT / "training").rglob(TRAINABLE) if "checkpoints" not in p.parts)
    return {p.parent.relative_to(ROOT).as_posix(): p.parent for p in files if (p.parent / PROVENANCE).is_file()}


def _parents(run: Path) -> list[dict]:
    return (json.loads((run / PROVENANCE).read_text()).get("lineage") or {}).get("parents") or []


def _parent_dir(run: Path) -> Path:
    """The directory its lineage's first parent names (relative to the run or a folder above it), by its digest."""
    link = _parents(run)[0]
    for above in [run, *run.parents]:
        candidate = above / link["run"]
        if (candidate / PROVENANCE).is_file() and sha256_file(candidate / PROVENANCE) == link["provenance_sha256"]:
            return candidate
    raise AssertionError(f"{run}: no folder above it holds the parent '{link['run']}' its lineage records")


@cache
def _state(path: Path) -> dict:
    return read_tensors(path)[0]


def test_no_committed_delta_carries_a_tensor_equal_to_its_parents():
    deltas = {name: run for name, run in _runs().items() if header(run / TRAINABLE).get("format") == DELTA}
    assert len(deltas) >= 10
    for name, run in deltas.items():
        meta = header(run / TRAINABLE)
        assert meta["parent_sha256"] == _parents(run)[0]["trainable_sha256"], name   # the parent its lineage names
        parent = _state(Path(os.path.normpath(run / meta["parent"])) / TRAINABLE)
        same = [k for k, v in load_file(str(run / TRAINABLE)).items() if k in parent and same_bytes(v, parent[k])]
        assert not same, f"{name} carries its parent's '{same[0]}' ({len(same)} such tensors)"


def test_no_whole_child_carries_a_tensor_equal_to_its_parents():
    """The six keeper continuations train every LoRA tensor further, so their whole files are all their own; a
    Stage 2 head or anneal written whole again (its parent's 174 tensors beside its own) fails here."""
    whole = {name: run for name, run in _runs().items()
             if _parents(run) and header(run / TRAINABLE).get("format") != DELTA}
    assert len(whole) >= 1   # the keeper continuations: the rule below reads real files
    for name, run in whole.items():
        parent_dir = _parent_dir(run)
        parent = _state(parent_dir / TRAINABLE)
        same = [k for k, v in load_file(str(run / TRAINABLE)).items() if k in parent and same_bytes(v, parent[k])]
        assert not same, f"{name} carries its parent's '{same[0]}' ({len(same)} such tensors): store it as a delta"
