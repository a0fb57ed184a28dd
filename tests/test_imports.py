"""The package's import graph, read from the source: no module imports itself through others, and no part (a
subpackage or top-level module) imports one that imports it.

Every `import` / `from ... import` of a workbench module counts, at module top or inside a
function (a deferred import is still a dependency). `from workbench.x import y` is an edge to
`workbench.x.y` when that is a module, else to `workbench.x`.

A module that loads modules by name (`importlib.import_module`) has an edge, in the graph the layering checks read
(`dynamic=True`), to every module a name it spells can load: a string that names a module ("workbench.plots.lens",
"workbench.models:load_base") and an f-string that starts with a package's path (f"workbench.probes.{name}": every
module under `workbench.probes`). `get_probe` loads a probe that way, so whatever reaches it reaches torch. The
check for import cycles between modules reads the `import` statements only: such an edge names every module the
pattern could load, not one that is imported while the module itself is.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "workbench"


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


def import_graph(package: Path, dynamic: bool = False) -> dict[str, set[str]]:
    """{module: modules of the same package it imports}; with `dynamic`, also those it may load by name
    (`loaded_by_name`)."""
    files = module_files(package)
    root = package.name
    graph = {}
    for name, f in files.items():
        deps = set()
        here = name.split(".") if f.name == "__init__.py" else name.split(".")[:-1]
        tree = ast.parse(f.read_text(), str(f))
        if dynamic:
            deps |= loaded_by_name(tree, root, files)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                deps.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here[: len(here) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                for a in node.names:
                    sub = f"{target}.{a.name}"
                    deps.add(sub if sub in files else target)
        graph[name] = {d for d in deps if d in files and d != name and d.split(".")[0] == root}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_workbench_package_has_no_import_cycle():
    graph = import_graph(PACKAGE)
    assert "workbench.train.trainer" in graph and "workbench.loop.looped" in graph  # the real package was read
    assert cycles(graph) == []


def test_the_cycle_check_finds_a_cycle_through_a_deferred_import(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from pkg import c\n")
    (pkg / "c.py").write_text("import pkg.a\n")
    (pkg / "d.py").write_text("from . import a\n")   # into the cycle, not part of it
    assert cycles(import_graph(pkg)) == [["pkg.a", "pkg.c", "pkg.sub.b"]]


def parts(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph between the package's parts: a subpackage (`workbench.models.native`, everything under it) or a top-level
    module (`workbench.models`) is one node."""
    def part(name: str) -> str:
        return ".".join(name.split(".")[:2])

    out: dict[str, set[str]] = {}
    for name, deps in graph.items():
        out.setdefault(part(name), set()).update(part(d) for d in deps if part(d) != part(name))
    return out


def test_no_import_runs_back_up_between_the_packages_parts():
    """The parts stack in floors: no two import each other, through any modules. A module-level check misses
    `native.check -> models -> native/__init__` (no module imports itself) and `analysis.claims -> train.recipe ->
    tasks -> ... -> analysis`: each an arrow from a lower part up to one that imports it."""
    found = cycles(parts(import_graph(PACKAGE, dynamic=True)))
    assert found == [], found


