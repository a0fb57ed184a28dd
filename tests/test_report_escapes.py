"""A report escapes everything it reads: markup in any string or number field of summary.json, a ledger or a
control is text in the page, never an element, an attribute or a script (issue 29, item 3).

Every leaf of a committed summary.json and of the committed ledger.json is replaced by a payload that
names its field; the pages are parsed with html.parser and no payload tag, attribute or script may be
live. Each payload breaks out of text, of a quoted attribute and of a script at once.
"""

import json
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest

from workbench.analysis.claims import ledger_html
from workbench.errors import WorkbenchError
from workbench.plots.report import render_report

ROOT = Path(__file__).resolve().parents[1]
SPECIMEN = ROOT / "training" / "keepers" / "smollm2-chase-anneal" / "battery"
MARK = "wbx"


def payload(i: int) -> str:
    return f"\"'><{MARK}{i} {MARK}a{i}=1 onload=x>{i}</td><script>{MARK}s{i}</script><img src=x {MARK}b{i}=y>"


def inject(node, counter: list, keys: bool = False):
    """Replaces every string and number leaf (and, with `keys`, every key) with a numbered payload."""
    if isinstance(node, dict):
        out = {}
        for k, v in node.items():
            key = k
            if keys:
                counter[0] += 1
                key = payload(counter[0])
            out[key] = inject(v, counter)
        return out
    if isinstance(node, list):
        return [inject(v, counter) for v in node]
    if isinstance(node, (str, int, float)) and not isinstance(node, bool):
        counter[0] += 1
        return payload(counter[0])
    return node


class Live(HTMLParser):
    """Collects the payload's tags, attributes and script text that the parser sees as live markup."""

    def __init__(self):
        super().__init__()
        self.live, self._script = [], False
        self.text = []

    def handle_starttag(self, tag, attrs):
        if tag.startswith(MARK):
            self.live.append(f"<{tag}>")
        self.live += [f"{tag}@{name}" for name, _ in attrs if name.startswith(MARK) or name == "onload"]
        self._script = tag == "script"

    def handle_endtag(self, tag):
        self._script = False

    def handle_data(self, data):
        if self._script and f"{MARK}s" in data:
            self.live.append(f"script: {data[:40]}")
        self.text.append(data)


def live_markup(page: str) -> tuple[list[str], str]:
    parser = Live()
    parser.feed(page)
    parser.close()
    return parser.live, "".join(parser.text)


@pytest.fixture
def tampered(tmp_path):
    """The specimen's summary.json with every field a payload (no tables: the summary is all there is)."""
    out = tmp_path / "res"
    out.mkdir()
    summary = json.loads((SPECIMEN / "summary.json").read_text())
    counter = [0]
    probes = {payload(900000 + i): inject(p, counter) for i, p in enumerate(summary.pop("probes").values())}
    # a headline's structure stays, its values are payloads: that is where `n` went in unescaped
    bad = {**inject(summary, counter), "probes": probes}
    (out / "summary.json").write_text(json.dumps(bad))
    ledger = json.loads((ROOT / "claims" / "ledger.json").read_text())
    (out / "claims.json").write_text(json.dumps(inject(ledger, counter)))
    return out, counter[0]


def test_no_field_of_summary_or_claims_is_live_in_the_report(tampered):
    out, injected = tampered
    assert injected > 300  # every leaf of a real summary and ledger
    try:
        page = render_report(out, control=out)
    except WorkbenchError as err:  # refusing the file is allowed; a traceback or live markup is not
        assert "\n" not in str(err)
        page = render_report(out)
    live, text = live_markup(page)
    assert live == []
    assert f"<{MARK}" in text  # the payloads are there, as text


def test_numbers_from_the_summary_are_escaped_where_they_are_shown(tmp_path):
    """The headline rows' n (the field that ran script, issue 29), a value and an interval."""
    out = tmp_path / "res"
    out.mkdir()
    summary = json.loads((SPECIMEN / "summary.json").read_text())
    for probe in summary["probes"].values():
        for i, number in enumerate(probe.get("headline", {}).get("numbers", [])):
            number.update(n=payload(i), low=payload(i + 100), high=payload(i + 200), value=payload(i + 300))
    (out / "summary.json").write_text(json.dumps(summary))
    live, text = live_markup(render_report(out))
    assert live == []
    assert f"<{MARK}0 " in text


def test_no_field_of_the_ledger_is_live_in_ledger_html():
    ledger = json.loads((ROOT / "claims" / "ledger.json").read_text())
    counter = [0]
    rows = inject(ledger, counter)
    rows = [{**r, "verdict": r["verdict"]} for r in rows]
    live, text = live_markup(ledger_html(rows))
    assert counter[0] > 100 and live == []
    assert f"<{MARK}1 " in text


def test_a_control_with_markup_is_text_too(tmp_path, tampered):
    out, _ = tampered
    clean = tmp_path / "clean"
    shutil.copytree(SPECIMEN, clean, ignore=shutil.ignore_patterns("*.parquet"))
    try:
        page = render_report(clean, control=out)
    except WorkbenchError as err:
        assert "\n" not in str(err)
        return
    assert live_markup(page)[0] == []
