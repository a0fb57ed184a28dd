"""The README is a tool's front page: short, in its stated order, every link live, and its commands run as written.

The Python example runs verbatim in a fresh interpreter; the CLI tour's lines that take seconds run
as written in an empty directory, and every other line must be one this file knows is slow, so a new
line in the tour is either run here or named here. The CLI lines run in this process, through the entry point's
own `workbench.cli.run` with the line's words as argv: a fresh interpreter adds 9-11 CPU-s of imports a line and
checks nothing more here (a fresh `workbench` process is tests/test_cli.py's, tests/test_texts.py's and the
wheel's).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_cli_errors import invoke

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
SECTIONS = ["Two commands", "Ten lines of Python", "The CLI", "Your own prompts", "Your own model",
            "Results, and how to regenerate them", "Documentation"]
QUICK = ("workbench --help", "workbench identity ", "workbench rows ", "workbench claims")
SLOW = ("workbench select-block ", "workbench probe ", "workbench compare ", "workbench report ",
        "workbench figures ", "workbench train ", "workbench demo ", "workbench launch ")


def block(after: str, lang: str) -> str:
    """The first ```lang block after the heading `after`."""
    start = README.index(f"\n## {after}\n")
    match = re.compile(rf"```{lang}\n(.*?)```", re.S).search(README, start)
    assert match, f"no {lang} block under '{after}'"
    return match.group(1)


def test_the_readme_fits_in_three_screens_in_its_order():
    assert len(README.splitlines()) <= 250
    assert re.findall(r"^## (.*)$", README, re.M) == SECTIONS
    assert README.index("![") < README.index("\n## Two commands")  # what it is: a paragraph and a figure


def test_every_relative_link_in_the_readme_and_docs_resolves():
    pages = [ROOT / "README.md", *ROOT.glob("docs/**/*.md"), ROOT / "benchmarks" / "README.md"]
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if not re.match(r"\w+://", target) and not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert len(pages) >= 10 and broken == []


@pytest.mark.slow   # loads the embedded SmolLM2-135M in a fresh process (9.9 s quiet)
def test_the_python_example_runs_as_written(tmp_path):
    code = block("Ten lines of Python", "python")
    assert 10 <= len([line for line in code.splitlines() if line.strip()]) <= 16
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env,
                         timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    out = res.stdout.splitlines()
    assert out[0] == "torch.Size([1, 4, 1, 3])" and out[1] == "torch.Size([3, 1, 26, 576])"
    assert "row_id" in out[2]  # the logit lens table's header


def tour() -> list[str]:
    lines = [line.split("  #")[0].strip() for line in block("The CLI", "bash").splitlines()]
    return [line for line in lines if line]


def test_every_line_of_the_cli_tour_is_run_here_or_named_slow():
    lines = tour()
    assert len(lines) >= 10
    assert [line for line in lines if not line.startswith(QUICK + SLOW)] == []
    assert sum(line.startswith(QUICK) for line in lines) == len(QUICK)


def run_line(line: str, capsys, monkeypatch) -> str:
    """Runs a README line `workbench ...` as the entry point does (argv split as a shell splits it); its stdout."""
    code, out, err = invoke(capsys, monkeypatch, *shlex.split(line)[1:])
    assert code == 0, f"{line}: {err[-2000:]}"
    return out


@pytest.mark.slow   # the identity line loads the 135M model and runs its 8 fresh retrofits (about 35 s)
@pytest.mark.parametrize("line", [line for line in tour() if line.startswith(QUICK)])
def test_the_quick_cli_lines_run_as_written(line, tmp_path, capsys, monkeypatch):
    argv = shlex.split(line)
    monkeypatch.chdir(tmp_path)
    out = run_line(line, capsys, monkeypatch)
    if argv[1] == "identity":  # the one CLI run of identity on the embedded default (tests/test_cli.py: a tiny one)
        model, block = argv[argv.index("--model") + 1], argv[argv.index("--block") + 1]
        assert f"{model} block {block}, fresh retrofit, loop 1 vs base: max |Δlogit| over 6 prompts = 0.0" in out
        # every fresh retrofit (re-entry x memory x LoRA with B = 0) is a row of the table, each 0.0
        rows = re.findall(r"^\s*(bridge|inject)\s+(True|False)\s+(True|False)\s+(\S+)\s*$", out, re.M)
        assert len(rows) == 8 and len(set(r[:3] for r in rows)) == 8 and {r[3] for r in rows} == {"0.0"}, out
    if argv[1] == "rows":
        written = tmp_path / argv[argv.index("--out") + 1]
        assert written.is_file() and written.with_suffix(".manifest.json").is_file()
        assert len(written.read_text().splitlines()) == 7 * 8
    if argv[1] == "claims":
        assert re.search(r"\d+ reproduced, \d+ not reproduced", out)
        assert out.startswith("papers: 000 = the retrofit paper")  # the codes in [000 Sec. 6.2] explained


CAPITALS = [("France", "Paris"), ("Italy", "Rome"), ("Germany", "Berlin"), ("Spain", "Madrid"), ("Japan", "Tokyo"),
            ("Egypt", "Cairo"), ("Greece", "Athens"), ("Norway", "Oslo")]


@pytest.mark.specimen   # four commands load the keeper (135M): the probe's default battery most of the time
def test_the_own_prompts_lines_run_as_written_and_say_what_the_paragraph_says(tmp_path, capsys, monkeypatch):
    """The lines of "Your own prompts", in order, in an empty directory holding the capitals.jsonl the comment
    describes; the paragraph's reading (' Paris' ranked 0 at loop 1, 82 at loop 4) is what `lens` prints."""
    lines = [line.split("  #")[0].strip() for line in block("Your own prompts", "bash").splitlines() if line.strip()]
    assert [shlex.split(line)[1] for line in lines] == ["lens", "generate", "rows", "probe"]
    (tmp_path / "capitals.jsonl").write_text("".join(
        json.dumps({"prompt": f"The capital of {c} is", "answer": a}) + "\n" for c, a in CAPITALS))
    monkeypatch.chdir(tmp_path)
    outs = [run_line(line, capsys, monkeypatch) for line in lines]
    ranks = {int(m[0]): int(m[1]) for m in re.findall(r"^\s+(\d)\s+'.*?\s(\d+)\s*$", outs[0], re.M)}
    said = re.search(r"' Paris' is ranked (\d+) at loop 1 and (\d+) at loop 4", README.replace("\n", " "))
    assert said and ranks[1] == int(said[1]) and ranks[4] == int(said[2]), (ranks, outs[0])
    assert re.search(r"^\s+1\s+Paris\.", outs[1], re.M) and re.search(r"^\s+4\s", outs[1], re.M), outs[1]
    summary = json.loads((tmp_path / "results" / "capitals" / "summary.json").read_text())
    read = summary["probe_runs"]["logit_lens"]["rows"]
    assert read["n"] == read["depth_not_given"] == 8
    assert summary["probes"]["overshoot"]["status"] == "not_applicable"
    assert summary["probes"]["splice"] == {"status": "not_applicable", "reason": "needs depth, table, start"}
