"""The public API: `import workbench as wb` gives the documented surface, cheaply and silently.

A name listed here that disappears from `workbench`, loses its docstring or its type hints, or
drops out of docs/api.md fails a test; a name added to the surface must be added here too.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest

import workbench as wb

ROOT = Path(__file__).resolve().parents[1]

SURFACE = {
    "load_base", "load_looped", "RetrofitConfig", "LoraSettings", "retrofit", "attach_lora", "parameter_report", "LoopedLM",
    "HaltPolicy", "hook_name", "loop_hook_names", "stack_loops", "build_rows", "read_manifest", "write_manifest",
    "read_rows", "read_answers", "train_recipe", "load_run", "resolve_run", "identity_report", "select_block", "probe",
    "probe_names", "load_battery", "run_battery", "load_results", "read_summary", "build_ledger", "WorkbenchError",
    "lens", "read_user_rows", "generate", "Block",
}


def test_the_surface_is_exactly_the_documented_names():
    assert set(wb.__all__) == SURFACE
    assert sorted(wb.__all__) == wb.__all__ and set(dir(wb)) >= SURFACE
    assert set(wb._EXPORTS) == SURFACE


@pytest.mark.parametrize("name", sorted(SURFACE))
def test_every_public_name_resolves_with_a_docstring_and_type_hints(name):
    obj = getattr(wb, name)
    assert inspect.getdoc(obj) and len(inspect.getdoc(obj)) > 20, f"{name} has no docstring"
    if inspect.isclass(obj):
        return
    sig = inspect.signature(obj)
    missing = [p for p in sig.parameters if sig.parameters[p].annotation is inspect.Parameter.empty]
    assert missing == [], f"{name}: parameters without a type hint: {missing}"
    assert sig.return_annotation is not inspect.Signature.empty, f"{name} has no return type"


def test_no_public_name_is_also_a_module_of_the_package():
    """`import workbench.x` binds `workbench.x` to the module: a public name `x` would then read as the module, not
    the function, depending on what was imported before (`wb.lens` once did)."""
    package = ROOT / "workbench"
    modules = {p.stem for p in package.glob("*.py")} | {p.name for p in package.iterdir() if (p / "__init__.py").is_file()}
    assert sorted(SURFACE & modules) == []


def test_docs_api_lists_every_public_name():
    text = (ROOT / "docs" / "api.md").read_text()
    assert [n for n in sorted(SURFACE) if f"`{n}" not in text] == []


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'load_basee'"):
        wb.load_basee  # noqa: B018


@pytest.mark.slow   # a fresh interpreter: what an import pulls in is only visible from a clean start
def test_importing_workbench_is_cheap_silent_and_typed():
    code = ("import sys, workbench; heavy = [m for m in ('torch', 'transformers', 'pandas', 'peft') if m in sys.modules]; "
            "print(','.join(heavy))")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout == "\n" and out.stderr == ""
    assert (ROOT / "workbench" / "py.typed").is_file()


@pytest.mark.slow   # a fresh interpreter: what an import pulls in is only visible from a clean start
def test_loading_a_run_does_not_import_the_trainer():
    """`wb.load_run` reads a run through workbench.runs: the training loop, recipes and optimizer stay unloaded."""
    code = ("import sys, workbench as wb; wb.load_run; "
            "print(','.join(m for m in sys.modules if m.startswith(('workbench.train.trainer', 'workbench.train.recipe', "
            "'workbench.train.optim', 'workbench.train.losses'))))")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == ""
    assert wb.load_run.__name__ == "load_run"


def test_retrofit_takes_a_config_whose_block_is_a_block(tiny):
    base, _ = tiny
    looped = wb.retrofit(base, wb.RetrofitConfig(wb.Block.parse("1:3"), reentry="inject"))
    assert looped.retrofit_config == wb.RetrofitConfig(wb.Block(1, 3), reentry="inject")
    assert (looped.a, looped.b) == wb.Block(1, 3)


def test_probe_by_name_returns_the_probes_tables(tiny):
    base, tok = tiny
    looped = wb.retrofit(base, wb.RetrofitConfig(wb.Block(1, 3)))
    rows = wb.build_rows("chase", [1, 2], per_depth=2, seed=0, alphabet=8, tokenizer=tok)
    tables = wb.probe("depth_matrix", looped, tok, rows, loops=3)
    assert set(tables) == {"depth_matrix", "depth_matrix__frontier"}
    assert len(tables["depth_matrix"]) == 4 * 3  # 4 rows x loops 1-3
    assert "depth_matrix" in wb.probe_names()
    with pytest.raises(wb.WorkbenchError, match="known probes"):
        wb.probe("depth_matrixx", looped, tok, rows)


def test_load_run_takes_a_shipped_keepers_name_from_any_directory(tmp_path, monkeypatch):
    """README: `wb.load_run("smollm2-chase")` (a keeper's name, not a path) loads the keeper wherever Python runs."""
    monkeypatch.chdir(tmp_path)
    looped, _, info = wb.load_run("smollm2-chase")
    assert Path(info["run_dir"]).resolve() == (ROOT / "training" / "keepers" / "smollm2-chase").resolve()
    assert (looped.a, looped.b) == (12, 24)
