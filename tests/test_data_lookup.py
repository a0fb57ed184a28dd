"""Specimens by name: an installed wheel holds one keeper's tensors; the others come from WORKBENCH_DATA or a path."""

from __future__ import annotations

from pathlib import Path

import pytest

from workbench import defaults
from workbench.errors import WorkbenchError


def keeper(root: Path, name: str, tensors: bool) -> Path:
    folder = root / "training" / "keepers" / name
    folder.mkdir(parents=True)
    (folder / "retrofit.json").write_text("{}")
    if tensors:
        (folder / "trainable.safetensors").write_bytes(b"x")
    return folder


@pytest.fixture
def wheel_data(tmp_path, monkeypatch):
    """A package data folder laid out as in a wheel (real folders, not links to a checkout)."""
    data = tmp_path / "site" / "workbench" / "data"
    keeper(data, "smollm2-chase", tensors=True)
    keeper(data, "smollm2-chase-anneal", tensors=False)
    monkeypatch.setattr(defaults, "DATA", data)
    monkeypatch.delenv("WORKBENCH_DATA", raising=False)
    return data


def test_the_default_keeper_resolves_from_the_wheel(wheel_data):
    assert not defaults.in_checkout()
    assert defaults.resolve_run("smollm2-chase") == wheel_data / "training" / "keepers" / "smollm2-chase"


def test_a_keeper_without_its_tensors_is_one_line_naming_where_to_get_them(wheel_data):
    with pytest.raises(WorkbenchError) as err:
        defaults.resolve_run("smollm2-chase-anneal")
    (line,) = str(err.value).splitlines()
    assert "smollm2-chase-anneal" in line and "CHECKOUT/training/keepers/smollm2-chase-anneal" in line
    assert "WORKBENCH_DATA" in line


def test_workbench_data_supplies_the_tensors(wheel_data, tmp_path, monkeypatch):
    checkout = tmp_path / "checkout"
    found = keeper(checkout, "smollm2-chase-anneal", tensors=True)
    monkeypatch.setenv("WORKBENCH_DATA", str(checkout))
    assert defaults.resolve_run("smollm2-chase-anneal") == found
    assert defaults.resolve_run("smollm2-chase") == wheel_data / "training" / "keepers" / "smollm2-chase"


def test_a_path_or_an_unknown_name_is_returned_for_the_loader_to_judge(wheel_data, tmp_path):
    assert defaults.resolve_run("smollm2-chas") == Path("smollm2-chas")
    assert defaults.resolve_run(tmp_path) == tmp_path


def test_in_a_checkout_a_specimen_committed_without_tensors_reaches_the_loader():
    assert defaults.in_checkout()  # this test runs from the repository
    assert defaults.resolve_run("smollm2-chase-memory") == defaults.KEEPERS / "smollm2-chase-memory"


def test_a_mistyped_keeper_lists_the_shipped_ones():
    from workbench.defaults import shipped_keepers
    from workbench.runs import load_run

    with pytest.raises(WorkbenchError) as err:
        load_run("smollm2-chas")
    listed = str(err.value).split("shipped keeper's name: ", 1)[1].split(", ")
    assert listed == shipped_keepers() and "smollm2-chase" in listed and "smollm2-chase-anneal" in listed


def test_the_data_root_is_the_checkout_itself_in_a_checkout_and_the_package_data_installed(wheel_data, monkeypatch):
    checkout = Path(__file__).resolve().parents[1]
    monkeypatch.setattr(defaults, "__file__", str(checkout / "workbench" / "defaults.py"))
    assert defaults.data_root() == checkout and not (defaults.data_root() / "training").is_symlink()
    monkeypatch.setattr(defaults, "__file__", str(wheel_data.parent / "defaults.py"))  # site-packages/workbench/
    assert defaults.data_root() == wheel_data


def test_the_claims_ledger_reads_the_checkout_not_a_link():
    from workbench.analysis import claims

    assert claims.ROOT == Path(__file__).resolve().parents[1]