def test_the_parts_check_finds_a_cycle_through_a_subpackages_init(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "low").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "low" / "__init__.py").write_text("from pkg.low.adapter import A\n")
    (pkg / "low" / "adapter.py").write_text("A = 1\n")
    (pkg / "low" / "check.py").write_text("from pkg.high import load\n")  # the arrow back up
    (pkg / "high.py").write_text("from pkg.low import A\n")
    graph = import_graph(pkg)
    assert cycles(graph) == []                               # no module imports itself
    assert cycles(parts(graph)) == [["pkg.high", "pkg.low"]]


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module `start` imports, directly or through others."""
    seen, todo = set(), [start]
    while todo:
        for dep in graph[todo.pop()]:
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return seen


MODEL = ("workbench.loop", "workbench.models", "workbench.train", "workbench.selection", "workbench.precision")
PRESENTATION = ("workbench.plots",)  # plots, the report (plots.report) and the paper figures (plots.export)
COMPUTE = ("workbench.loop", "workbench.selection", "workbench.probes", "workbench.train", "workbench.tasks",
           "workbench.analysis")
NOT_READ = ("workbench.probes", "workbench.runs", "workbench.models")  # what drawing a results directory never needs


def test_presentation_is_a_leaf():
    """Plots, the report and the paper figures reach no model code and no probe, through imports or modules loaded by
    name (the report found its sections through `get_probe`, which loads the probe and torch); no computation reaches
    them. tests/plots/test_no_model_code.py renders a results directory in a fresh interpreter and looks."""
    graph = import_graph(PACKAGE, dynamic=True)
    for name in graph:
        if name.startswith(PRESENTATION):
            assert not sorted(d for d in reachable(graph, name) if d.startswith((*MODEL, *NOT_READ))), name
        if name.startswith(COMPUTE):
            assert not sorted(d for d in reachable(graph, name) if d.startswith(PRESENTATION)), name


def test_a_module_loaded_by_name_is_an_edge_of_the_layering(tmp_path):
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
    graph = import_graph(pkg, dynamic=True)
    assert graph["pkg.probes"] == {"pkg.probes.lens"} and graph["pkg.lazy"] == {"pkg.heavy"}
    assert "pkg.heavy" in reachable(graph, "pkg.report") and graph["pkg.report"] == {"pkg.probes"}
    assert "pkg.heavy" not in reachable(import_graph(pkg), "pkg.report")


def test_analysis_reads_what_the_probes_wrote_and_imports_no_probe_presentation_or_cli():
    """Analysis sits under the probes' results: a probe's headline is a module of `workbench.analysis.headlines`, found
    by name, that reads the probe's tables. It reads without a model: no model or training code either (a run's
    recipe.toml is read as data, not as a typed Recipe)."""
    graph = import_graph(PACKAGE, dynamic=True)
    outside = ("workbench.probes", *PRESENTATION, "workbench.commands", "workbench.cli", *MODEL, "workbench.models.native")
    analysis = [name for name in graph if name.startswith("workbench.analysis")]
    assert {"workbench.analysis.stats", "workbench.analysis.headlines", "workbench.analysis.claims"} <= set(analysis)
    for name in analysis:
        assert not sorted(d for d in reachable(graph, name) if d.startswith(outside)), name


def test_the_looped_model_imports_no_probes_training_presentation_or_cli():
    graph = import_graph(PACKAGE, dynamic=True)
    outside = ("workbench.probes", "workbench.train", "workbench.selection", *PRESENTATION, "workbench.commands",
               "workbench.cli")
    for name in graph:
        if name.startswith("workbench.loop"):
            assert not sorted(d for d in reachable(graph, name) if d.startswith(outside)), name


def test_the_native_adapters_stand_on_the_bases_and_the_loop_only():
    """The native adapters sit on `workbench.models.bases` (the embedded tokenizer for the tiny ones) and the looped
    interface (`workbench.loop`); nothing under `workbench.models.native` imports the room's face (which imports
    them), training, block selection, probes, presentation or the CLI."""
    graph = import_graph(PACKAGE, dynamic=True)
    outside = ("workbench.train", "workbench.selection", "workbench.probes",
               *PRESENTATION, "workbench.commands", "workbench.cli", "workbench.runs")
    native = [name for name in graph if name.startswith("workbench.models.native")]
    assert {"workbench.models.native", "workbench.models.native.check"} <= set(native)
    for name in native:
        found = reachable(graph, name)
        assert "workbench.models" not in found, name
        assert not sorted(d for d in found if d.startswith(outside)), name


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


def test_the_run_format_is_read_without_the_trainer():
    """`workbench.runs` owns the run directory's format and reads runs; training writes them through
    `workbench.train.rundir`, which imports it. Nothing the reading side reaches is training code."""
    graph = import_graph(PACKAGE)
    assert "workbench.runs" in graph["workbench.train.rundir"]
    assert not sorted(d for d in reachable(graph, "workbench.runs") if d.startswith(("workbench.train",
                                                                                      "workbench.selection")))


GATE_STANDS_ON = ("workbench.io", "workbench.errors", "workbench.readers")  # what the output gate may import


def test_the_gate_imports_no_writer():
    """The output gate sits below every writer: it is handed each writer's `OutputKind` (the run's is declared in
    `workbench.runs`, the results' in `workbench.probes.battery`, ...) and imports none of them, directly, through
    others, or by name; it stands on atomic files and the training lock (`workbench.io`) and the errors alone."""
    graph = import_graph(PACKAGE, dynamic=True)
    assert "workbench.gate" in graph and "workbench.gate" in graph["workbench.runs"]  # the real package was read
    assert sorted(reachable(graph, "workbench.gate") - set(GATE_STANDS_ON)) == []
