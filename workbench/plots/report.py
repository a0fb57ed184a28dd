"""A results directory → one self-contained HTML report that works offline.

plotly.js is embedded once, in one `<script>` tag; each figure is a div plus a small script
that draws it. The page records any JavaScript error in `#js-errors` and, once every figure
is drawn, writes the count of drawn figures into `#render-status`, so a headless browser can
check the page without a debugger.

The page reads like a results section: each probe's headline (`workbench.analysis.headlines`) with its
sentence, numbers, n and 95% intervals; with a control (`control=`), the control's numbers beside
them with paired tests over the shared rows; the claims ledger rows when the directory holds a
`claims.json`; and a caption under every figure saying what it shows and what the mechanism predicts.
"""

from __future__ import annotations

import html
import json
import os
from pathlib import Path
from typing import Iterable

import pandas as pd
from plotly.offline import get_plotlyjs
from tqdm.auto import tqdm

from workbench.analysis.headlines import (
    compare_headlines,
    failed_predictions,
    fmt,
    fmt_number,
    headline_table,
    headlines_from_summary,
    headlines_from_tables,
    judged_predictions,
)
from workbench.analysis.readings import battery_notes
from workbench.analysis.results import compare_results, load_results, probes_run, read_summary
from workbench.defaults import OLD_SWEEP_TABLE, SWEEP_TABLE
from workbench.errors import WorkbenchError
from workbench.io import write_bytes_atomic
from workbench.plots.registry import build_all, captions, part_names, sections
from workbench.plots.selection import angular_distance_figure, sweep_figure, sweep_frame
from workbench.readers import json_value, under_old_name

REPORT = "report.html"
BLOCK_SELECTION = "block_selection.json"

# The report's own section: block_selection.json, written by `workbench select-block`, is no probe's. Every
# other section, and every figure's caption, is a probe's, declared by the plots (`SECTIONS`,
# `workbench.plots.registry`).
BLOCK_SELECTION_SECTION = ("Block selection", "Angular distance between adjacent layers, the Kneedle knees and the "
                                              "damage of each ablated window: where the loop was cut.")
BLOCK_SELECTION_CAPTION = ("Angular distance between consecutive layers, the knees and each window's damage. "
                           "Predicted: large distances at both ends, a flat middle span to loop.")
# `select-block --window-sweep`'s table (`SWEEP_TABLE`): the candidate windows trained briefly, ranked
SWEEP_SECTION = ("Block selection, the window sweep", "Each candidate window trained for the same short budget and "
                  "ranked by held-out CE (RecurTrace App. B): which window learns to loop, not which one looping "
                  "disturbs least.")
SWEEP_CAPTION = ("Held-out CE per candidate window with its 95% bootstrap interval over rows, and loop-2 accuracy at "
                  "depth 2 with its Wilson interval; the recommendation in green. Predicted by Stage 1: its untrained "
                  "pick trains best.")
CLAIMS = "claims.json"
CLAIM_KEYS = ("claim", "paper", "ours", "verdict", "why")

ERROR_HOOK = """<script>
window.__wbErrors = [];
function __wbRecord(message) {
  window.__wbErrors.push(String(message));
  var el = document.getElementById("js-errors");
  if (el) { el.textContent = window.__wbErrors.join("\\n"); el.style.display = "block"; }
}
window.addEventListener("error", function (e) {
  __wbRecord((e.message || "error") + " at " + (e.filename || "?") + ":" + (e.lineno || "?"));
});
window.addEventListener("unhandledrejection", function (e) {
  __wbRecord("unhandled rejection: " + ((e.reason && e.reason.message) || e.reason));
});
document.addEventListener("DOMContentLoaded", function () { if (window.__wbErrors.length) __wbRecord("(replayed)"); });
</script>"""

