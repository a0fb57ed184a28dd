"""A results directory → one self-contained HTML report that works offline.

plotly.js is embedded once, in one `<script>` tag; each figure is a div plus a small script
that draws it. The page records any JavaScript error in `#js-errors` and, once every figure
is drawn, writes the count of drawn figures into `#render-status`, so a headless browser can
check the page without a debugger.
"""

from __future__ import annotations

import html
import json
import os
from pathlib import Path

import pandas as pd

from workbench.errors import WorkbenchError

SUMMARY = "summary.json"
REPORT = "report.html"
BLOCK_SELECTION = "block_selection.json"

SECTIONS = {
    "block_selection": ("Block selection", "Angular distance between adjacent layers, the Kneedle knees and the "
                                           "damage of each ablated window: where the loop was cut."),
    "identity": ("Loop-1 identity", "max |Δlogit| at loop 1 against a plain forward: 0.0 exactly in fp32 for the "
                                    "checkpoint against its own weights and for fresh retrofits; against the "
                                    "untouched base it measures how much training changed loop 1."),
    "logit_lens": ("Per-loop logit lens", "Which chain symbol each loop's readout holds, through the Coda and the "
                                          "raw and tuned lenses."),
    "depth_matrix": ("Depth × loop accuracy and the frontier", "Active-label accuracy at every loop t ≤ d; the "
                                                               "diagonal is the final answer."),
    "overshoot": ("Overshoot", "Rows forced past their depth: iterate the rule, park on the answer, or neither."),
    "splice": ("Counterfactual splice", "Row B's state spliced into row A at loop k0, classified j loops later."),
    "heads": ("Head specialisation", "Attention mass from the read position onto the table line of the current "
                                     "symbol, per loop, layer and head."),
    "linear_probe": ("Linear probes", "Decodability of x_{t−1}, x_t, x_{t+1} from the loop state against a "
                                      "label-permutation null."),
    "drift": ("Subspace drift", "How far each loop's state subspace moves, and where the drift concentrates."),
    "halting": ("Halting", "Accuracy against compute for the halting head and its baselines."),
    "gradient_audit": ("Gradient audit", "Gradient reaching each parameter group per loop, checked against "
                                         "finite differences."),
    "latency": ("Latency", "Measured cost ratios against the ratios the layer count predicts."),
}

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
#js-errors { display: none; color: #a00; background: #fee; padding: 8px; white-space: pre-wrap; }
#render-status { color: #888; font-size: 12px; }
"""


def load_results(results_dir: str | os.PathLike) -> dict[str, pd.DataFrame]:
    """Returns {file stem: DataFrame} for every `*.parquet` in `results_dir` (e.g. "logit_lens__top")."""
    path = Path(results_dir)
    if not path.is_dir():
        raise WorkbenchError(f"results directory '{path}' does not exist")
    return {p.stem: pd.read_parquet(p) for p in sorted(path.glob("*.parquet"))}


def read_summary(results_dir: str | os.PathLike) -> dict:
    """Returns the parsed summary.json of `results_dir`, or {} when there is none."""
    path = Path(results_dir) / SUMMARY
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise WorkbenchError(f"{path}: not valid JSON ({err.msg} at line {err.lineno})") from None


INLINE_MAX = 14  # a dict of at most this many scalars is shown on one line


def _is_scalar(v) -> bool:
    return not isinstance(v, (dict, list, tuple))


def _inline(v) -> str:
    if isinstance(v, dict):
        items = [f"{k}: {_inline(x)}" for k, x in v.items()]
        return " · ".join(items)
    if isinstance(v, (list, tuple)):
        text = json.dumps(v, default=str)
        return text if len(text) <= 120 else text[:117] + "..."
    from workbench.plots.base import fmt_number

    return fmt_number(v)


def headline_rows(numbers, prefix: str = "") -> list[tuple[str, str]]:
    """Returns (quantity, text) rows for one probe's headline numbers, scalars first.

    A dict of scalars (e.g. accuracy per depth) stays on one row; deeper dicts are unfolded.
    """
    if not isinstance(numbers, dict):
        return [(prefix or "value", _inline(numbers))]
    scalars, nested = [], []
    for k, v in numbers.items():
        key = f"{prefix}{k}"
        if _is_scalar(v) or isinstance(v, (list, tuple)):
            scalars.append((key, _inline(v)))
        elif all(_is_scalar(x) for x in v.values()) and len(v) <= INLINE_MAX:
            nested.append((key, _inline(v)))
        else:
            nested += headline_rows(v, key + ".")
    return scalars + nested


def headline_table(summary: dict) -> str:
    """Returns the HTML table of summary["probes"]: one group of rows per probe."""
    probes = summary.get("probes") or {}
    if not probes:
        return "<p class='caption'>No headline numbers (summary.json absent or empty).</p>"
    body = []
    for probe, numbers in probes.items():
        body.append(f"<tr class='group'><th colspan='2'>{html.escape(probe)}</th></tr>")
        body += [f"<tr><td>{html.escape(k)}</td><td class='num'>{html.escape(v)}</td></tr>"
                 for k, v in headline_rows(numbers)]
    return f"<div class='scroll'><table id='headline'>{''.join(body)}</table></div>"


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
    path = results_dir / BLOCK_SELECTION
    if not path.is_file():
        return None
    from dataclasses import fields

    from workbench.selection import BlockSelection

    try:
        d = json.loads(path.read_text())  # the command adds keys of its own (hashes, timing): keep the fields
        kept = {f.name: d[f.name] for f in fields(BlockSelection) if f.name in d}
        return BlockSelection(**{**kept, "recommended": tuple(d["recommended"])}).figure()
    except (json.JSONDecodeError, TypeError, KeyError) as err:
        raise WorkbenchError(f"{path}: not a block selection written by `workbench select-block` ({err})") from None


def _sections(results_dir: Path, tables: dict[str, pd.DataFrame]) -> list[tuple[str, list[str]]]:
    """Returns (result name, [html fragments]) for every result present, in SECTIONS order."""
    from workbench.plots.registry import build_all

    figures: dict[str, list[str]] = {}
    for result, key, fig in build_all(tables):
        figures.setdefault(result, []).append(figure_html(fig, f"fig-{key}"))
    selection = _block_selection_figure(results_dir)
    if selection is not None:
        figures["block_selection"] = [figure_html(selection, "fig-block_selection")]
    if "identity" in tables:
        figures["identity"] = [frame_table(tables["identity"], "identity-table")]
    return [(name, figures[name]) for name in SECTIONS if name in figures]


def render_report(results_dir: str | os.PathLike, title: str | None = None) -> str:
    """Returns the report's HTML text for `results_dir` (only the results present are rendered)."""
    from plotly.offline import get_plotlyjs

    from workbench.plots.registry import part_names

    results_dir = Path(results_dir)
    tables, summary = load_results(results_dir), read_summary(results_dir)
    sections = _sections(results_dir, tables)
    shown = {n for n, _ in sections} | {part for n, _ in sections for part in part_names(n)}
    extra = [n for n in tables if n not in shown]
    absent = [SECTIONS[n][0] for n in SECTIONS if n not in {s for s, _ in sections}]
    title = title or f"Workbench report: {results_dir.resolve().name}"
    nav = "".join(f"<a href='#{n}'>{html.escape(SECTIONS[n][0])}</a>" for n, _ in sections)
    body = [f"<h1>{html.escape(title)}</h1>",
            f"<p class='lead'>Results in <code>{html.escape(str(results_dir))}</code>. "
            f"<span id='render-status'>figures not drawn yet</span></p>",
            "<pre id='js-errors'></pre>", f"<nav>{nav}</nav>",
            "<h2 id='headline-numbers'>Headline numbers</h2>", headline_table(summary),
            "<h2 id='what-was-probed'>What was probed</h2>", provenance_table(summary)]
    for name, fragments in sections:
        head, caption = SECTIONS[name]
        body.append(f"<h2 id='{name}'>{html.escape(head)}</h2><p class='caption'>{html.escape(caption)}</p>")
        body += [f"<div class='figure'>{f}</div>" for f in fragments]
    if extra:
        body.append("<h2 id='other-tables'>Other tables</h2><p class='caption'>No figure registered for: "
                    + ", ".join(f"<code>{html.escape(n)}</code> ({len(tables[n])} rows)" for n in extra) + "</p>")
    if absent:
        body.append(f"<p class='caption' id='absent'>Not in this directory: {html.escape(', '.join(absent))}.</p>")
    return ("<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            f"<title>{html.escape(title)}</title><style>{CSS}</style>{ERROR_HOOK}"
            f"<script type='text/javascript'>{get_plotlyjs()}</script></head>"
            f"<body><main>{''.join(body)}</main>{RENDER_CHECK}</body></html>\n")


def write_report(results_dir: str | os.PathLike, out: str | os.PathLike | None = None) -> Path:
    """Writes the offline HTML report of `results_dir` and returns its path.

    Args:
        results_dir: a directory of probe results (`<probe>.parquet`, parts, `summary.json`).
        out: the HTML file to write; default `results_dir/report.html`.
    """
    from workbench.io import write_bytes_atomic

    out = Path(out) if out is not None else Path(results_dir) / REPORT
    text = render_report(results_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(out, text.encode("utf-8"))
    return out
