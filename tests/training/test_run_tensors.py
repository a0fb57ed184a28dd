"""A continued run stores what it trained (`workbench.run_tensors`): a halting-stage head and its own child on a tiny
model write delta files naming their parents by path and digest, every loader resolves them, a missing or changed
parent is one line naming both, and a whole (v1) run still loads beside them."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import tomli_w
import torch
from safetensors.torch import load_file, save_file

from tests.training.conftest import TINY_RECIPE, merge
from workbench.errors import WorkbenchError
from workbench.run_tensors import DELTA, header, read_tensors, same_bytes
from workbench.runs import PROVENANCE, TRAINABLE, export_run, load_run, verify_files

ROOT = Path(__file__).resolve().parents[2]
HEAD = {"halting.proj.weight", "halting.proj.bias"}
HALTING_STAGE = {"model": {"halting": True, "halting_pooling": "last"}, "halting": {"oracle_max": 3},
          "stages": [{"name": "halt", "kind": "halting", "depths": [1, 2], "steps": 2}]}


@pytest.fixture(scope="module")
def family(tmp_path_factory):
    """{"parent": a whole tiny run, "child": its halting-stage head, "grandchild": a halting-stage run continued from the head},
    side by side in one directory (so a copy of it keeps their relative paths)."""
    from workbench.train.trainer import train

    root = tmp_path_factory.mktemp("family")
    runs = {}
    for name, parent, extra in (("parent", None, {}), ("child", "parent", HALTING_STAGE), ("grandchild", "child", HALTING_STAGE)):
        recipe = root / f"{name}.toml"
        recipe.write_text(tomli_w.dumps(merge(TINY_RECIPE, {**extra, "init_from": parent or ""})))
        train(recipe, out=root / name, progress=False)
        runs[name] = root / name
    return runs


def _recorded(run: Path) -> str:
    return json.loads((run / PROVENANCE).read_text())["files"][TRAINABLE]


def test_a_halting_stage_head_writes_only_its_head_and_names_its_parent_by_path_and_digest(family):
    parent, child = family["parent"], family["child"]
    assert header(parent / TRAINABLE) == {}                       # no parent: a whole file, as v1 wrote it
    assert set(load_file(str(child / TRAINABLE))) == HEAD         # the parent's LoRA and bridge are not copied
    meta = header(child / TRAINABLE)
    assert meta == {"format": DELTA, "parent": "../parent", "parent_sha256": _recorded(parent)}
    whole, _ = read_tensors(parent / TRAINABLE)
    state, digest = read_tensors(child / TRAINABLE)
    assert set(state) - set(whole) == HEAD and all(same_bytes(state[k], v) for k, v in whole.items())
    assert digest == _recorded(child)                             # what provenance.json and a child's lineage record
    (link,) = json.loads((child / PROVENANCE).read_text())["lineage"]["parents"]
    assert link["trainable_sha256"] == meta["parent_sha256"]


def test_every_loader_reads_a_delta_chain_and_a_whole_run_alike(family):
    from workbench.probes.halting import load_head

    parent, tok, _ = load_run(family["parent"])
    grandchild, _, info = load_run(family["grandchild"])          # two parents resolved
    assert set(load_file(str(family["grandchild"] / TRAINABLE))) == HEAD
    own = dict(grandchild.named_parameters())
    for name, p in parent.named_parameters():                     # the frozen model is the parent's, bit for bit
        assert torch.equal(own[name], p), name
    child, _, _ = load_run(family["child"])
    assert not torch.equal(child.halting.proj.weight, grandchild.halting.proj.weight)   # the grandchild's own head
    head, objective = load_head(child, family["grandchild"])
    assert torch.equal(head.proj.weight, grandchild.halting.proj.weight) and objective == "oracle"
    assert verify_files(family["grandchild"])["files"][TRAINABLE] == info["provenance"]["files"][TRAINABLE]


@pytest.mark.parametrize("fault", ["missing", "changed"])
def test_a_missing_or_changed_parent_is_one_line_naming_both(family, tmp_path, fault, capsys, monkeypatch):
    from workbench import cli

    shutil.copytree(family["parent"].parent, tmp_path / "f")
    parent, child = tmp_path / "f" / "parent", tmp_path / "f" / "child"
    if fault == "missing":
        shutil.rmtree(parent)
    else:                                                         # one value of the parent's bridge changed
        tensors = load_file(str(parent / TRAINABLE))
        tensors["reentry.gate"] = tensors["reentry.gate"] + 1
        save_file(tensors, str(parent / TRAINABLE))
    for load in (load_run, verify_files):
        with pytest.raises(WorkbenchError) as err:
            load(child)
        assert str(child / TRAINABLE) in str(err.value) and str(parent / TRAINABLE) in str(err.value)
    monkeypatch.setattr(sys, "argv", ["workbench", "probe", "--checkpoint", str(tmp_path / "f" / "grandchild"),
                                      "--only", "depth_matrix", "--out", str(tmp_path / "out")])
    with pytest.raises(SystemExit) as exc:
        cli.run()
    lines = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(lines) == 1 and str(parent / TRAINABLE) in lines[0], lines
    assert ("is missing" if fault == "missing" else "the parent changed") in lines[0]
    assert not (tmp_path / "out").exists()


def test_an_exported_delta_names_its_parent_from_its_new_place(family, tmp_path):
    dest = tmp_path / "shipped" / "head"
    export_run(family["child"], dest)
    assert (dest / PROVENANCE).read_bytes() == (family["child"] / PROVENANCE).read_bytes()   # the digest holds
    assert (dest / header(dest / TRAINABLE)["parent"]).resolve() == family["parent"].resolve()
    assert read_tensors(dest / TRAINABLE)[1] == _recorded(family["child"])


def test_a_committed_whole_keeper_and_a_committed_delta_head_both_verify():
    """One specimen of each format as committed: the keeper (whole, v1) and a halting-stage head on it (delta)."""
    keeper, head = ROOT / "training" / "keepers" / "smollm2-chase", ROOT / "training" / "halting" / "keeper-oracle"
    assert header(keeper / TRAINABLE) == {} and header(head / TRAINABLE)["format"] == DELTA
    verify_files(keeper)
    verify_files(head)
    whole, _ = read_tensors(keeper / TRAINABLE)
    state, digest = read_tensors(head / TRAINABLE)
    assert set(state) - set(whole) == HEAD and digest == _recorded(head)
    assert all(same_bytes(state[k], v) for k, v in whole.items())


def test_store_deltas_rewrites_a_whole_child_with_its_digest_and_provenance_unchanged_and_once(family, tmp_path):
    """scripts/store_deltas.py on a child stored whole (as v1 wrote every committed head): the same provenance.json
    verifies it before and after, it reads back byte for byte, and a second pass leaves it as it is."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("store_deltas", ROOT / "scripts" / "store_deltas.py")
    store_deltas = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(store_deltas)
    shutil.copytree(family["parent"].parent, tmp_path / "f")
    child = tmp_path / "f" / "child"
    state, digest = read_tensors(child / TRAINABLE)
    save_file(state, str(child / TRAINABLE))                      # whole: the digest provenance records is its SHA-256
    provenance = (child / PROVENANCE).read_bytes()
    assert verify_files(child)["files"][TRAINABLE] == digest and header(child / TRAINABLE) == {}
    record = store_deltas.store(child, dry_run=False)
    assert record["stored"] == "delta" and record["own"] == len(HEAD) and record["bytes_after"] < 4096
    assert set(load_file(str(child / TRAINABLE))) == HEAD and (child / PROVENANCE).read_bytes() == provenance
    again, _ = read_tensors(child / TRAINABLE)
    assert again.keys() == state.keys() and all(same_bytes(again[k], v) for k, v in state.items())
    assert store_deltas.store(child, dry_run=False)["stored"] == "already a delta"
