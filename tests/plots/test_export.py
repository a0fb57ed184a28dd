"""Paper figure export: real PDF / SVG through kaleido and the system Chromium, CSV beside each figure."""

import re
import shutil
from pathlib import Path

import pandas as pd
import pytest
import synthetic
import typer
from typer.testing import CliRunner

from workbench.commands.figures import figures as figures_command
from workbench.errors import WorkbenchError
from workbench.plots import depth_matrix_figure, heads_figure
from workbench.plots.export import (
    FigureSpec,
    default_spec,
    export_figures,
    figure_data,
    labelled,
    load_spec,
    paper_figure,
    slice_label,
)
from workbench.plots.heads import RETRIEVAL_MARK
from workbench.plots.registry import captions

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return synthetic.write_results(tmp_path_factory.mktemp("results") / "run1")


def test_paper_figure_size_and_static_slider_step(tables):
    fig = heads_figure(tables["heads"], summary=tables["heads__summary"])
    paper = paper_figure(fig, FigureSpec("heads", 3.5, 2.6, step=2))
    assert (paper.layout.width, paper.layout.height) == (336, 250)  # 96 px per inch
    assert not paper.layout.sliders and paper.layout.title.text is None
    assert [t.name for t in paper.data if t.visible] == ["loop 3", RETRIEVAL_MARK]
    assert fig.layout.sliders and fig.data[0].visible  # the original is untouched
    with pytest.raises(WorkbenchError, match="slider step 9 is out of range"):
        paper_figure(fig, FigureSpec("heads", 3.5, 2.6, step=9))


def test_figure_data_is_the_numbers_drawn(tables):
    fig = depth_matrix_figure(tables["depth_matrix"])
    data = figure_data(fig)
    cells = data[data["trace"] == "accuracy"]
    assert len(cells) == 64
    dm = tables["depth_matrix"]
    want = dm[(dm["depth"] == 5) & (dm["loop"] == 3)]["correct"].mean()
    assert cells[(cells["y"] == 5) & (cells["x"] == 3)]["z"].item() == pytest.approx(want)
    diag = data[data["trace"] == "diagonal (t = d)"]
    assert list(diag["x"]) == list(diag["y"]) == list(range(1, 9))


@pytest.mark.browser  # the browser: static export runs Chromium through kaleido
def test_export_pdf_and_svg_with_csv(results, tmp_path):
    spec = [FigureSpec("frontier", 3.5, 2.6), FigureSpec("depth_matrix", 7.0, 3.2)]
    pdf = export_figures([results], fmt="pdf", out=tmp_path, spec=spec[:1])
    svg = export_figures([results], fmt="svg", out=tmp_path, spec=spec[1:])
    frontier_pdf = tmp_path / "run1" / "frontier.pdf"
    matrix_svg = tmp_path / "run1" / "depth_matrix.svg"
    assert pdf.written == [frontier_pdf, tmp_path / "run1" / "frontier.csv"] and not pdf.skipped
    assert svg.written == [matrix_svg, tmp_path / "run1" / "depth_matrix.csv"]
    head = frontier_pdf.read_bytes()
    assert head.startswith(b"%PDF")
    box = re.search(rb"/MediaBox \[0 0 ([\d.]+) ([\d.]+)\]", head)
    assert float(box.group(1)) == pytest.approx(3.5 * 72, abs=1)  # single column: 3.5 in wide
    text = matrix_svg.read_text()
    assert text.startswith("<svg") and 'width="672"' in text
    csv = pd.read_csv(tmp_path / "run1" / "frontier.csv")
    curve = csv[csv["trace"] == "final-answer accuracy"]
    dm = pd.read_parquet(results / "depth_matrix.parquet")
    acc = dm[dm["loop"] == dm["depth"]].groupby("depth")["correct"].mean()
    assert list(curve["x"]) == list(acc.index) and curve["y"].to_numpy() == pytest.approx(acc.to_numpy())
    assert ((curve["y_low"] <= curve["y"]) & (curve["y"] <= curve["y_high"])).all()  # the Wilson bars
    assert (csv[csv["trace"] == "bar 0.71"]["y"] == 0.71).all()


def test_html_export_shares_one_plotly_js_and_skips_absent_results(tmp_path):
    only = synthetic.write_results(tmp_path / "partial", {"overshoot": synthetic.all_tables()["overshoot"]})
    done = export_figures([only], fmt="html", out=tmp_path / "out", spec=default_spec())
    folder = tmp_path / "out" / "partial"
    assert done.written == [folder / "overshoot.html", folder / "overshoot.csv"]
    assert len(done.skipped) == len(default_spec()) - 1
    page = (folder / "overshoot.html").read_text()
    assert 'src="plotly.min.js"' in page and len(page) < 200_000  # plotly.js not inlined
    assert (folder / "plotly.min.js").stat().st_size > 3e6


