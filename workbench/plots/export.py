"""Paper figures: static export (PDF, SVG, PNG) or standalone HTML at publication sizes, each figure
with the CSV of the numbers it shows beside it.

Static images go through kaleido and the system Chromium; one browser serves every export of
a call (`workbench.plots.browser.Browser`). Nothing here downloads a browser: a missing Chromium
is an error that says how to install one.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.offline import get_plotlyjs
from tqdm.auto import tqdm

from workbench.analysis.results import load_results, probes_run
from workbench.defaults import resolve
from workbench.errors import WorkbenchError
from workbench.guard import FILES, OutputKind, dir_inputs, guard_output, mark_output, marked_by, safe_child
from workbench.io import write_bytes_atomic
from workbench.plots.browser import Browser
from workbench.plots.registry import build, captions, figure_key, figures, find_builder
from workbench.readers import read_toml

FORMATS = ("pdf", "svg", "png", "html")
WIDTHS_IN = {"single": 3.5, "double": 7.0}
HEIGHTS_IN = {"single": 2.6, "double": 3.2}
CSS_PX_PER_IN = 96  # plotly's layout unit; PDF and SVG pages come out at 96 px per inch
DPI = 300
SHARED_ALONE = ("png", "html")  # formats shared on their own carry their title, slice and caption; pdf/svg go to papers
FIGURE_SUFFIXES = (".pdf", ".svg", ".png", ".html", ".csv", ".js")  # what an export writes in its folders


def figure_file(path: Path) -> bool:
    """Whether `path` is what an export wrote: a folder an export marked, or a file with a figure's suffix in one."""
    if path.is_dir():
        return not path.is_symlink() and marked_by(path, "figures")
    return path.suffix in FIGURE_SUFFIXES and marked_by(path.parent, "figures")


# What `figures` writes, handed to the output guard: files in one folder per results directory, each replaced only
# when an export wrote it (its folder carries the marker of `workbench figures`).
FIGURES_OUTPUT = OutputKind("figures", FILES, owns=figure_file)


@dataclass(frozen=True)
class FigureSpec:
    """One paper figure: which registered figure, at which size, with which builder options."""

    name: str
    width_in: float
    height_in: float
    options: dict = field(default_factory=dict)
    step: int | None = None  # slider step shown in a static image (default: the builder's active step)
    file: str | None = None  # output stem; default `name`

    @property
    def stem(self) -> str:
        return self.file or self.name


def default_spec(results: Iterable[str] = ()) -> list[FigureSpec]:
    """Returns every registered figure at double-column width, with the table figure of each probe of `results` that
    declares no section (`workbench.plots.registry.table_section`)."""
    return [FigureSpec(figure_key(b), WIDTHS_IN["double"], HEIGHTS_IN["double"])
            for bs in figures(results).values() for b in bs]



def load_spec(path: str | os.PathLike) -> tuple[list[FigureSpec], int]:
    """Returns the figures listed in a spec TOML file (or a shipped spec's name, `paper`) and its dpi (for PNG).

    The file holds an optional `dpi` and `[[figure]]` tables with `name` (a registered figure),
    `size` ("single" or "double") or `width_in`, optional `height_in`, `step`, `file`, and
    `options` (keyword arguments of the builder).
    """
    path = resolve("figure spec", path)
    raw = read_toml(path, "figure spec")
    unknown = set(raw) - {"dpi", "figure"}
    if unknown:
        raise WorkbenchError(f"{path}: unknown key(s) {', '.join(sorted(unknown))}; accepted: dpi, figure")
    specs = []
    for entry in raw.get("figure", []):
        bad = set(entry) - {"name", "size", "width_in", "height_in", "options", "step", "file"}
        if bad or "name" not in entry:
            raise WorkbenchError(f"{path}: figure entry {entry} has unknown keys {sorted(bad)} or no name; accepted: "
                                 "name, size, width_in, height_in, options, step, file")
        find_builder(entry["name"])
        size = entry.get("size", "double")
        if size not in WIDTHS_IN:
            raise WorkbenchError(f"{path}: size '{size}' is unknown; accepted: {', '.join(WIDTHS_IN)}")
        try:
            width, height = (float(entry.get(k, d[size])) for k, d in (("width_in", WIDTHS_IN), ("height_in", HEIGHTS_IN)))
            options, step, dpi = dict(entry.get("options", {})), entry.get("step"), int(raw.get("dpi", DPI))
        except (TypeError, ValueError):
            raise WorkbenchError(f"{path}: figure entry {entry['name']!r}: width_in / height_in / dpi must be numbers, "
                                 "options a table") from None
        if not (0 < width < 100 and 0 < height < 100 and 0 < dpi <= 2400) or (
                step is not None and (not isinstance(step, int) or isinstance(step, bool))):
            raise WorkbenchError(f"{path}: figure entry {entry['name']!r}: sizes must be in (0, 100) inches, dpi in "
                                 "1..2400, step an integer")
        stem = entry.get("file")
        if stem is not None:
            if not isinstance(stem, str):
                raise WorkbenchError(f"{path}: figure entry {entry['name']!r}: file must be a string")
            safe_child(".", stem, f"{path}: figure file")  # a name from the file's content: never ../ or absolute
        specs.append(FigureSpec(entry["name"], width, height, options, step, stem))
    return specs, int(raw.get("dpi", DPI))


