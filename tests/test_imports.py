"""The package's import contracts: pyproject.toml's [tool.importlinter] (`lint-imports`), checked here on the graph of
every `import` / `from ... import` of a workbench module (at module top or inside a function: a deferred import is
still a dependency; grimp reads them) and of the modules the package loads by name.

A module that loads modules by name (`importlib.import_module`) has an edge to every module a name it spells can load:
a string that names a module ("workbench.plots.lens", "workbench.models:load_base") and an f-string that starts with a
package's path (f"workbench.probes.{name}": every module under `workbench.probes`). `get_probe` loads a probe that way,
so whatever reaches it reaches torch. import-linter sees import statements only, so `import_graph` adds these edges
before the contracts are checked. Two checks import-linter cannot state stay here as grimp queries: no module imports
itself through others (its `acyclic_siblings` contract skips a package whose child imports the package's own
__init__), and the output guard's allow-list (a `forbidden` contract lists what may not be imported, not what may).
"""

from __future__ import annotations

import ast
import copy
import functools
import os
import re
import subprocess
import sys
from pathlib import Path

import grimp
import importlinter.api
import pytest
from importlinter.contracts.acyclic_siblings import AcyclicSiblingsContract
from importlinter.contracts.forbidden import ForbiddenContract
from importlinter.contracts.layers import LayersContract

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "workbench"
CONTRACT_TYPES = {c.type_name: c for c in (LayersContract, ForbiddenContract, AcyclicSiblingsContract)}


def module_files(package: Path) -> dict[str, Path]:
    """{dotted module name: file} of every .py file under `package` (a package is its __init__)."""
    out = {}
    for f in sorted(package.rglob("*.py")):
        parts = list(f.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = f
    return out


MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.\w+)*(:\w+)?")


def loaded_by_name(tree: ast.Module, root: str, files: dict[str, Path]) -> set[str]:
    """The modules of the package a module may load by name: none unless it calls `import_module`; else each module a
    string of it names ("workbench.plots.lens", "workbench.models:load_base") and every module under the package an
    f-string of it starts with (f"workbench.probes.{name}")."""
    if not any(isinstance(n, ast.Attribute) and n.attr == "import_module" or isinstance(n, ast.Name)
               and n.id == "import_module" for n in ast.walk(tree)):
        return set()
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and MODULE_NAME.fullmatch(node.value):
            out.update({node.value.partition(":")[0]} & set(files))
        elif isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
            head = str(node.values[0].value)
            if head.startswith(root + ".") and head.endswith(".") and MODULE_NAME.fullmatch(head[:-1]):
                out.update(m for m in files if m.startswith(head))
    return out


def import_graph(package: Path, dynamic: bool = True) -> grimp.ImportGraph:
    """grimp's graph of `package` (on sys.path) from its import statements; with `dynamic`, plus an edge from each
    module to every module it may load by name (`loaded_by_name`)."""
    graph = grimp.build_graph(package.name, cache_dir=None)
    files = module_files(package)
    for name, f in files.items() if dynamic else ():
        for loaded in loaded_by_name(ast.parse(f.read_text(), str(f)), package.name, files) - {name}:
            graph.add_import(importer=name, imported=loaded)
    return graph


def broken_contracts(graph: grimp.ImportGraph, types: tuple[str, ...] = tuple(CONTRACT_TYPES)) -> list[str]:
    """The ids of pyproject.toml's contracts of `types` that `graph` breaks (each checked on a copy: a check prunes)."""
    options = importlinter.api.read_configuration(str(ROOT / "pyproject.toml"))
    return [c["id"] for c in options["contracts_options"] if c["type"] in types
            and not CONTRACT_TYPES[c["type"]](name=c["name"], session_options=options["session_options"],
                                              contract_options=c).check(copy.deepcopy(graph), verbose=False).kept]


# Loaded by name, a registry's entries import the registry (plots.report -> plots.registry -> plots.report): an edge
# every layering contract reads, and no import cycle, which the import statements alone decide.
LAYERING = ("layers", "forbidden")


@functools.cache
def workbench_graph(dynamic: bool = True) -> grimp.ImportGraph:
    """The package's graph (`import_graph`), built once; a test that plants an edge plants it in a copy."""
    return import_graph(PACKAGE, dynamic)


def self_importers(graph: grimp.ImportGraph) -> list[str]:
    """The modules that import themselves through others (the members of an import cycle), sorted."""
    return sorted(m for m in graph.modules if any(graph.chain_exists(importer=d, imported=m)
                                                  for d in graph.find_modules_directly_imported_by(m)))


