"""The numbered notebooks: committed without outputs, in sync with notebooks/build.py, and each runs
top to bottom headless (nbclient, the venv's python3 kernel) on the embedded default and the keeper.

The executed notebooks are then shared the two ways a researcher would: exported with
`jupyter nbconvert --to html` (every figure must draw in headless Chromium with no network), and
opened in a real JupyterLab (one server for all seven, on 127.0.0.1, in headless Chromium): opening
one must not mark it modified, and every figure output must draw.
"""

import importlib.util
import json
import os
import re
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest
from plotly.offline import get_plotlyjs

from tests.cdp import Browser, BrowserError
from tests.test_report import PLOTLY_SIGNATURE
from workbench.precision import detect_hardware

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "notebooks"
KEEPER = ROOT / "training" / "keepers" / "smollm2-chase"
PLOTLY_MIME = "application/vnd.plotly.v1+json"
OFFLINE_TEMPLATE = FOLDER / "offline.html.j2"
FALLBACK = "warning: precision bf16 requested, using fp32: "


def _build_module():
    spec = importlib.util.spec_from_file_location("notebooks_build", FOLDER / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BUILD = _build_module()
NAMES = list(BUILD.NOTEBOOKS)
# Figures each notebook draws, and text its outputs must hold (numbers a reader relies on).
FIGURES = {"01": 4, "02": 1, "03": 7, "04": 4, "05": 3, "06": 3, "07": 3}
MUST_SAY = {
    "01": ["smollm2-chase: block 12:24 of 30 layers", "loop.4.hook_state  (1, "],
    "02": ["max |Δlogit| at loop 1: 0.0\n", "span "],
    "03": ["smollm2-chase: block 12:24 of 30 layers", "entry edit the gradient map", "The state leaving loop t"],
    "04": ["smollm2-chase: block 12:24 of 30 layers"],
    "05": ["'steps': 3", "'finished': True", "trainable.safetensors", "provenance.json",
           "the keeper's guardrail: base 48/64, final 46/64"],
    "06": ["inkling2_loop (random weights): looped layers 1:3 of 4", "loop.2.block.1.q_gate.hook_forget",
           "identity        not applicable", "thinkingmachines/Inkling-2-Mini", "step 16: ||s_t|| ",
           "zero-shot exit 'kl' (KL between successive steps <= 0.001): the last token exits at step "],
    "07": ["smollm2-chase: block 12:24 of 30 layers", "loop 3: coda lens top ' B'", "prompt 1, 3 loops: ' B",
           "native model; 6 passes", "overshoot       not applicable: needs chain, depth, table, start"],
}


def test_notebooks_are_numbered_and_match_the_generator():
    assert NAMES == sorted(NAMES) and [n[:3] for n in NAMES] == ["01_", "02_", "03_", "04_", "05_", "06_", "07_"]
    on_disk = sorted(p.name for p in FOLDER.glob("*.ipynb"))
    assert on_disk == NAMES, "run `python notebooks/build.py` after editing it"
    for name in NAMES:
        assert (FOLDER / name).read_text() == BUILD.render(name), f"{name} differs from build.py; regenerate"


def test_notebooks_carry_the_metadata_jupyterlab_writes():
    """JupyterLab rewrites kernelspec and language_info from the kernel it starts, and a notebook whose
    metadata differ opens modified; ipykernel's own values are what it writes."""
    from ipykernel.ipkernel import IPythonKernel
    from ipykernel.kernelspec import get_kernel_dict

    for name in NAMES:
        meta = json.loads((FOLDER / name).read_text())["metadata"]
        assert meta["kernelspec"] == {"name": "python3", "display_name": get_kernel_dict()["display_name"],
                                      "language": "python"}
        assert meta["kernelspec"]["display_name"] == "Python 3 (ipykernel)"
        assert meta["language_info"] == IPythonKernel.language_info


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


class Executed:
    """Runs each notebook once per session (nbclient) and keeps the executed copy in one folder."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.notebooks: dict[str, nbformat.NotebookNode] = {}

    def __call__(self, name: str) -> nbformat.NotebookNode:
        if name not in self.notebooks:
            from nbclient import NotebookClient

            if name not in ("02_block_selection.ipynb", "06_native_looped_models.ipynb") and not KEEPER.is_dir():
                pytest.fail(f"{name} runs on the shipped keeper, and {KEEPER} does not exist")
            nb = nbformat.reads(BUILD.render(name), as_version=4)
            # Run from notebooks/, as a user opening Jupyter there would; the notebooks find the root themselves.
            NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(FOLDER)}}).execute()
            nbformat.write(nb, self.folder / name)
            self.notebooks[name] = nb
        return self.notebooks[name]

    def all(self) -> list[Path]:
        for name in NAMES:
            self(name)
        return [self.folder / name for name in NAMES]


@pytest.fixture(scope="session")
def executed(tmp_path_factory):
    return Executed(tmp_path_factory.mktemp("executed"))


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    with Browser(tmp_path_factory.mktemp("chromium")) as b:
        yield b


def _outputs(nb) -> list:
    return [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]


def _stderr(nb) -> list[str]:
    """The notebook's stderr outputs but the one a CPU without bf16 units owes its reader: a recipe asking bf16
    there trains in fp32 and says so (`workbench.precision.resolve_precision`); on a CPU with them, none is kept."""
    fallback = not detect_hardware().bf16_supported
    return [o.text for o in _outputs(nb) if o.output_type == "stream" and o.name == "stderr"
            and not (fallback and all(line.startswith(FALLBACK) for line in o.text.splitlines() if line.strip()))]


@pytest.mark.notebook
@pytest.mark.parametrize("name", NAMES)
def test_notebook_runs_top_to_bottom(name, executed):
    nb = executed(name)
    outputs = _outputs(nb)
    assert not [o for o in outputs if o.output_type == "error"]
    figures = [o for o in outputs if PLOTLY_MIME in o.get("data", {})]
    assert len(figures) == FIGURES[name[:2]], f"{name} drew {len(figures)} figures"
    for fig in figures:
        assert fig["data"][PLOTLY_MIME]["data"], "a figure without traces"
    text = "".join(o.get("text", "") + o.get("data", {}).get("text/plain", "") for o in outputs)
    for needle in MUST_SAY[name[:2]]:
        assert needle in text, f"{name}: expected {needle!r} in its outputs"
    # A clean first open: no stderr box (the IProgress warning tqdm prints without ipywidgets), and the
    # kernel reports exactly the metadata the notebook was committed with.
    stderr = _stderr(nb)
    assert not stderr, f"{name} wrote to stderr: {stderr}"
    committed = json.loads((FOLDER / name).read_text())["metadata"]
    assert nb.metadata["language_info"] == committed["language_info"], "the kernel reports other language_info"
    assert nb.metadata["kernelspec"] == committed["kernelspec"]


@pytest.mark.notebook
@pytest.mark.parametrize("name", NAMES)
def test_every_figure_output_carries_offline_html_and_a_png(name, executed):
    """Viewers that read only text/html or image/png (nbconvert, static renderers) see each figure;
    plotly.js (about 4.8 MB) travels once per notebook, in the first figure's output."""
    figures = [o for o in _outputs(executed(name)) if PLOTLY_MIME in o.get("data", {})]
    carriers = []
    for i, fig in enumerate(figures):
        page, png = fig["data"]["text/html"], fig["data"]["image/png"]
        assert page.count('class="plotly-graph-div"') == 1 and "Plotly.newPlot(gd, figure)" in page
        assert "data:image/png;base64," + png[:40] in page  # the static stand-in until plotly.js draws
        assert png.startswith("iVBORw0KGgo")  # base64 of the PNG signature
        ours = page.replace(get_plotlyjs(), "")  # the bundle itself names CDNs it never fetches
        assert "<script src" not in ours and not re.search("https?://", ours)  # nothing to fetch: works offline
        if PLOTLY_SIGNATURE in page:
            carriers.append(i)
    assert carriers == [0], f"plotly.js should come once, with the first figure; it comes with {carriers}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _isolated_env(tmp: Path) -> dict:
    """Jupyter with its own config, data, runtime, settings and workspaces (nothing from ~ leaks in)."""
    dirs = {"JUPYTER_CONFIG_DIR": "config", "JUPYTER_DATA_DIR": "data", "JUPYTER_RUNTIME_DIR": "runtime",
            "JUPYTERLAB_SETTINGS_DIR": "settings", "JUPYTERLAB_WORKSPACES_DIR": "workspaces"}
    env = dict(os.environ, **{k: str(tmp / v) for k, v in dirs.items()})
    env.pop("JUPYTER_CONFIG_PATH", None)
    return env


def drawn_html_figures(browser: Browser, page: Path, expected: int, timeout: float = 120) -> dict:
    """Opens an exported page; returns figures, drawn (holding plotly's SVG) and remote requests."""
    browser.goto(page.resolve().as_uri())
    count = ("(() => { const divs = [...document.querySelectorAll('.plotly-graph-div')];"
             " return document.readyState === 'complete' ? {figures: divs.length,"
             " drawn: divs.filter(d => d.querySelector('.main-svg')).length} : null; })()")
    try:
        browser.wait_for(f"(() => {{ const c = {count}; return c && c.drawn >= {expected}; }})()", timeout,
                         f"{expected} drawn figures in {page.name}")
    except BrowserError:
        pass  # report what was drawn below
    state = browser.evaluate(count) or {}
    state["remote"] = sorted({u for u in browser.requests if u.startswith(("http:", "https:"))})
    state["errors"] = list(browser.errors)
    return state


@pytest.mark.notebook
@pytest.mark.browser
def test_nbconvert_html_draws_every_figure_offline(executed, browser, tmp_path):
    paths = executed.all()
    env = _isolated_env(tmp_path / "jupyter")
    out = tmp_path / "html"
    run = subprocess.run([sys.executable, "-m", "nbconvert", "--to", "html", "--output-dir", str(out), *map(str, paths)],
                         capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "not able to be represented" not in run.stderr  # nbconvert's warning for a Plotly-only output
    # nbconvert's own page asks a CDN for require.js and MathJax; with no network they fail, and every
    # figure still draws: the figures need nothing from the network.
    template_scripts = set(re.findall(r'<script src="(https?://[^"]+)"', (out / "01_logit_lens.html").read_text()))
    assert len(template_scripts) == 2
    for name in NAMES:
        page = out / name.replace(".ipynb", ".html")
        state = drawn_html_figures(browser, page, FIGURES[name[:2]])
        assert state.get("figures") == state.get("drawn") == FIGURES[name[:2]], f"{name}: {state}"
        assert set(state["remote"]) <= template_scripts and not state["errors"], f"{name}: {state}"
    # The offline template (notebooks/offline.html.j2): the same page without the CDN scripts.
    offline = tmp_path / "offline"
    run = subprocess.run([sys.executable, "-m", "nbconvert", "--to", "html", "--template-file", str(OFFLINE_TEMPLATE),
                          "--output-dir", str(offline), str(paths[0])], capture_output=True, text=True, env=env,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    page = offline / "01_logit_lens.html"
    assert "<script src=" not in page.read_text()
    state = drawn_html_figures(browser, page, FIGURES["01"])
    assert state == {"figures": 4, "drawn": 4, "remote": [], "errors": []}


class JupyterLab:
    """A JupyterLab server on 127.0.0.1 (its own token, port and Jupyter dirs), started and stopped here."""

    def __init__(self, root: Path, tmp: Path, timeout: float = 180):
        self.port, self.token = _free_port(), secrets.token_hex(16)
        cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={self.port}",
               "--ServerApp.port_retries=0", f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={root}",
               "--LabApp.expose_app_in_browser=True"]  # window.jupyterapp: the test reads the documents' state
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            cmd.append("--allow-root")
        self.log = tmp / "jupyterlab.log"
        with self.log.open("w") as log:
            self.proc = subprocess.Popen(cmd, env=_isolated_env(tmp), stdout=log, stderr=subprocess.STDOUT)
        try:
            Browser._wait(self._up, timeout, "JupyterLab to answer on 127.0.0.1")
        except BaseException:
            self.stop()
            raise

    def _up(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"jupyterlab exited with {self.proc.returncode}: {self.log.read_text()[-2000:]}")
        return urllib.request.urlopen(f"{self.url('api/status')}", timeout=5).status == 200

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}/{path}?token={self.token}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()  # the server shuts its kernels down on SIGTERM
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# JavaScript run in the JupyterLab page: the open notebook panel for a path, and its state.
PANEL = "Array.from(window.jupyterapp.shell.widgets('main')).find(w => w.context && w.context.path === {path})"
STATE = """(() => {{
  const w = {panel};
  if (!w || !w.context.isReady) return null;
  const kernel = w.sessionContext.session && w.sessionContext.session.kernel;
  const figures = [...w.node.querySelectorAll('.jp-RenderedPlotly')];
  return {{dirty: w.context.model.dirty, kernel: kernel ? kernel.status : null,
          kernel_name: w.sessionContext.kernelDisplayName,
          tab_dirty: w.title.className.includes('jp-mod-dirty'),
          figures: figures.length,
          images: figures.filter(f => {{ const i = f.querySelector('img.plot-img'); return i && i.naturalWidth > 0; }}).length,
          drawn: figures.filter(f => f.querySelector('.plot-container .main-svg')).length,
          sliders: w.node.querySelectorAll('.jp-RenderedPlotly .slider-container').length,
          stderr: w.node.querySelectorAll('[data-mime-type="application/vnd.jupyter.stderr"]').length,
          errors: w.node.querySelectorAll('[data-mime-type="application/vnd.jupyter.error"]').length}};
}})()"""
# jupyterlab-plotly shows the output's PNG first and draws the live figure when the pointer enters it.
POINT_AT_FIGURES = """(() => {{
  const w = {panel};
  w.node.querySelectorAll('.jp-RenderedPlotly img.plot-img').forEach(img => {{
    img.scrollIntoView(); img.dispatchEvent(new MouseEvent('mouseenter')); }});
  return true;
}})()"""


@pytest.mark.notebook
@pytest.mark.browser
def test_jupyterlab_opens_every_notebook_unmodified_and_draws_every_figure(executed, browser, tmp_path):
    started = time.monotonic()
    root = tmp_path / "root"
    root.mkdir()
    for path in executed.all():
        (root / path.name).write_bytes(path.read_bytes())
    lab = JupyterLab(root, tmp_path)
    try:
        browser.goto(lab.url(f"lab/tree/{NAMES[0]}"))
        report = {}
        for name in NAMES:
            panel = PANEL.format(path=json.dumps(name))
            if name != NAMES[0]:
                browser.wait_for("!!(window.jupyterapp && window.jupyterapp.commands)", 60, "JupyterLab's commands")
                browser.evaluate(f"window.jupyterapp.commands.execute('docmanager:open', {{path: {json.dumps(name)}}})"
                                 ".then(() => true)")
            # Opened, its kernel started (JupyterLab rewrites the notebook's metadata from it) and idle.
            browser.wait_for(f"(() => {{ const s = {STATE.format(panel=panel)}; return s && s.kernel === 'idle'; }})()",
                             240, f"{name} open with an idle kernel")
            time.sleep(1.0)  # let the metadata the kernel reports land
            before = browser.evaluate(STATE.format(panel=panel))
            browser.evaluate(POINT_AT_FIGURES.format(panel=panel))
            try:
                browser.wait_for(f"(() => {{ const s = {STATE.format(panel=panel)}; return s.drawn >= s.figures; }})()",
                                 120, f"every figure of {name} drawn")
            except BrowserError:
                pass  # reported below
            after = browser.evaluate(STATE.format(panel=panel))
            report[name] = dict(before, images=after["images"], drawn=after["drawn"], sliders=after["sliders"])
        seconds = time.monotonic() - started
    finally:
        lab.stop()
    print(f"JupyterLab check: {seconds:.1f} s; " + json.dumps(report))
    for name, state in report.items():
        n = FIGURES[name[:2]]
        assert state["kernel_name"] == "Python 3 (ipykernel)", (name, state)
        assert not state["dirty"] and not state["tab_dirty"], f"{name} was modified by opening it: {state}"
        assert state["figures"] == state["images"] == state["drawn"] == n, f"{name}: {state}"
        nb = executed(name)
        fallbacks = sum(o.output_type == "stream" and o.name == "stderr" for o in _outputs(nb)) - len(_stderr(nb))
        assert state["stderr"] == fallbacks and state["errors"] == 0, f"{name}: {state}"
    assert report[NAMES[0]]["sliders"] == 2  # the depth sliders of the two averaged lens maps
