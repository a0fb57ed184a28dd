"""The package's import graph, read from the source: no module imports itself through others, and no part (a
subpackage or top-level module) imports one that imports it.

Every `import` / `from ... import` of a workbench module counts, at module top or inside a
function (a deferred import is still a dependency). `from workbench.x import y` is an edge to
`workbench.x.y` when that is a module, else to `workbench.x`.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

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


def import_graph(package: Path) -> dict[str, set[str]]:
    """{module: modules of the same package it imports}."""
    files = module_files(package)
    root = package.name
    graph = {}
    for name, f in files.items():
        deps = set()
        here = name.split(".") if f.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
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
    found = cycles(parts(import_graph(PACKAGE)))
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


MODEL = ("workbench.loop", "workbench.models", "workbench.train", "workbench.selection.stage1", "workbench.precision")
PRESENTATION = ("workbench.plots",)  # plots, the report (plots.report) and the paper figures (plots.export)
COMPUTE = ("workbench.loop", "workbench.selection.stage1", "workbench.probes", "workbench.train", "workbench.tasks",
           "workbench.analysis")


def test_presentation_is_a_leaf():
    """Plots, the report and the paper figures reach no model code; no computation reaches them."""
    graph = import_graph(PACKAGE)
    for name in graph:
        if name.startswith(PRESENTATION):
            assert not sorted(d for d in reachable(graph, name) if d.startswith(MODEL)), name
        if name.startswith(COMPUTE):
            assert not sorted(d for d in reachable(graph, name) if d.startswith(PRESENTATION)), name


def test_analysis_reads_what_the_probes_wrote_and_imports_no_probe_presentation_or_cli():
    """Analysis sits under the probes' results: a probe's headline function is handed in, never looked up. It reads
    without a model: no model or training code either (a run's recipe.toml is read as data, not as a typed Recipe)."""
    graph = import_graph(PACKAGE)
    outside = ("workbench.probes", *PRESENTATION, "workbench.commands", "workbench.cli", *MODEL, "workbench.models.native")
    analysis = [name for name in graph if name.startswith("workbench.analysis")]
    assert {"workbench.analysis.stats", "workbench.analysis.headlines", "workbench.analysis.claims"} <= set(analysis)
    for name in analysis:
        assert not sorted(d for d in reachable(graph, name) if d.startswith(outside)), name


def test_the_looped_model_imports_no_probes_training_presentation_or_cli():
    graph = import_graph(PACKAGE)
    outside = ("workbench.probes", "workbench.train", "workbench.selection.stage1", *PRESENTATION, "workbench.commands",
               "workbench.cli")
    for name in graph:
        if name.startswith("workbench.loop"):
            assert not sorted(d for d in reachable(graph, name) if d.startswith(outside)), name


def test_the_native_adapters_stand_on_the_bases_and_the_loop_only():
    """The native adapters sit on `workbench.models.bases` (the embedded tokenizer for the tiny ones) and the looped
    interface (`workbench.loop`); nothing under `workbench.models.native` imports the room's face (which imports
    them), training, block selection, probes, presentation or the CLI."""
    graph = import_graph(PACKAGE)
    outside = ("workbench.train", "workbench.selection.stage1", "workbench.selection", "workbench.probes",
               *PRESENTATION, "workbench.commands", "workbench.cli", "workbench.runs")
    native = [name for name in graph if name.startswith("workbench.models.native")]
    assert {"workbench.models.native", "workbench.models.native.check"} <= set(native)
    for name in native:
        found = reachable(graph, name)
        assert "workbench.models" not in found, name
        assert not sorted(d for d in found if d.startswith(outside)), name


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