def test_the_workbench_package_keeps_its_import_contracts():
    graph = workbench_graph()
    assert graph.direct_import_exists(importer="workbench.probes", imported="workbench.probes.lens_agreement")
    assert broken_contracts(graph, LAYERING) == [] and broken_contracts(workbench_graph(dynamic=False)) == []


def test_lint_imports_passes_on_the_import_statements(capsys):
    """What a contributor runs (`lint-imports`, here its function: the command also reconfigures logging, which would
    silence the package's loggers for the tests after it) reads the same contracts and keeps them."""
    from importlinter.application.use_cases import lint_imports

    assert lint_imports(config_filename=str(ROOT / "pyproject.toml"), cache_dir=None, no_logo=True) is True
    assert " kept, 0 broken" in capsys.readouterr().out


@pytest.mark.parametrize(("importer", "imported", "contract"), [
    ("workbench.io", "workbench.train.trainer", "floors"),                # a floor imports one above it
    ("workbench.plots.report", "workbench.tasks", "floors"),             # or one beside it
    ("workbench.errors", "workbench.guard", "floors"),                   # the bottom floor imports one above
    ("workbench.loop.looped", "workbench", "face"),
    ("workbench.plots.lens", "workbench.models.bases", "presentation-leaf"),   # a floor below, but model code
    ("workbench.analysis.stats", "workbench.plots.base", "compute-draws-nothing"),
    ("workbench.analysis.stats", "workbench.loop.looped", "analysis-reads-tables"),
    ("workbench.models.native.check", "workbench.models", "native-below-the-room"),
    ("workbench.loop.looped", "workbench.loop.hooks.nothing", None),   # not a module: no edge, nothing broken
])
def test_a_planted_import_breaks_its_contract(importer, imported, contract):
    graph = copy.deepcopy(workbench_graph())
    if imported in graph.modules:
        graph.add_import(importer=importer, imported=imported)
    broken = broken_contracts(graph, LAYERING)
    assert contract in broken if contract else broken == []


def test_a_planted_cycle_inside_a_part_breaks_the_sibling_contract():
    graph = copy.deepcopy(workbench_graph(dynamic=False))
    graph.add_import(importer="workbench.probes.heads", imported="workbench.probes.common")
    graph.add_import(importer="workbench.probes.common", imported="workbench.probes.heads")
    assert broken_contracts(graph, ("acyclic_siblings",)) == ["no-sibling-cycles"] and self_importers(graph) == [
        "workbench.probes.common", "workbench.probes.heads"]


def test_the_workbench_package_has_no_import_cycle():
    assert self_importers(workbench_graph(dynamic=False)) == []