def test_an_image_shared_alone_says_its_title_slice_and_caption(tables, tmp_path):
    """A PNG or standalone page carries the figure's title, which slider slice it shows, and its caption; a paper
    PDF keeps neither (its caption is the paper's)."""
    fig = heads_figure(tables["heads"], summary=tables["heads__summary"])
    assert slice_label(fig, 2).startswith("loop t = 3: slice 3 of ")
    assert slice_label(depth_matrix_figure(tables["depth_matrix"]), None) is None
    spec = FigureSpec("heads", 7.0, 3.2, step=2)
    shown = labelled(paper_figure(fig, spec), fig.layout.title.text, captions()["heads"], slice_label(fig, 2))
    assert fig.layout.title.text in shown.layout.title.text and "slice 3 of" in shown.layout.title.text
    assert shown.layout.height > paper_figure(fig, spec).layout.height   # room made for them, the plot not squeezed
    caption = " ".join(a.text for a in shown.layout.annotations).replace("<br>", " ")
    assert captions()["heads"] in caption
    results = synthetic.write_results(tmp_path / "run", {"heads": tables["heads"],
                                                         "heads__summary": tables["heads__summary"]})
    export_figures([results], fmt="html", out=tmp_path / "out", spec=[spec])
    page = (tmp_path / "out" / "run" / "heads.html").read_text()
    unwrapped = page.replace("\\u003cbr\\u003e", " ")   # the caption is wrapped under the plot
    assert "slice 3 of" in page and "Open circles mark retrieval heads" in unwrapped


def test_spec_file_and_errors(tmp_path):
    specs, dpi = load_spec(REPO / "figures" / "paper.toml")
    assert dpi == 300 and {s.width_in for s in specs} == {3.5, 7.0}
    assert [s.stem for s in specs if s.name == "logit_lens"] == ["logit_lens", "logit_lens_raw"]
    bad = tmp_path / "bad.toml"
    bad.write_text('[[figure]]\nname = "frontier"\nsize = "triple"\n')
    with pytest.raises(WorkbenchError, match="size 'triple' is unknown; accepted: single, double"):
        load_spec(bad)
    bad.write_text('[[figure]]\nname = "fronteir"\n')
    with pytest.raises(WorkbenchError, match="figure 'fronteir' is unknown"):
        load_spec(bad)
    with pytest.raises(WorkbenchError, match="format 'jpeg' is unknown"):
        export_figures([tmp_path], fmt="jpeg")
    with pytest.raises(WorkbenchError, match="no results directory"):
        export_figures([], fmt="pdf")


@pytest.mark.browser  # the browser: static export runs Chromium through kaleido
def test_figures_command_writes_png_from_the_spec(results, tmp_path):
    app = typer.Typer()
    app.command()(figures_command)
    spec = tmp_path / "one.toml"
    spec.write_text('dpi = 150\n[[figure]]\nname = "overshoot"\nsize = "single"\n')
    out = tmp_path / "figs"
    res = CliRunner().invoke(app, ["--results", str(results), "--format", "png", "--out", str(out), "--spec", str(spec)])
    assert res.exit_code == 0, res.output
    png = out / "run1" / "overshoot.png"
    data = png.read_bytes()
    assert data.startswith(b"\x89PNG")
    width = int.from_bytes(data[16:20], "big")
    assert width == round(3.5 * 150)  # 3.5 in at 150 dpi
    assert "wrote 1 png figure(s)" in res.output


def test_figures_command_defaults_to_the_results_folder(results, tmp_path, monkeypatch):
    app = typer.Typer()
    app.command()(figures_command)
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, ["--format", "html"])
    assert res.exit_code != 0 and "no --results given" in str(res.exception)
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "run1").symlink_to(results, target_is_directory=True)
    res = CliRunner().invoke(app, ["--format", "html"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "figures" / "out" / "run1" / "frontier.html").is_file()
    (tmp_path / "results" / "demo").mkdir()  # `make demo` nests its probe results: results/demo/probe
    shutil.copytree(results, tmp_path / "results" / "demo" / "probe")
    res = CliRunner().invoke(app, ["--format", "html", "--out", "figs"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "figs" / "probe" / "frontier.html").is_file() and (tmp_path / "figs" / "run1").is_dir()
    shutil.copytree(results, tmp_path / "results" / "demo" / "run1")
    res = CliRunner().invoke(app, ["--format", "html", "--out", "figs2"])
    assert res.exit_code != 0 and "share the name 'run1'" in str(res.exception)


def test_figures_show_progress_only_when_asked(tables, tmp_path, capsys):
    """The command asks for the bar where stderr is a terminal (commands.output); asked, a bar counts the figures,
    not asked (a pipe, --quiet), stderr stays empty."""
    results = synthetic.write_results(tmp_path / "run", {"overshoot": tables["overshoot"],
                                                         "overshoot__cost": tables["overshoot__cost"]})
    spec = [s for s in default_spec() if s.name.startswith("overshoot")]
    export_figures([results], fmt="html", out=tmp_path / "quiet", spec=spec)
    assert capsys.readouterr().err == ""
    export_figures([results], fmt="html", out=tmp_path / "shown", spec=spec, progress=True)
    err = capsys.readouterr().err
    assert "figures run" in err and f"{len(spec)}/{len(spec)}" in err
