"""The numbered notebooks: committed without outputs, in sync with notebooks/build.py, and each runs
top to bottom headless (nbclient, the venv's python3 kernel) on the embedded default and the keeper."""

import importlib.util
import json
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "notebooks"
KEEPER = ROOT / "training" / "keepers" / "smollm2-chase"
PLOTLY_MIME = "application/vnd.plotly.v1+json"


def _build_module():
    spec = importlib.util.spec_from_file_location("notebooks_build", FOLDER / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BUILD = _build_module()
NAMES = list(BUILD.NOTEBOOKS)
# Figures each notebook draws, and text its outputs must hold (numbers a reader relies on).
FIGURES = {"01": 4, "02": 1, "03": 3, "04": 4, "05": 3}
MUST_SAY = {
    "01": ["smollm2-chase: block 12:24 of 30 layers", "loop.4.hook_state  (1, "],
    "02": ["max |Δlogit| at loop 1: 0.0\n", "span "],
    "03": ["smollm2-chase: block 12:24 of 30 layers"],
    "04": ["smollm2-chase: block 12:24 of 30 layers"],
    "05": ["'steps': 3", "'finished': True", "trainable.safetensors", "provenance.json"],
}


def test_notebooks_are_numbered_and_match_the_generator():
    assert NAMES == sorted(NAMES) and [n[:3] for n in NAMES] == ["01_", "02_", "03_", "04_", "05_"]
    on_disk = sorted(p.name for p in FOLDER.glob("*.ipynb"))
    assert on_disk == NAMES, "run `python notebooks/build.py` after editing it"
    for name in NAMES:
        assert (FOLDER / name).read_text() == BUILD.render(name), f"{name} differs from build.py; regenerate"


@pytest.mark.parametrize("name", NAMES)
def test_notebook_is_committed_without_outputs_and_imports_only_the_library(name):
    nb = json.loads((FOLDER / name).read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert code and all(c["outputs"] == [] and c["execution_count"] is None for c in code)
    imported = set()
    for c in code:
        for line in "".join(c["source"]).splitlines():
            words = line.split()
            if words[:1] in (["import"], ["from"]):
                imported.add(words[1].split(".")[0])
    assert imported <= {"workbench", "torch", "pandas", "plotly", "pathlib", "tempfile", "tomllib"}, imported


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_notebook_runs_top_to_bottom(name, tmp_path):
    from nbclient import NotebookClient

    if name != "02_block_selection.ipynb" and not KEEPER.is_dir():
        pytest.fail(f"{name} runs on the shipped keeper, and {KEEPER} does not exist")
    nb = nbformat.reads(BUILD.render(name), as_version=4)
    # Run from notebooks/, as a user opening Jupyter there would; the notebooks find the root themselves.
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(FOLDER)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    figures = [o for o in outputs if PLOTLY_MIME in o.get("data", {})]
    assert len(figures) == FIGURES[name[:2]], f"{name} drew {len(figures)} figures"
    for fig in figures:
        assert fig["data"][PLOTLY_MIME]["data"], "a figure without traces"
    text = "".join(o.get("text", "") + o.get("data", {}).get("text/plain", "") for o in outputs)
    for needle in MUST_SAY[name[:2]]:
        assert needle in text, f"{name}: expected {needle!r} in its outputs"