def test_the_cycle_check_finds_a_cycle_through_a_deferred_import_and_a_packages_init(tmp_path, monkeypatch):
    """A package whose child imports the package's own __init__ is a cycle the sibling contract does not see."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from pkg.sub import e\n")
    (pkg / "a.py").write_text("from pkg.sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from pkg import c\n")
    (pkg / "c.py").write_text("import pkg.a\n")
    (pkg / "d.py").write_text("from . import a\n")   # into the cycle, not part of it
    (pkg / "sub" / "e.py").write_text("import pkg.sub\n")   # the child imports its package's __init__, which imports it
    monkeypatch.syspath_prepend(tmp_path)
    assert self_importers(import_graph(pkg, dynamic=False)) == ["pkg.a", "pkg.c", "pkg.sub", "pkg.sub.b", "pkg.sub.e"]


def test_a_module_loaded_by_name_is_an_edge_of_the_contracts(tmp_path, monkeypatch):
    """`import_module(f"pkg.probes.{name}")` reaches every module under `pkg.probes`, and a named "pkg.heavy:attr"
    reaches `pkg.heavy`; without `dynamic`, or in a module that loads nothing by name, a string is no edge."""
    pkg = tmp_path / "pkg"
    (pkg / "probes").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "probes" / "__init__.py").write_text(
        'import importlib\n\ndef get(name):\n    return importlib.import_module(f"pkg.probes.{name}")\n')
    (pkg / "probes" / "lens.py").write_text("import pkg.heavy\n")
    (pkg / "heavy.py").write_text("")
    (pkg / "lazy.py").write_text('from importlib import import_module\n\nWHERE = "pkg.heavy:attr"\n\n\n'
                                 'def load():\n    return import_module(WHERE.partition(":")[0])\n')
    (pkg / "report.py").write_text('"""Reads pkg.heavy"""\nfrom pkg.probes import get\nNAME = "pkg.heavy"\n')
    monkeypatch.syspath_prepend(tmp_path)
    graph = import_graph(pkg)
    assert graph.find_modules_directly_imported_by("pkg.probes") == {"pkg.probes.lens"}
    assert graph.find_modules_directly_imported_by("pkg.lazy") == {"pkg.heavy"}
    assert graph.find_modules_directly_imported_by("pkg.report") == {"pkg.probes"}
    assert graph.chain_exists(importer="pkg.report", imported="pkg.heavy")
    assert not import_graph(pkg, dynamic=False).chain_exists(importer="pkg.report", imported="pkg.heavy")


GUARD_STANDS_ON = {"workbench.io", "workbench.errors", "workbench.readers", "workbench.places"}  # what the guard imports


def test_the_guard_imports_no_writer():
    """The output guard sits below every writer: it is handed each writer's `OutputKind` (the run's is declared in
    `workbench.runs`, the results' in `workbench.probes.battery`, ...) and imports none of them, directly, through
    others, or by name; it stands on atomic files and the training lock (`workbench.io`), the errors, and the names
    of the directories written in place (`workbench.places`, which imports nothing of the workbench) alone."""
    graph = workbench_graph()
    assert graph.direct_import_exists(importer="workbench.runs", imported="workbench.guard")  # the real package was read
    assert sorted(graph.find_upstream_modules("workbench.guard", as_package=True) - GUARD_STANDS_ON) == []


@pytest.mark.slow   # a fresh interpreter: what an import pulls in is only visible from a clean start
def test_the_cli_starts_without_the_model_stack():
    """`workbench --help` imports every command module; none may pull in torch, transformers or pandas."""
    code = ("import sys, workbench.cli; heavy = [m for m in ('torch', 'transformers', 'pandas', 'scipy', 'plotly') "
            "if m in sys.modules]; print(','.join(heavy))")
    env = {**os.environ, "PYTHONPATH": str(PACKAGE.parent)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == ""  # what kept --help at 9 s (0.5 s without); a wall-clock bound here would be flaky
    help_text = subprocess.run([sys.executable, "-m", "workbench", "--help"], capture_output=True, text=True, env=env,
                               check=True).stdout
    assert "identity" in help_text and "probe" in help_text


@pytest.mark.slow   # a fresh interpreter
def test_figures_outside_a_kernel_leave_the_notebook_stack_unimported():
    """Outside a Jupyter kernel, `workbench.plots` (every command that prints a table or writes a report) leaves
    plotly's renderer registry alone: it imports nbformat and, through it, jsonschema's format grammars (3.5 s of CPU
    a process). Importing `workbench.plots.notebook` still registers the renderer."""
    code = ("import sys, workbench.plots, workbench.plots.terminal, workbench.plots.report; "
            "print(','.join(m for m in ('nbformat', 'jsonschema', 'IPython') if m in sys.modules)); "
            "import plotly.io as pio, workbench.plots.notebook as nb; print(nb.NAME in pio.renderers)")
    env = {**os.environ, "PYTHONPATH": str(PACKAGE.parent)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.splitlines() == ["", "True"], out.stdout


@pytest.mark.slow   # a fresh interpreter
def test_a_command_printing_a_table_imports_no_figure_and_no_statistics_until_it_needs_them():
    """`workbench identity`, `lens` and `generate` print through `workbench.plots.terminal`'s console and draw no
    figure: importing it leaves plotly's figures and scipy.stats unimported (together 2-3 s of CPU a process); the
    first figure or interval asked for imports them."""
    code = ("import sys, workbench.plots.terminal; "
            "print(','.join(m for m in ('plotly.graph_objects', 'scipy.stats') if m in sys.modules)); "
            "from workbench.plots import depth_matrix_figure; from workbench.analysis.stats import wilson; "
            "wilson(3, 4); print(depth_matrix_figure.__module__, 'plotly.graph_objects' in sys.modules, "
            "'scipy.stats' in sys.modules)")
    env = {**os.environ, "PYTHONPATH": str(PACKAGE.parent)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.splitlines() == ["", "workbench.plots.depth True True"], out.stdout


MAX_MODULE_LINES = 600   # issue 43: a module past this is split where its parts separate


def long_modules(package: Path, limit: int = MAX_MODULE_LINES) -> list[str]:
    """The modules under `package` over `limit` lines, each with its count."""
    return [f"{p.relative_to(package.parent)} ({n})" for p in sorted(package.rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > limit]


def test_no_module_of_the_package_is_over_600_lines():
    package = Path(__file__).resolve().parents[1] / "workbench"
    assert long_modules(package) == []


def test_the_length_check_finds_a_long_module(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "short.py").write_text("x = 1\n" * 600)
    (tmp_path / "pkg" / "long.py").write_text("x = 1\n" * 601)
    assert long_modules(tmp_path / "pkg") == ["pkg/long.py (601)"]


