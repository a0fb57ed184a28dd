"""The documentation lives in docs/: every reference to it resolves, and the hook table matches the code."""

from __future__ import annotations

import re
from pathlib import Path

from workbench.loop.hooks import SITES

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [*ROOT.glob("workbench/**/*.py"), *ROOT.glob("tests/**/*.py"), *ROOT.glob("benchmarks/*.py"),
           *ROOT.glob("scripts/*.py"), ROOT / "notebooks" / "build.py", *ROOT.glob("probes/*.toml"),
           *ROOT.glob("training/*.toml"), ROOT / "README.md", *ROOT.glob("docs/*.md")]
DOC_REF = re.compile(r"docs/[\w.-]+\.md")
# project notes that live outside the repository: a reference to one cannot be followed by a user
OUTSIDE = re.compile(r"\b(DESIGN|ANALYSES|STYLE|ENVIRONMENT)\.md\b")


def test_every_reference_to_docs_names_a_file_that_exists():
    refs = {(path.relative_to(ROOT), ref) for path in SOURCES for ref in DOC_REF.findall(path.read_text())}
    assert len(refs) >= 10  # the sources were read and do point into docs/
    assert [(str(p), r) for p, r in sorted(refs) if not (ROOT / r).is_file()] == []


def test_no_reference_points_outside_the_repository():
    found = [f"{path.relative_to(ROOT)}: {m.group(0)}" for path in SOURCES if path.name != "test_docs.py"
             for m in OUTSIDE.finditer(path.read_text())]
    assert found == []


def test_the_hook_table_lists_every_site_with_its_name():
    table = (ROOT / "docs" / "hooks.md").read_text()
    rows = dict(re.findall(r"^\| `(\w+)` \| `([^`]+)` \|", table, re.M))
    assert rows == SITES