RENDER_CHECK = """<script>
window.addEventListener("load", function () { setTimeout(function () {
  var divs = document.querySelectorAll(".plotly-graph-div");
  var drawn = 0;
  divs.forEach(function (d) { if (d.querySelector(".main-svg")) drawn += 1; });
  var el = document.getElementById("render-status");
  el.setAttribute("data-figures", divs.length);
  el.setAttribute("data-drawn", drawn);
  el.textContent = drawn + " of " + divs.length + " figures drawn";
}, 200); });
</script>"""

CSS = """
body { font-family: Inter, "Helvetica Neue", Arial, sans-serif; color: #222; margin: 0; background: #fafafa; }
main { max-width: 1200px; margin: 0 auto; padding: 24px 32px 64px; background: white; }
h1 { font-size: 26px; margin-bottom: 4px; } h2 { font-size: 20px; margin-top: 40px; border-bottom: 1px solid #ddd; }
p.lead, p.caption { color: #555; margin-top: 4px; }
table { border-collapse: collapse; font-size: 13px; margin: 8px 0 16px; }
th, td { border-bottom: 1px solid #e5e5e5; padding: 4px 12px 4px 0; text-align: left; vertical-align: top; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.group th { padding-top: 10px; font-size: 14px; }
.scroll { max-height: 520px; overflow-y: auto; border: 1px solid #eee; padding: 0 8px; display: inline-block; }
code, td.hash { font-family: "SFMono-Regular", Menlo, Consolas, monospace; font-size: 12px; word-break: break-all; }
nav a { margin-right: 14px; font-size: 13px; }
.figure { margin: 12px 0 28px; }
.pair { display: flex; gap: 12px; } .pair > div { flex: 1 1 0; min-width: 0; }
p.side { margin: 0 0 2px; font-size: 12px; color: #555; }
#js-errors { display: none; color: #a00; background: #fee; padding: 8px; white-space: pre-wrap; }
#render-status { color: #888; font-size: 12px; }
tr.sentence td { color: #333; font-size: 14px; padding: 2px 0 8px; max-width: 1000px; }
td.expect { color: #777; font-size: 12px; }
span.failed, td.expect.failed { color: #b2182b; font-weight: 600; } span.holds { color: #1a7f37; }
td.verdict { font-weight: 600; }
p.figure-caption { color: #555; font-size: 13px; margin: 2px 0 0; }
"""


def _escape(v) -> str:
    """Any value as HTML text, quotes included: nothing read from a file is ever markup."""
    return html.escape(v if isinstance(v, str) else str(v), quote=True)


def _num(v, spec: str) -> str:
    try:
        return format(v, spec)
    except (TypeError, ValueError):
        return str(v)


def _is_scalar(v) -> bool:
    return not isinstance(v, (dict, list, tuple))


def _inline(v) -> str:
    if isinstance(v, dict):
        items = [f"{k}: {_inline(x)}" for k, x in v.items()]
        return " · ".join(items)
    if isinstance(v, (list, tuple)):
        text = json.dumps(v, default=str)
        return text if len(text) <= 120 else text[:117] + "..."
    return fmt_number(v)


def report_headlines(results_dir: str | os.PathLike, tables: dict[str, pd.DataFrame] | None = None,
                     summary: dict | None = None) -> dict:
    """Returns {probe: Headline} of a results directory: recomputed from its tables (so they carry
    per-row values for paired tests), else as summary.json stored them."""
    tables = load_results(results_dir) if tables is None else tables
    summary = read_summary(results_dir) if summary is None else summary
    try:
        stored = headlines_from_summary(summary)
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise WorkbenchError(f"{Path(results_dir) / 'summary.json'}: its stored headlines are malformed "
                             f"({type(err).__name__}: {str(err)[:80]})") from None
    return {**stored, **headlines_from_tables(tables)}


