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


PACKAGE = ROOT / "workbench"
ARCHITECTURE = ROOT / "docs" / "architecture.md"


def package_modules(package: Path) -> list[str]:
    """The dotted name of every module under `package` (each .py file but `__init__.py` and `__main__.py`)."""
    return sorted(".".join(f.relative_to(package.parent).with_suffix("").parts) for f in package.rglob("*.py")
                  if f.name not in ("__init__.py", "__main__.py"))


def unnamed_modules(page: str, modules: list[str]) -> list[str]:
    """The modules `page` does not name. A module is named by its dotted path in backticks anywhere on the page
    (`workbench.selection.window_sweep`), or, below the top level, by its short name in backticks on a line that also
    names its package in backticks (the package's row of the packages table: `workbench.selection` ... `window_sweep`)."""
    lines = [set(re.findall(r"`([^`]+)`", line)) for line in page.splitlines() if not line.startswith("```")]
    everywhere = set().union(*lines)
    return [name for name in modules if name not in everywhere
            and not (name.count(".") > 1 and any({name.rpartition(".")[0], name.rpartition(".")[2]} <= line
                                                 for line in lines))]


def test_every_module_appears_in_the_architecture_page():
    modules = package_modules(PACKAGE)
    assert "workbench.selection.window_sweep" in modules and "workbench.io" in modules  # the real package was read
    missing = unnamed_modules(ARCHITECTURE.read_text(), modules)
    assert missing == [], f"docs/architecture.md does not name {len(missing)} module(s): {', '.join(missing)}"


def test_the_module_check_finds_a_module_the_page_leaves_out(tmp_path):
    """The check above can fail: a name taken off the real page, and a module planted in a copy of a package."""
    page = ARCHITECTURE.read_text()
    modules = package_modules(PACKAGE)
    assert unnamed_modules(page.replace("`window_sweep`", "window_sweep").replace(
        "`workbench.selection.window_sweep`", "window_sweep"), modules) == ["workbench.selection.window_sweep"]
    pkg = tmp_path / "workbench"
    (pkg / "train").mkdir(parents=True)
    for name in ("__init__.py", "__main__.py", "io.py", "train/__init__.py", "train/recipe.py", "train/planted.py"):
        (pkg / name).write_text("")
    page = "| `workbench.train` | `recipe` (recipes) |\n\nFiles go through `workbench.io`; `planted` is elsewhere.\n"
    assert package_modules(pkg) == ["workbench.io", "workbench.train.planted", "workbench.train.recipe"]
    assert unnamed_modules(page, package_modules(pkg)) == ["workbench.train.planted"]
    assert unnamed_modules(page.replace("`workbench.io`", "workbench.io"), package_modules(pkg)) == [
        "workbench.io", "workbench.train.planted"]
