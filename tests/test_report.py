"""The offline HTML report: content checks, and a real headless Chromium that must draw every figure."""

import html
import importlib.util
import json
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
import typer
from plotly.offline import get_plotlyjs
from typer.testing import CliRunner

from workbench.analysis.headlines import headlines_from_tables
from workbench.commands.report import report as report_command
from workbench.errors import WorkbenchError
from workbench.plots import build_all, captions, figures
from workbench.plots.registry import figure_key
from workbench.plots.report import BLOCK_SELECTION_CAPTION, write_report


def _synthetic():
    """tests/plots/synthetic.py (probe tables that follow the schemas), loaded by path."""
    if "synthetic" not in sys.modules:
        spec = importlib.util.spec_from_file_location("synthetic", Path(__file__).parent / "plots" / "synthetic.py")
        sys.modules["synthetic"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules["synthetic"])
    return sys.modules["synthetic"]


synthetic = _synthetic()
all_tables, summary, write_results = synthetic.all_tables, synthetic.summary, synthetic.write_results
PLOTLY_SIGNATURE = "* plotly.js v"  # the bundle's licence header, once per copy of plotly.js
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
                  "--virtual-time-budget=15000"]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return write_results(tmp_path_factory.mktemp("report") / "demo")


@pytest.fixture(scope="module")
def page(results):
    return write_report(results)


def chromium() -> str:
    """Returns the Chromium binary; fails (not skips) when it is missing: the set-up installs it."""
    path = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
    if path is None:
        pytest.fail("chromium is not installed (looked on PATH and at /usr/bin/chromium); "
                    "run `make browser` (scripts/install_chromium.sh; `make test` does)")
    return path