def headline_html(headlines: dict, control: dict | None = None, skipped: dict | None = None) -> str:
    """Returns the headline table (`workbench.analysis.headlines.headline_table`) as HTML: per probe its sentence,
    then each number with n and its 95% interval; a probe that did not apply says why.

    With `control` ({probe: Headline} of a control results directory), each number gets the
    control's value beside it and the paired difference (this − control, bootstrap over shared
    rows) with McNemar's p where the rows are 0/1 and one per row.
    """
    rows = headline_table(headlines, skipped)
    if not rows:
        return "<p class='caption'>No headline numbers (summary.json absent or empty).</p>"
    e = _escape  # every field: a results directory is untrusted, and its numbers may be strings
    if control is None:
        head = "<tr><th>quantity</th><th>value</th><th>95% interval</th><th>n</th><th>expected</th></tr>"
        cols = 5
    else:
        head = ("<tr><th>quantity</th><th>this specimen</th><th>n</th><th>control</th><th>n</th>"
                "<th>this − control [95% CI]</th><th>McNemar p</th><th>expected</th></tr>")
        cols = 8
        paired = {(r["probe"], r["key"]): r for r in compare_headlines(control, headlines)}
    body = [head]
    for probe, h, reason in rows:
        body.append(f"<tr class='group'><th colspan='{cols}'>{e(probe)}</th></tr>")
        if h is None:
            body.append(f"<tr class='sentence'><td colspan='{cols}'>Not applicable: {e(reason)}</td></tr>")
            continue
        body.append(f"<tr class='sentence'><td colspan='{cols}'>{e(h.sentence)}</td></tr>")
        if control is not None and probe in control:
            body.append(f"<tr class='sentence'><td colspan='{cols}'><i>control:</i> {e(control[probe].sentence)}</td></tr>")
        for n in h.numbers:
            if control is None:
                low_high = "" if n.low is None else f"[{fmt(n.low, n.kind)}, {fmt(n.high, n.kind)}]"
                body.append(f"<tr><td>{e(n.label)}</td><td class='num'>{e(fmt(n.value, n.kind))}</td>"
                            f"<td class='num'>{e(low_high)}</td><td class='num'>{e('' if n.n is None else n.n)}</td>"
                            f"{_expect_cell(n)}</tr>")
            else:
                r = paired.get((probe, n.key), {})
                p = "" if r.get("p_mcnemar") is None else _num(r["p_mcnemar"], ".2g")
                body.append(f"<tr><td>{e(n.label)}</td><td class='num'>{e(n.text())}</td>"
                            f"<td class='num'>{e('' if n.n is None else n.n)}</td>"
                            f"<td class='num'>{e(r.get('a', '–'))}</td>"
                            f"<td class='num'>{e('' if r.get('n_a') is None else r['n_a'])}</td>"
                            f"<td class='num'>{e(r.get('diff', '–'))}</td><td class='num'>{e(p)}</td>"
                            f"{_expect_cell(n)}</tr>")
        if reason is not None:
            body.append(f"<tr class='sentence'><td colspan='{cols}'>Not applicable: {e(reason)}</td></tr>")
    return f"<table id='headline'>{''.join(body)}</table>"


def _expect_cell(n) -> str:
    """The "expected" cell: the prediction, marked FAILED or holds where the probe judged it against its rule."""
    mark = {True: "<span class='holds'>holds</span> ", False: "<span class='failed'>FAILED</span> "}.get(n.holds, "")
    return f"<td class='expect{' failed' if n.holds is False else ''}'>{mark}{_escape(n.expect)}</td>"


def failed_note(headlines: dict) -> str:
    """One line under the headline table: how many predictions were judged and which failed."""
    judged, failed = judged_predictions(headlines), failed_predictions(headlines)
    if not judged:
        return ""
    items = "".join(f"<li><b>{_escape(p)}</b>: {_escape(n.label)} = {_escape(n.text())}, predicted "
                    f"{_escape(n.expect)}</li>" for p, n in failed)
    return (f"<p class='caption' id='failed-predictions'>Predictions judged against their rule: {len(judged)}; "
            f"failed: {len(failed)}.</p>" + (f"<ul class='failed'>{items}</ul>" if items else ""))


