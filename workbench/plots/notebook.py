"""The notebook renderer: figures that survive export and sharing.

Inside a Jupyter kernel plotly's default output carries only `application/vnd.plotly.v1+json`,
which JupyterLab draws but `nbconvert --to html`, nbviewer-like pages and static viewers cannot
show. The "workbench" renderer puts three representations in every figure output:

* `application/vnd.plotly.v1+json`: what JupyterLab (and VS Code, nteract) draw interactively;
* `text/html`: the figure drawn by plotly.js, offline: the first figure a kernel shows carries a
  copy of plotly.js (about 4.8 MB, once per notebook, not per figure), and every figure waits for
  it, so an exported page draws all of them whatever the order its scripts run in; inside the
  figure's div a static PNG stands in until plotly.js draws (viewers that run no scripts);
* `image/png`: the same static image, for viewers that read only images (made by kaleido with
  the system Chromium; left out, quietly, when no browser can be started).

Importing `workbench.plots` inside an IPython kernel makes "workbench" the default renderer,
unless the user chose one (PLOTLY_RENDERER, or anything but plotly's kernel default); importing this
module registers it anywhere (outside a kernel, not as the default).
"""

from __future__ import annotations

import base64
import html
import os
import sys
import uuid
import warnings

import plotly.io as pio
from plotly.io._base_renderers import MimetypeRenderer, PlotlyRenderer
from plotly.offline import get_plotlyjs

from workbench.plots.browser import browser_errors

NAME = "workbench"
PLOTLY_MIME = "application/vnd.plotly.v1+json"
QUEUE = "workbenchPlotlyQueue"  # figures drawn before plotly.js arrived wait here
PNG_WIDTH = 900
DEFAULT_HEIGHT = 525


def _script_text(text: str) -> str:
    """Returns `text` safe inside a <script> element (no `</script>` can close it early)."""
    return text.replace("</", "<\\/")


def plotlyjs_html() -> str:
    """Returns the script elements that load plotly.js inline and draw every figure waiting for it."""
    return ("<script type=\"text/javascript\">window.PlotlyConfig = {MathJaxConfig: 'local'};</script>\n"
            f"<script type=\"text/javascript\">{get_plotlyjs()}</script>\n"
            f"<script type=\"text/javascript\">(window.{QUEUE} || []).splice(0).forEach(function (draw) {{ draw(); }});"
            "</script>\n")


def figure_html(fig_dict: dict, png: bytes | None = None, div_id: str | None = None) -> str:
    """Returns the HTML of one figure: a div (holding the static PNG, if any) and the script that draws it."""
    div_id = div_id or f"wb-{uuid.uuid4().hex}"
    layout = fig_dict.get("layout", {}) or {}
    height = layout.get("height") or DEFAULT_HEIGHT
    figure = {"data": fig_dict.get("data", []), "layout": layout,
              "config": {"responsive": True, **(fig_dict.get("config") or {})}}
    if fig_dict.get("frames"):
        figure["frames"] = fig_dict["frames"]
    title = (layout.get("title") or {}).get("text") if isinstance(layout.get("title"), dict) else layout.get("title")
    fallback = ""
    if png:
        fallback = (f'<img alt="{html.escape(str(title or "figure"))}" style="max-width:100%" '
                    f'src="data:image/png;base64,{base64.b64encode(png).decode()}">')
    data = _script_text(pio.to_json(figure, validate=False))
    return (f'<div class="workbench-figure">\n<div id="{div_id}" class="plotly-graph-div" '
            f'style="height:{int(height)}px; width:100%;">{fallback}</div>\n'
            '<script type="text/javascript">\n(function () {\n'
            f"  var figure = {data};\n"
            "  function draw() {\n"
            f'    var gd = document.getElementById("{div_id}");\n'
            "    if (!gd) { return; }\n"
            "    gd.textContent = \"\";\n"
            "    window.Plotly.newPlot(gd, figure);\n"
            "  }\n"
            f"  if (window.Plotly) {{ draw(); }} else {{ (window.{QUEUE} = window.{QUEUE} || []).push(draw); }}\n"
            "})();\n</script>\n</div>")