def _show_step(fig: go.Figure, step: int | None) -> None:
    """Keeps only one slider step's traces visible and drops the slider (it cannot move on paper)."""
    if not fig.layout.sliders:
        return
    slider = fig.layout.sliders[0]
    index = slider.active if step is None else step
    if not 0 <= index < len(slider.steps):
        raise WorkbenchError(f"slider step {index} is out of range; the figure has {len(slider.steps)} steps")
    for trace, visible in zip(fig.data, slider.steps[index].args[0]["visible"]):
        trace.visible = visible
    fig.layout.sliders = ()  # update_layout(sliders=[]) merges and keeps the old slider


def slice_label(fig: go.Figure, step: int | None) -> str | None:
    """Which slider step a static image shows ("loop t = 2, slice 2 of 4"), or None for a figure without a slider."""
    if not fig.layout.sliders:
        return None
    slider = fig.layout.sliders[0]
    index = slider.active if step is None else step
    if not 0 <= index < len(slider.steps):
        raise WorkbenchError(f"slider step {index} is out of range; the figure has {len(slider.steps)} steps")
    prefix = (slider.currentvalue.prefix or "") if slider.currentvalue else ""
    return (f"{prefix}{slider.steps[index].label}: slice {index + 1} of {len(slider.steps)} (a figure spec's `step` "
            "picks another; the HTML report has them all)")


def _wrap(text: str, width: int) -> list[str]:
    lines, line = [], ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}".strip()
    return lines + ([line] if line else [])


def labelled(paper: go.Figure, title: str | None, caption: str | None, slice_text: str | None) -> go.Figure:
    """Returns `paper` with its title (and the slice it shows) on top and its caption under the plot: an image
    shared on its own (PNG, a standalone page) says what it is, unlike a paper PDF whose caption is LaTeX's."""
    width = paper.layout.width or 700
    top = [t for t in (title, slice_text) if t]
    chars = max(40, int(width / 6.2))   # about 6 px a character at the 10 px caption font
    below = _wrap(caption, chars) if caption else []
    head = "<br>".join([f"<b>{top[0]}</b>", *[f"<span style='font-size:0.85em'>{t}</span>" for t in top[1:]]]) \
        if top else None
    extra_top, extra_bottom = 16 * len(top) + 8, 13 * len(below) + 8
    margin = paper.layout.margin
    paper.update_layout(height=(paper.layout.height or 450) + extra_top + extra_bottom,
                        margin=dict(t=(margin.t or 0) + extra_top, b=(margin.b or 0) + extra_bottom),
                        title=dict(text=head, x=0, xanchor="left", y=1, yanchor="top", pad=dict(t=4),
                                   font=dict(size=11)) if head else None)
    if below:
        paper.add_annotation(text="<br>".join(below), xref="paper", yref="paper", x=0, xanchor="left",
                             y=0, yanchor="top", yshift=-((margin.b or 0) + 2), showarrow=False, align="left",
                             font=dict(size=10, color="#444"))
    return paper


def paper_figure(fig: go.Figure, spec: FigureSpec) -> go.Figure:
    """Returns a copy of `fig` styled for print at the spec's size: no title (the caption says it), small fonts."""
    fig = go.Figure(fig)  # a copy that keeps numpy arrays (deepcopy would base64-encode them)
    _show_step(fig, spec.step)
    small = spec.width_in < 5
    fig.update_layout(width=round(spec.width_in * CSS_PX_PER_IN), height=round(spec.height_in * CSS_PX_PER_IN),
                      title=None, font=dict(size=9 if small else 10),
                      margin=dict(l=48, r=8, t=24 if fig.layout.annotations else 8, b=40),
                      legend=dict(font=dict(size=8 if small else 9)))
    fig.update_annotations(font_size=9 if small else 10)
    fig.update_traces(textfont_size=7, selector=dict(type="heatmap"))
    return fig


