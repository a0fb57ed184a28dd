"""The "workbench" notebook renderer: what each figure output carries, when plotly.js travels with it,
and that its HTML draws in headless Chromium whatever order the figures' scripts run in."""

import plotly.graph_objects as go
import plotly.io as pio
import pytest
from kaleido.errors import ChromeNotFoundError

import workbench.plots.notebook as notebook
from tests.cdp import Browser
from tests.test_report import PLOTLY_SIGNATURE
from workbench.plots import apply_theme

PLOTLY_MIME = "application/vnd.plotly.v1+json"


def _fig(title: str) -> dict:
    return apply_theme(go.Figure(go.Scatter(x=[1, 2, 3], y=[1, 3, 2]))).update_layout(title=title).to_dict()


def test_registered_but_not_the_default_outside_a_kernel():
    assert notebook.NAME in pio.renderers
    assert pio.renderers.default != notebook.NAME  # pytest is no IPython kernel


def test_plotlyjs_comes_once_per_kernel_and_again_when_its_cell_reruns(monkeypatch):
    executions = iter([("c1", "m1"), ("c1", "m1"), ("c2", "m2"), ("c1", "m3"), ("c1", "m3"), (None, "m4")])
    monkeypatch.setattr(notebook, "_execution", lambda: next(executions))
    renderer = notebook.WorkbenchRenderer(png=False)
    carries = [PLOTLY_SIGNATURE in renderer.to_mimebundle(_fig(f"f{i}"))["text/html"] for i in range(6)]
    # two figures of one cell: once; another cell: no; the carrying cell re-run: again, once; no cell id: no
    assert carries == [True, False, False, True, False, False]


@pytest.fixture
def kaleido_server():
    """The renderer leaves kaleido's browser running for the kernel's next figure; a test stops it."""
    import kaleido

    yield
    kaleido.stop_sync_server(silence_warnings=True)


@pytest.mark.browser  # the browser: kaleido renders the PNG in Chromium
def test_the_bundle_holds_the_mime_type_html_and_png(kaleido_server):
    renderer = notebook.WorkbenchRenderer()
    bundle = renderer.to_mimebundle(_fig("a </script> title"))
    assert set(bundle) == {PLOTLY_MIME, "text/html", "image/png"}
    assert bundle[PLOTLY_MIME]["data"][0]["y"] == [1, 3, 2]
    assert bundle["image/png"].startswith("iVBORw0KGgo")
    page = bundle["text/html"]
    assert "</script> title" not in page and page.count("</script>") == page.count("<script")  # no early close


@pytest.fixture
def no_server(monkeypatch):
    """kaleido's server, not started: a real one starts Chromium on a thread of its own, and these tests plant what
    the export raises without one. Returns the calls the renderer made to start it."""
    import kaleido

    calls = []
    monkeypatch.setattr(kaleido, "start_sync_server", lambda *args, **kwargs: calls.append(kwargs))
    return calls


def test_no_browser_means_no_png_and_no_error(monkeypatch, no_server):
    def broken(*args, **kwargs):
        raise ChromeNotFoundError("no chromium here")  # what kaleido raises without a browser

    monkeypatch.setattr(pio, "to_image", broken)
    renderer = notebook.WorkbenchRenderer()
    assert set(renderer.to_mimebundle(_fig("x"))) == {PLOTLY_MIME, "text/html"}
    assert renderer._state["png_broken"] and no_server == [{"silence_warnings": True}]
    renderer.to_mimebundle(_fig("y"))
    assert len(no_server) == 1   # broken once: the kernel's later figures do not try again


def test_an_error_that_is_not_the_browsers_is_raised_and_keeps_pngs_on(monkeypatch, no_server):
    """Only kaleido's own errors turn PNGs off for the kernel: a bug in a figure shows where it happens."""
    def bug(*args, **kwargs):
        raise ValueError("Invalid property specified for object of type plotly.graph_objs.Layout")

    monkeypatch.setattr(pio, "to_image", bug)
    renderer = notebook.WorkbenchRenderer()
    with pytest.raises(ValueError, match="Invalid property"):
        renderer.to_mimebundle(_fig("x"))
    assert not renderer._state["png_broken"]


@pytest.mark.browser  # the browser: headless Chromium
@pytest.mark.parametrize("order", ["bundle first", "bundle last"])
def test_the_html_draws_every_figure_in_chromium(order, tmp_path):
    """Figures whose script runs before plotly.js has loaded wait for it (a cell run out of order)."""
    figures = [notebook.figure_html(_fig(f"figure {i}"), png=b"\x89PNG fake") for i in range(3)]
    parts = [notebook.plotlyjs_html(), *figures] if order == "bundle first" else [*figures, notebook.plotlyjs_html()]
    page = tmp_path / "page.html"
    page.write_text("<!DOCTYPE html><html><body>" + "\n".join(parts) + "</body></html>")
    with Browser(tmp_path / "profile") as browser:
        browser.goto(page.as_uri())
        drawn = browser.wait_for("document.readyState === 'complete' && "
                                 "[...document.querySelectorAll('.plotly-graph-div')]"
                                 ".filter(d => d.querySelector('.main-svg')).length === 3 "
                                 "&& document.querySelectorAll('.plotly-graph-div img').length === 0", 60, "3 figures drawn")
        assert drawn and not browser.errors
        assert not [u for u in browser.requests if u.startswith("http")]