def read_claims(results_dir: str | os.PathLike) -> list[dict]:
    """Returns the claims ledger rows of `results_dir/claims.json` ([] when absent).

    The file is a list of {claim, paper, ours, verdict, why} objects (`workbench claims` writes it).

    Raises:
        WorkbenchError: the file is not valid JSON or not such a list.
    """
    path = Path(results_dir) / CLAIMS
    if not path.is_file():
        return []
    rows = json_value(path)
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise WorkbenchError(f"{path}: expected a list of objects with keys {', '.join(CLAIM_KEYS)}")
    for i, r in enumerate(rows):
        missing = [k for k in CLAIM_KEYS if k not in r]
        if missing:
            raise WorkbenchError(f"{path}: row {i} lacks '{missing[0]}'; each row needs {', '.join(CLAIM_KEYS)}")
    return rows


def claims_table(rows: list[dict]) -> str:
    """Returns the ledger rows as an HTML table: claim, paper, ours, verdict, why."""
    e = html.escape
    head = "".join(f"<th>{k}</th>" for k in CLAIM_KEYS)
    cls = {k: " class='verdict'" if k == "verdict" else "" for k in CLAIM_KEYS}
    body = "".join("<tr>" + "".join(f"<td{cls[k]}>{e(_text(r[k]))}</td>" for k in CLAIM_KEYS) + "</tr>"
                   for r in rows)
    return f"<table id='claims'><tr>{head}</tr>{body}</table>"


def _text(v) -> str:
    return v if isinstance(v, str) else _inline(v)


def paired_depth_table(results_dir: Path, control: Path) -> str:
    """Returns the per-depth paired final-answer test (McNemar) of this specimen against the control, or ""."""
    if not (Path(results_dir) / "depth_matrix.parquet").is_file() or not (Path(control) / "depth_matrix.parquet").is_file():
        return ""
    try:
        table = compare_results(control, results_dir)
    except WorkbenchError as err:
        return f"<p class='caption'>No paired per-depth test: {html.escape(str(err))}.</p>"
    table = table.rename(columns={"a_correct": "control correct", "b_correct": "this correct",
                                  "helped": "this only", "hurt": "control only"})
    table["depth"] = table["depth"].astype(object).where(table["depth"].notna(), "all")
    return ("<p class='caption'>Final answers (t = d) paired row by row; exact McNemar p on the discordant rows."
            "</p>" + frame_table(table, "paired-depths"))


def _cell(v) -> str:
    return html.escape(_inline(v))


def _flatten(d: dict, prefix: str = "") -> list[tuple[str, object]]:
    out = []
    for k, v in d.items():
        key = f"{prefix}{k}"
        out += _flatten(v, key + ".") if isinstance(v, dict) else [(key, v)]
    return out


def probe_runs_table(summary: dict) -> str:
    """Returns HTML for which rows (and options) each probe ran on, from summary["probe_runs"]."""
    runs = summary.get("probe_runs") or {}
    if not runs:
        return ""
    body = "".join(
        f"<tr><td>{html.escape(name)}</td><td class='num'>{_cell(r.get('rows', {}).get('n', '–'))}</td>"
        f"<td class='hash'>{html.escape(str(r.get('rows', {}).get('rows_sha256', '–')))}</td>"
        f"<td><code>{html.escape(json.dumps(r.get('options', {}), default=str))}</code></td></tr>"
        for name, r in runs.items())
    return ("<table id='probe-runs'><tr><th>probe</th><th>rows</th><th>rows_sha256 (the rows it read)</th>"
            f"<th>options</th></tr>{body}</table>")


