"""Results pages generated from committed tables are what their generators write today (none can go stale)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_patching_page_is_its_generators_output():
    page = _script("patching_page")
    assert page.PAGE.read_text() == page.render(), "docs/results/patching.md is stale: run scripts/patching_page.py"


def test_the_patching_page_reads_its_numbers_from_the_tables(tmp_path, monkeypatch):
    """A changed table changes the page: the generator reads the keeper's steps table, not a copy of it."""
    import pandas as pd

    page = _script("patching_page")
    source = ROOT / "training/keepers/smollm2-chase/battery-patching-steps"
    copy = tmp_path / "battery-patching"
    copy.mkdir()
    for f in source.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    monkeypatch.setattr(page, "ROOT", tmp_path)
    monkeypatch.setattr(page, "SPECIMENS", [("chase keeper", "battery-patching", "planted")])
    before = page.render()
    steps = pd.read_parquet(copy / "patching__steps.parquet")
    steps.loc[0, "recovered"] = 0.4242
    steps.to_parquet(copy / "patching__steps.parquet")
    after = page.render()
    assert after != before and "| 0.42 [" in after