def figure_data(fig: go.Figure) -> pd.DataFrame:
    """Returns the numbers a figure shows, one row per drawn point or cell: trace, x, y, z (heatmaps),
    y_low, y_high (interval bars); a table figure gives its own columns.

    Only visible traces count; a heatmap contributes one row per cell.
    """
    frames = []
    for trace in fig.data:
        if trace.visible is False or trace.visible == "legendonly":
            continue
        name = trace.name or trace.type
        if trace.type == "table":  # a table figure (a probe's table section): its cells, one row per table row
            frames.append(pd.DataFrame(dict(zip(trace.header.values, trace.cells.values))).assign(trace=name))
        elif trace.type == "heatmap":
            z = pd.DataFrame(list(trace.z)).apply(pd.to_numeric, errors="coerce").to_numpy(dtype=float)
            x = list(trace.x) if trace.x is not None else list(range(z.shape[1]))
            y = list(trace.y) if trace.y is not None else list(range(z.shape[0]))
            xx, yy = np.meshgrid(x, y)
            frames.append(pd.DataFrame({"trace": name, "x": xx.ravel(), "y": yy.ravel(), "z": z.ravel()}))
        elif getattr(trace, "y", None) is not None:
            frame = pd.DataFrame({"trace": name, "x": list(trace.x), "y": list(trace.y)})
            err = getattr(trace, "error_y", None)
            if err is not None and err.array is not None:  # interval bars drawn: their ends are numbers shown too
                frame["y_low"] = frame["y"] - np.asarray(err.arrayminus if err.arrayminus is not None else err.array)
                frame["y_high"] = frame["y"] + np.asarray(err.array)
            frames.append(frame)
    if not frames:
        return pd.DataFrame(columns=["trace", "x", "y"])
    return pd.concat(frames, ignore_index=True)


@dataclass
class Export:
    """What `export_figures` wrote, and the figures it skipped (with the reason)."""

    written: list[Path] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def _write_one(fig: go.Figure, spec: FigureSpec, fmt: str, folder: Path, dpi: int,
               results: Iterable[str] = ()) -> list[Path]:
    paper = paper_figure(fig, spec)
    if fmt in SHARED_ALONE:   # title, slice and caption travel with the image
        title = fig.layout.title.text if fig.layout.title else None
        paper = labelled(paper, title, captions(results).get(spec.name), slice_label(fig, spec.step))
    image = folder / f"{spec.stem}.{fmt}"
    if fmt == "html":
        js = folder / "plotly.min.js"
        if not js.exists():
            write_bytes_atomic(js, get_plotlyjs().encode())  # one copy per folder, shared by every page: works offline
        write_bytes_atomic(image, paper.to_html(include_plotlyjs="directory", full_html=True).encode())
    else:
        scale = dpi / CSS_PX_PER_IN if fmt == "png" else 1.0
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="The kopts argument is ignored")  # sizes go in the layout
            write_bytes_atomic(image, paper.to_image(format=fmt, scale=scale))
    table = folder / f"{spec.stem}.csv"
    write_bytes_atomic(table, figure_data(paper).to_csv(index=False).encode())
    return [image, table]


def export_figures(results: list[str | os.PathLike], fmt: str = "pdf", out: str | os.PathLike = "figures/out",
                   spec: list[FigureSpec] | None = None, dpi: int = DPI, progress: bool = False) -> Export:
    """Writes each spec'd figure of each results directory to `out/<results name>/<figure>.<fmt>` plus a CSV.

    Args:
        results: results directories (probe parquet files); a figure whose tables a directory lacks is skipped.
        fmt: pdf, svg, png (at `dpi`) or html (standalone page; plotly.min.js written once per folder).
        out: output directory.
        spec: figures and sizes; default every registered figure at double-column width.
        dpi: resolution of PNG output.
        progress: show a bar over the figures (the command passes it where stderr is a terminal).
    """
    if fmt not in FORMATS:
        raise WorkbenchError(f"format '{fmt}' is unknown; accepted: {', '.join(FORMATS)}")
    if not results:
        raise WorkbenchError("no results directory given; pass --results DIR")
    ran = sorted({name for r in results for name in probes_run(r)})
    spec = default_spec(ran) if spec is None else spec
    done = Export()
    folders = [Path(r).resolve().name for r in results]
    names = [str(safe_child(f, n, "figure file")) for f in folders for s in spec
             for n in (f"{s.stem}.{fmt}", f"{s.stem}.csv")]
    guard = guard_output(out, "figures", kind=FIGURES_OUTPUT, overwrite=True, names=names, reading=dir_inputs(*results))
    loaded = [(Path(r), load_results(r)) for r in results]
    with Browser() if fmt != "html" else contextlib.nullcontext():
        for path, tables in loaded:
            folder = Path(out) / path.resolve().name
            guard.recheck()
            if not folder.exists():
                folder.mkdir(parents=True)
                mark_output(folder, "figures")  # a later export may replace what this one writes here, nothing else
            for s in tqdm(spec, desc=f"figures {path.name}", unit="figure", disable=not progress):
                result, builder = find_builder(s.name, ran)
                try:
                    fig = build(result, builder, tables, **s.options) if result in tables else None
                except WorkbenchError as err:  # e.g. a lens these results lack: the other figures still go out
                    done.skipped.append(f"{path.name}/{s.stem}: {err}")
                    continue
                if fig is None:
                    done.skipped.append(f"{path.name}/{s.stem}: {result} tables absent")
                    continue
                done.written += _write_one(fig, s, fmt, folder, dpi, ran)
            guard.wrote()  # what this export wrote is its own: the next folder's re-check compares against it
    return done