def _execution() -> tuple[str | None, str | None]:
    """Returns (cell id, message id) of the request the kernel is executing, or Nones outside a kernel (no IPython,
    or a kernel without `get_parent`: every figure is then "the first")."""
    try:
        from IPython import get_ipython  # noqa: PLC0415 -- optional (the dev extra), and slow to import
    except ImportError:
        return None, None
    get_parent = getattr(getattr(get_ipython(), "kernel", None), "get_parent", None)
    parent = (get_parent() if get_parent is not None else None) or {}
    return (parent.get("metadata") or {}).get("cellId"), (parent.get("header") or {}).get("msg_id")


class WorkbenchRenderer(MimetypeRenderer):
    """Plotly mime type + offline HTML (plotly.js once per kernel) + a static PNG (see the module doc)."""

    def __init__(self, png: bool = True, png_width: int = PNG_WIDTH):
        self.png = png
        self.png_width = png_width
        # plotly copies a renderer for every figure (shallowly): the state lives in one shared dict.
        # home: (cell id, message id) of the execution whose output carries plotly.js.
        self._state: dict = {"home": None, "png_broken": False}

    def needs_plotlyjs(self) -> bool:
        """True for the first figure of the kernel, and again when the cell that carried plotly.js runs again.

        Re-running that cell replaces its output, so its new output must carry plotly.js again;
        a second figure of the same execution does not repeat it.
        """
        cell, msg = _execution()
        home = self._state["home"]
        if home is None or (msg != home[1] and cell is not None and cell == home[0]):
            self._state["home"] = (cell, msg)
            return True
        return False

    def static_png(self, fig_dict: dict) -> bytes | None:
        """Returns the figure as PNG bytes, or None when no browser can make it (then never tries again)."""
        if not self.png or self._state["png_broken"]:
            return None
        try:
            import kaleido  # noqa: PLC0415 -- optional (the dev extra)

            errors = browser_errors()
        except ImportError:  # no kaleido: the HTML and the Plotly mime type still carry the figure
            self._state["png_broken"] = True
            return None
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "server already open", "kopts ignored with a server"
                kaleido.start_sync_server(silence_warnings=True)  # one browser for the kernel's figures
                height = (fig_dict.get("layout") or {}).get("height") or DEFAULT_HEIGHT
                return pio.to_image(fig_dict, format="png", width=self.png_width, height=height, validate=False)
        except errors:  # no Chromium, a sandbox: kaleido's own errors; anything else is a bug to see
            self._state["png_broken"] = True
            return None

    def to_mimebundle(self, fig_dict: dict) -> dict:
        bundle = PlotlyRenderer().to_mimebundle(dict(fig_dict))
        png = self.static_png(fig_dict)
        page = figure_html(fig_dict, png)
        bundle["text/html"] = (plotlyjs_html() + page) if self.needs_plotlyjs() else page
        if png:
            bundle["image/png"] = base64.b64encode(png).decode()
        return bundle


def _in_kernel() -> bool:
    ipython = sys.modules.get("IPython")  # a kernel imported it before any cell ran; importing it here costs seconds
    return ipython is not None and type(ipython.get_ipython()).__module__.startswith("ipykernel.")


def register() -> None:
    """Registers the "workbench" renderer; inside a kernel, makes it the default unless the user chose one."""
    if NAME not in pio.renderers:
        pio.renderers[NAME] = WorkbenchRenderer()
    if _in_kernel() and not os.environ.get("PLOTLY_RENDERER") and pio.renderers.default == "plotly_mimetype":
        pio.renderers.default = NAME


__all__ = ["NAME", "PLOTLY_MIME", "WorkbenchRenderer", "figure_html", "plotlyjs_html", "register"]

register()