def browse(html_file: Path, tmp: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={tmp / 'profile'}", *extra, html_file.resolve().as_uri()]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180)


class PlotDivs(HTMLParser):
    """Collects, for each plotly div (by id), whether a drawn `main-svg` lies inside it; and the sentinels."""

    def __init__(self):
        super().__init__()
        self.depth, self.open, self.drawn, self.sentinels, self._text_of = 0, [], {}, {}, None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        classes = (a.get("class") or "").split()
        if tag == "div":
            self.depth += 1
            if "plotly-graph-div" in classes:
                self.open.append((a["id"], self.depth))
                self.drawn[a["id"]] = False
        if "main-svg" in classes:
            for div_id, _ in self.open:
                self.drawn[div_id] = True
        if a.get("id") in ("js-errors", "render-status"):
            self.sentinels[a["id"]] = {"attrs": a, "text": ""}
            self._text_of = a["id"]

    def handle_endtag(self, tag):
        if tag == "div":
            if self.open and self.open[-1][1] == self.depth:
                self.open.pop()
            self.depth -= 1
        if tag in ("pre", "span"):
            self._text_of = None

    def handle_data(self, data):
        if self._text_of:
            self.sentinels[self._text_of]["text"] += data


def parse_dom(dom: str) -> PlotDivs:
    p = PlotDivs()
    p.feed(dom)
    return p


@pytest.mark.browser  # the browser: reads the page headless Chromium rendered
def test_report_embeds_plotly_once_and_one_div_per_figure(results, page):
    assert page == results / "report.html"
    text = page.read_text()
    assert text.count(PLOTLY_SIGNATURE) == 1
    n_figures = len(build_all(all_tables()))
    assert text.count('class="plotly-graph-div"') == n_figures + 1 == 26  # + block selection
    ours = text.replace(get_plotlyjs(), "")  # the bundle itself names CDNs it never fetches
    assert len(ours) < len(text) - 4_000_000
    assert "<script src" not in ours and "http" not in ours  # nothing to fetch: works offline
    s = summary(all_tables())
    frontier = headlines_from_tables(all_tables())["depth_matrix"]["frontier_0.71"]
    assert frontier.value == round(s["probes"]["depth_matrix"]["frontier"], 2)
    assert f"<td>{html.escape(frontier.label)}</td><td class='num'>{frontier.text()}</td>" in text
    assert s["checkpoint"]["provenance_sha256"] in text and "training/keepers/smollm2-chase" in text
    assert "ab" * 32 in text and "cd" * 32 in text and "probes/n16.jsonl" in text
    assert "<table id='identity-table'>" in text and text.count("<td class='num'>bridge</td>") == 4
    assert "Not in this directory" not in text


class ElementText(HTMLParser):
    """The text inside the element with a given id, cell by cell (a tab between cells, a newline between rows)."""

    def __init__(self, element_id: str):
        super().__init__()
        self.element_id, self.depth, self.text = element_id, 0, []

    def handle_starttag(self, tag, attrs):
        if self.depth:
            self.depth += 1
            self.text.append("\n" if tag == "tr" else "\t" if tag in ("td", "th") else "")
        elif dict(attrs).get("id") == self.element_id:
            self.depth = 1

    def handle_endtag(self, tag):
        if self.depth:
            self.depth -= 1

    def handle_data(self, data):
        if self.depth:
            self.text.append(data)


def element_text(dom: str, element_id: str) -> str:
    p = ElementText(element_id)
    p.feed(dom)
    return "".join(p.text)


RAW_JSON = re.compile(r"""[{\[]\s*["']|["']\s*:\s*[{\["'\d]""")  # {"key": ..., ["a", ...


@pytest.mark.browser  # the browser: headless Chromium
def test_headline_section_in_headless_chromium_holds_the_declared_headlines(page, tmp_path):
    """Rendered by Chromium: every probe's sentence and every number (label, value [interval], n), no raw JSON."""
    run = browse(page, tmp_path, "--dump-dom")
    assert run.returncode == 0, run.stderr[-2000:]
    text = element_text(run.stdout, "headline")
    declared = headlines_from_tables(all_tables())
    assert len(declared) == 18 and len(text) > 2000
    for name, head in declared.items():
        assert f"\t{name}\n" in text and head.sentence in text
        for n in head.numbers:
            low_high = "" if n.low is None else n.text().removeprefix(n.text().split(" [")[0]).strip()
            row = f"\t{n.label}\t{n.text().split(' [')[0]}\t{low_high}\t{'' if n.n is None else n.n}\t"
            assert row in text, row
    assert not RAW_JSON.search(text), RAW_JSON.search(text)
    assert RAW_JSON.search('x\t{"rows": 56, "matrix": {"1": {"1": 1.0}') is not None  # the check can fail


@pytest.mark.browser  # the browser: reads the page headless Chromium rendered
def test_every_figure_has_a_caption(page):
    caption = {**captions(), "block_selection": BLOCK_SELECTION_CAPTION}
    keys = [figure_key(b) for bs in figures().values() for b in bs] + ["block_selection", "identity"]
    assert set(keys) <= set(caption)
    text = page.read_text()
    for key in keys:
        assert f"data-figure='{key}'" in text
        assert "Predicted:" in caption[key]


def test_claims_ledger_rows_appear_with_their_verdicts(tmp_path):
    results = write_results(tmp_path / "with-claims", {"depth_matrix": all_tables()["depth_matrix"],
                                                        "depth_matrix__frontier": all_tables()["depth_matrix__frontier"]})
    rows = [{"claim": "frontier / support is 1.44-1.50", "paper": "retrofit §5", "ours": "1.44× (n = 8 per depth)",
             "verdict": "reproduced", "why": "within the paper's range"},
            {"claim": "overshoot iterates 93% of extra loops", "paper": "retrofit §5.2", "ours": "0.51 [0.39, 0.65]",
             "verdict": "partly", "why": "iterates, but less often <than> the paper"}]
    (results / "claims.json").write_text(json.dumps(rows))
    text = write_report(results).read_text()
    ledger = element_text(text, "claims")
    assert ledger.count("\n") == 3  # header and two rows
    assert "\treproduced\t" in ledger and "\tpartly\t" in ledger and "less often <than> the paper" in ledger
    assert "<td class='verdict'>partly</td>" in text and "&lt;than&gt;" in text
    (results / "claims.json").write_text(json.dumps([{"claim": "x", "paper": "y"}]))
    with pytest.raises(WorkbenchError, match="row 0 lacks 'ours'"):
        write_report(results)
    (results / "claims.json").unlink()
    assert "id='claims'" not in write_report(results).read_text()


def test_control_side_by_side_with_paired_tests(tmp_path):
    tables = all_tables()
    keeper = write_results(tmp_path / "keeper", {k: tables[k] for k in ("depth_matrix", "depth_matrix__frontier",
                                                                         "overshoot", "overshoot__cost")})
    dm = tables["depth_matrix"].copy()
    dm["correct"] = dm["correct"].where(dm["correct"].isna(), False).astype("boolean")  # a control that is always wrong
    control = write_results(tmp_path / "control", {"depth_matrix": dm,
                                                   "depth_matrix__frontier": tables["depth_matrix__frontier"],
                                                   "overshoot": tables["overshoot"],
                                                   "overshoot__cost": tables["overshoot__cost"]})
    for d in (keeper, control):  # compare_results pairs only results computed on the same rows
        (d / "summary.json").write_text(json.dumps({"probe_runs": {"depth_matrix": {"rows": {"rows_sha256": "ab" * 32}}}}))
    app = typer.Typer()
    app.command()(report_command)
    out = tmp_path / "side-by-side.html"
    res = CliRunner().invoke(app, [str(keeper), "--control", str(control), "--out", str(out)])
    assert res.exit_code == 0, res.output
    text = out.read_text()
    table = element_text(text, "headline")
    assert "this − control [95% CI]" in table and "\tcontrol: " in table
    mine, theirs = headlines_from_tables(tables)["depth_matrix"], headlines_from_tables(
        {"depth_matrix": dm, "depth_matrix__frontier": tables["depth_matrix__frontier"]})["depth_matrix"]
    d1 = mine["final_d1"]
    assert theirs["final_d1"].value == 0.0
    line = next(x for x in table.split("\n") if x.startswith(f"\t{d1.label}\t"))
    cells = line.split("\t")
    assert cells[2] == d1.text() and cells[4] == theirs["final_d1"].text()
    assert cells[6].startswith(f"{d1.value:+.2f} [") and float(cells[7]) < 0.05  # paired: McNemar p
    assert "id='paired-depths'" in text and "McNemar" in text
    # the control is drawn beside the specimen: each figure both have, twice, labelled, the control's from its tables
    for key in ("depth_matrix", "overshoot"):
        assert f"id=\"fig-{key}\"" in text and f"id=\"fig-{key}-control\"" in text
    drawn_twice = re.findall(r'id="fig-([\w.-]+)-control"', text)
    assert text.count("<p class='side'>this specimen</p>") == len(drawn_twice) == len(set(drawn_twice)) >= 2


@pytest.mark.browser  # the browser: headless Chromium
def test_report_renders_every_figure_in_headless_chromium(page, tmp_path):
    run = browse(page, tmp_path, "--dump-dom")
    assert run.returncode == 0, run.stderr[-2000:]
    dom = parse_dom(run.stdout)
    assert len(dom.drawn) == 26
    undrawn = [k for k, v in dom.drawn.items() if not v]
    assert not undrawn, f"figures not drawn: {undrawn}"
    assert dom.sentinels["js-errors"]["text"].strip() == ""
    status = dom.sentinels["render-status"]["attrs"]
    assert status["data-figures"] == status["data-drawn"] == "26"
    shot = tmp_path / "report.png"
    run = browse(page, tmp_path, f"--screenshot={shot}", "--window-size=1400,3000")
    assert run.returncode == 0, run.stderr[-2000:]
    png = shot.read_bytes()
    assert png.startswith(b"\x89PNG") and int.from_bytes(png[16:20], "big") == 1400


@pytest.mark.browser  # the browser: headless Chromium
def test_the_error_sentinel_catches_a_broken_script(page, tmp_path):
    """The check above can fail: a script that throws is reported in #js-errors."""
    broken = tmp_path / "broken.html"
    broken.write_text(page.read_text().replace("</main>", "<script>throw new Error('boom-42')</script></main>"))
    run = browse(broken, tmp_path, "--dump-dom")
    assert "boom-42" in parse_dom(run.stdout).sentinels["js-errors"]["text"]


def test_report_tolerates_missing_results(tmp_path):
    partial = write_results(tmp_path / "partial", {"depth_matrix": all_tables()["depth_matrix"]}, with_summary=False)
    text = write_report(partial, out=tmp_path / "elsewhere" / "r.html").read_text()
    assert text.count('class="plotly-graph-div"') == 2  # the matrix and the frontier
    assert "No provenance recorded" in text  # no summary.json: the headline is read from the tables themselves
    assert headlines_from_tables({"depth_matrix": all_tables()["depth_matrix"]})["depth_matrix"].sentence in \
        html.unescape(text)
    assert "Not in this directory: Block selection, Loop-1 identity, Accuracy by loop count, Overshoot, Per" in text
    empty = tmp_path / "empty"
    empty.mkdir()
    text = write_report(empty).read_text()
    assert text.count('class="plotly-graph-div"') == 0 and "No headline numbers" in text
    with pytest.raises(WorkbenchError, match="results directory '.*nowhere' does not exist"):
        write_report(tmp_path / "nowhere")
    (empty / "summary.json").write_text("{not json")
    with pytest.raises(WorkbenchError, match="summary.json: not valid JSON"):
        write_report(empty)


def test_unregistered_tables_are_listed(tmp_path):
    tables = {"depth_matrix": all_tables()["depth_matrix"], "mystery": all_tables()["latency"]}
    text = write_report(write_results(tmp_path / "r", tables)).read_text()
    assert "No figure registered for: <code>mystery</code> (8 rows)" in text


def test_report_command(results, tmp_path):
    app = typer.Typer()
    app.command()(report_command)
    out = tmp_path / "cli.html"
    res = CliRunner().invoke(app, [str(results), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert f"report: {out}" in res.output and out.read_text().count(PLOTLY_SIGNATURE) == 1
    assert json.loads((results / "summary.json").read_text())["created_by"] in out.read_text()


def test_the_report_shows_progress_only_when_asked(tmp_path, capsys):
    results = write_results(tmp_path / "run", {k: all_tables()[k] for k in ("overshoot", "overshoot__cost")})
    write_report(results, tmp_path / "quiet.html")
    assert capsys.readouterr().err == ""
    write_report(results, tmp_path / "shown.html", progress=True)
    assert "report figures" in capsys.readouterr().err