def provenance_table(summary: dict) -> str:
    """Returns HTML for what was probed: checkpoint, provenance hash, model, manifests and their digests."""
    items = [(f"checkpoint.{k}", v) for k, v in (summary.get("checkpoint") or {}).items()]
    items += [(f"model.{k}", v) for k, v in _flatten(summary.get("model") or {})]
    items += [(k, summary[k]) for k in ("battery", "seed", "wall_s", "created_by") if k in summary]
    kv = "".join(f"<tr><td>{html.escape(k)}</td><td class='hash'>{_cell(v)}</td></tr>" for k, v in items)
    out = f"<table id='provenance'>{kv}</table>" if kv else "<p class='caption'>No provenance recorded.</p>"
    manifests = summary.get("manifests") or {}
    if manifests:
        rows = "".join(f"<tr><td><code>{html.escape(str(p))}</code></td>"
                       f"<td class='hash'>{html.escape(str(m.get('rows_sha256', '–')))}</td>"
                       f"<td class='hash'>{html.escape(str(m.get('row_ids_sha256', '–')))}</td></tr>"
                       for p, m in manifests.items())
        out += ("<table id='manifests'><tr><th>row manifest</th><th>rows_sha256</th><th>row_ids_sha256</th></tr>"
                f"{rows}</table>")
    return out + probe_runs_table(summary)


def frame_table(df: pd.DataFrame, table_id: str) -> str:
    """Returns a small DataFrame as an HTML table in the report's style."""
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in df.columns)
    rows = "".join("<tr>" + "".join(f"<td class='num'>{_cell(v)}</td>" for v in r) + "</tr>"
                   for r in df.itertuples(index=False))
    return f"<table id='{table_id}'><tr>{head}</tr>{rows}</table>"


def figure_html(fig, div_id: str) -> str:
    """Returns one figure as a div and its drawing script, without plotly.js."""
    height = fig.layout.height or 450
    return fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id, default_height=f"{height}px",
                       config={"displaylogo": False, "responsive": True})


def _block_selection_figure(results_dir: Path):
    """The block-selection figure drawn from block_selection.json (the record itself, no model code)."""
    path = results_dir / BLOCK_SELECTION
    if not path.is_file():
        return None
    try:
        return angular_distance_figure(json.loads(path.read_bytes().decode("utf-8")))
    except (UnicodeDecodeError, json.JSONDecodeError, TypeError, KeyError, AttributeError, ValueError) as err:
        raise WorkbenchError(f"{path}: not a block selection written by `workbench select-block` ({err})") from None


def _sweep_parts(results_dir: Path) -> list[str] | None:
    """The window sweep's figure, its table and the recommendation line, drawn from its table (no model code)."""
    path = under_old_name(results_dir, SWEEP_TABLE, OLD_SWEEP_TABLE)
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_bytes().decode("utf-8"))
        fig, frame = sweep_figure(record), sweep_frame(record)
        m = record.get("margin") or {}
    except (UnicodeDecodeError, json.JSONDecodeError, TypeError, KeyError, AttributeError, ValueError) as err:
        raise WorkbenchError(f"{path}: not a window sweep written by `workbench select-block` ({err})") from None
    verdict = (f"Recommended: {record.get('recommended')} ({'separated' if m.get('separated') else 'not separated'}"
               f" from the runner-up: {m.get('why', 'one candidate')}); budget: {record.get('budget')}.")
    return [figure_html(fig, "fig-window_sweep") + _caption("window_sweep", SWEEP_CAPTION),
            frame_table(frame, "window_sweep-table") + _caption("window_sweep-table", verdict)]


def section_heads(results: Iterable[str] = ()) -> dict[str, tuple[str, str]]:
    """Returns {name: (heading, the sentence under it)} of every section the report can show, in its order: the
    block selection and its window sweep, then each probe's (`Section.title`, `.about`) in probe order
    (`workbench.defaults.PROBE_ORDER`), then the table section of each probe of `results` that declares none."""
    return {"block_selection": BLOCK_SELECTION_SECTION, "window_sweep": SWEEP_SECTION,
            **{name: (s.title, s.about) for name, s in sections(results).items()}}



