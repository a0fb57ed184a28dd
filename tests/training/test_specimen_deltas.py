"""Every committed specimen continued from a parent stores only what it trained (`workbench.run_tensors`): a delta
file holds no tensor equal to its parent's and names the parent its lineage records; a whole-file child is one of
the runs listed below, still waiting for `scripts/store_deltas.py`."""

from __future__ import annotations

import json
import os
from functools import cache
from pathlib import Path

from safetensors.torch import load_file

from workbench.run_tensors import DELTA, header, read_tensors, same_bytes
from workbench.runs import PROVENANCE, TRAINABLE

ROOT = Path(__file__).resolve().parents[2]

# Committed runs continued from a parent whose tensors are still one whole file. The list exists because a
# session's commits may total at most 256 MiB of diff and rewriting a 10.5 MB file counts its old bytes, so
# scripts/store_deltas.py rewrites ten or so per session; it is emptied over the next sessions and may only
# shrink: a rewritten run leaves it, and a new whole-file child is refused rather than added.
WHOLE_CHILDREN = [
    "training/halting/park-mix-pondernet",
    "training/halting/park-mix-sweep/act-0.001",
    "training/halting/park-mix-sweep/act-0.01",
    "training/halting/park-mix-sweep/act-0.1",
    "training/halting/park-mix-sweep/pondernet-0.001",
    "training/halting/park-mix-sweep/pondernet-0.01",
    "training/halting/park-mix-sweep/pondernet-0.1",
    "training/halting/park-oracle",
    "training/halting/park-oracle-last",
    "training/halting/park-pondernet",
    "training/keepers/smollm2-chase-anneal",
    "training/keepers/smollm2-chase-park",
    "training/keepers/smollm2-chase-park-codes",
    "training/keepers/smollm2-chase-park-count",
    "training/keepers/smollm2-chase-park-mix",
    "training/keepers/smollm2-state-query-plain-long",
]
LISTED_AT_MOST = 16   # its length after the last rewrite (34 when it was made): it may only shrink


def _runs() -> dict[str, Path]:
    """{path relative to the root: run directory} of every committed run holding a tensor file."""
    files = (p for p in (ROOT / "training").rglob(TRAINABLE) if "checkpoints" not in p.parts)
    return {p.parent.relative_to(ROOT).as_posix(): p.parent for p in files if (p.parent / PROVENANCE).is_file()}


def _parents(run: Path) -> list[dict]:
    return (json.loads((run / PROVENANCE).read_text()).get("lineage") or {}).get("parents") or []


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


def test_every_whole_child_is_listed_and_every_listed_run_is_still_whole():
    whole = sorted(name for name, run in _runs().items()
                   if _parents(run) and header(run / TRAINABLE).get("format") != DELTA)
    assert len(WHOLE_CHILDREN) <= LISTED_AT_MOST and WHOLE_CHILDREN == sorted(set(WHOLE_CHILDREN))
    assert [n for n in whole if n not in WHOLE_CHILDREN] == [], "a new child stores its parent's tensors again"
    assert [n for n in WHOLE_CHILDREN if n not in whole] == [], "stored as a delta (or gone): drop it from the list"