def _beside(mine: str, theirs: str, control: str) -> str:
    """The specimen's figure and the control's same figure side by side, each labelled."""
    return (f"<div class='pair'><div><p class='side'>this specimen</p>{mine}</div>"
            f"<div><p class='side'>control: <code>{html.escape(control)}</code></p>{theirs}</div></div>")


def _sections(results_dir: Path, tables: dict[str, pd.DataFrame], control: Path | None = None,
              control_tables: dict[str, pd.DataFrame] | None = None,
              progress: bool = False, results: Iterable[str] = ()) -> list[tuple[str, list[str]]]:
    """Returns (result name, [html fragments]) for every result present, in `section_heads()` order; each
    figure is followed by its caption (`Figure.caption`), a probe shown as its table by `Section.table_caption`.
    With a control, every figure the control's tables also draw is shown beside the specimen's, on the same builder."""
    figures: dict[str, list[str]] = {}
    caption = captions(results)
    theirs = {key: fig for _, key, fig in build_all(control_tables, results=results)} if control_tables else {}
    for result, key, fig in tqdm(build_all(tables, results=results), desc="report figures", unit="figure",
                                 disable=not progress):
        mine = figure_html(fig, f"fig-{key}")
        if key in theirs:
            mine = _beside(mine, figure_html(theirs[key], f"fig-{key}-control"), str(control))
        figures.setdefault(result, []).append(mine + _caption(key, caption[key]))
    selection = _block_selection_figure(results_dir)
    if selection is not None:
        figures["block_selection"] = [figure_html(selection, "fig-block_selection")
                                      + _caption("block_selection", BLOCK_SELECTION_CAPTION)]
    sweep = _sweep_parts(results_dir)
    if sweep is not None:
        figures["window_sweep"] = sweep
    for name, s in sections().items():
        if s.table_caption is not None and name in tables:
            figures[name] = [frame_table(tables[name], f"{name}-table") + _caption(name, s.table_caption)]
    return [(name, figures[name]) for name in section_heads(results) if name in figures]


def _caption(key: str, text: str) -> str:
    return f"<p class='caption figure-caption' data-figure='{html.escape(key)}'>{html.escape(text)}</p>"


def render_report(results_dir: str | os.PathLike, title: str | None = None,
                  control: str | os.PathLike | None = None, shown_as: str | os.PathLike | None = None,
                  progress: bool = False) -> str:
    """Returns the report's HTML text for `results_dir` (only the results present are rendered).

    Args:
        control: another results directory (the untrained control, or another specimen) shown
            beside this one in the headline table, with paired tests over the rows both read.
        shown_as: the path the page names (default `results_dir`): a report rendered in a battery's
            staging directory names the results directory it is about to become.
    """
    results_dir = Path(results_dir)
    tables, summary = load_results(results_dir), read_summary(results_dir)
    headlines = report_headlines(results_dir, tables, summary)
    skipped = {n: p.get("reason", "") for n, p in (summary.get("probes") or {}).items()
               if isinstance(p, dict) and p.get("status") == "not_applicable"}
    control_headlines = report_headlines(control) if control is not None else None
    claims = read_claims(results_dir)
    control_tables = load_results(control) if control is not None else None
    ran = probes_run(results_dir)
    known, sections = section_heads(ran), _sections(results_dir, tables, control and Path(control), control_tables,
                                                    progress, ran)
    shown = {n for n, _ in sections} | {part for n, _ in sections for part in part_names(n)}
    extra = [n for n in tables if n not in shown and n.split("__")[0] not in headlines]
    # the window sweep is an optional part of a block selection (`select-block --window-sweep`): never listed as missing
    absent = [known[n][0] for n in known if n not in {s for s, _ in sections} and n != "window_sweep"]
    shown_as = Path(shown_as) if shown_as is not None else results_dir
    title = title or report_title(summary, shown_as)
    nav = "".join(f"<a href='#{n}'>{html.escape(known[n][0])}</a>" for n, _ in sections)
    lead = (f"Results in <code>{html.escape(str(shown_as))}</code>"
            + (f", beside the control <code>{html.escape(str(control))}</code>" if control is not None else "")
            + ". Intervals are 95%: Wilson for proportions over rows, a row bootstrap for entries that come "
              "several to a row, a paired bootstrap for differences. "
            + "".join(f"Note: {html.escape(n)}. " for n in battery_notes(summary)))
    body = [f"<h1>{html.escape(title)}</h1>",
            f"<p class='lead'>{lead}<span id='render-status'>figures not drawn yet</span></p>",
            "<pre id='js-errors'></pre>", f"<nav>{nav}</nav>",
            "<h2 id='headline-numbers'>Headline numbers</h2>", headline_html(headlines, control_headlines, skipped),
            failed_note(headlines)]
    if control is not None:
        body += ["<h2 id='paired-tests'>Paired tests against the control</h2>",
                 paired_depth_table(results_dir, Path(control))]
    if claims:
        body += ["<h2 id='claims-ledger'>Claims ledger</h2><p class='caption'>The papers' claims against this "
                 "specimen's readings, with their verdicts.</p>", claims_table(claims)]
    for name, fragments in sections:
        head, caption = known[name]
        body.append(f"<h2 id='{name}'>{html.escape(head)}</h2><p class='caption'>{html.escape(caption)}</p>")
        body += [f"<div class='figure'>{f}</div>" for f in fragments]
    if extra:
        body.append("<h2 id='other-tables'>Other tables</h2><p class='caption'>No figure registered for: "
                    + ", ".join(f"<code>{html.escape(n)}</code> ({len(tables[n])} rows)" for n in extra) + "</p>")
    if absent:
        body.append(f"<p class='caption' id='absent'>Not in this directory: {html.escape(', '.join(absent))}.</p>")
    # provenance last and folded: what a reader checks after the findings, not before them
    body += ["<h2 id='what-was-probed'>What was probed</h2><details><summary>checkpoint, model, manifests and "
             "their digests</summary>", provenance_table(summary), "</details>"]
    return ("<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'><meta name='generator' content='workbench report'>"
            f"<title>{html.escape(title)}</title><style>{CSS}</style>{ERROR_HOOK}"
            f"<script type='text/javascript'>{get_plotlyjs()}</script></head>"
            f"<body><main>{''.join(body)}</main>{RENDER_CHECK}</body></html>\n")


def report_title(summary: dict, shown_as: Path) -> str:
    """"<checkpoint> on the <battery> battery" from summary.json, else the results folder's name."""
    checkpoint = summary.get("checkpoint") or {}
    name = Path(str(checkpoint.get("path", ""))).name if checkpoint.get("path") else checkpoint.get("spec")
    if checkpoint.get("kind") == "untrained" and name:
        name = f"untrained control of {name}"
    battery = Path(str(summary.get("battery", ""))).stem if summary.get("battery") else None
    if not name:
        return f"Workbench report: {shown_as.resolve().name}"
    return f"{name} on the {battery} battery" if battery else f"Workbench report: {name}"


def write_report(results_dir: str | os.PathLike, out: str | os.PathLike | None = None,
                 control: str | os.PathLike | None = None, shown_as: str | os.PathLike | None = None,
                 before_write=None, progress: bool = False) -> Path:
    """Writes the offline HTML report of `results_dir` and returns its path.

    Args:
        results_dir: a directory of probe results (`<probe>.parquet`, parts, `summary.json`).
        out: the HTML file to write; default `results_dir/report.html`.
        control: a control results directory shown beside it (see `render_report`).
        shown_as: the path the page names (see `render_report`).
        before_write: called just before the file is written (the output guard's re-check, `Guard.recheck`).
    """
    out = Path(out) if out is not None else Path(results_dir) / REPORT
    text = render_report(results_dir, control=control, shown_as=shown_as, progress=progress)
    if before_write is not None:
        before_write()
    out.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(out, text.encode("utf-8"))
    return out
