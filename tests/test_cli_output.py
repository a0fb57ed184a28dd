"""One output contract for every command (workbench.commands.output, docs/cli.md "What a command prints").

--json: stdout is one JSON object, its "wrote" the paths written; --quiet: stdout is those paths, one a line,
and stderr is empty; on a pipe no progress bar reaches stderr, on a terminal one does. The commands run
in-process (capsys stands in for the pipe: its streams are not terminals, and tqdm and rich ask the stream
itself); one case runs a real process on a pseudo-terminal, where the bar must appear.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import struct
import subprocess
import sys
import termios
import threading
from pathlib import Path

import pytest
import tomli_w
import typer

from tests.test_cli_errors import invoke
from tests.training.conftest import TINY_RECIPE, merge
from workbench import cli
from workbench.commands.output import JSON, QUIET

ROOT = Path(__file__).resolve().parents[1]
BATTERY_A = ROOT / "training" / "keepers" / "smollm2-chase" / "battery"
BATTERY_B = ROOT / "training" / "keepers" / "smollm2-chase-anneal" / "battery"
SMALL_RESULTS = ROOT / "training" / "halting" / "keeper-oracle" / "exit_rules"   # 4 tables: a cheap report
BAR_MARKS = ("\r", "█", "it/s", "s/it")   # what a tqdm or rich bar leaves in a stream


def test_every_command_takes_the_shared_quiet_and_json():
    command = typer.main.get_command(cli.app)
    names = [c.name for c in cli.app.registered_commands]
    assert len(names) >= 11
    for name in names:
        options = {p.name: p for p in command.commands[name].params}
        assert "--quiet" in options["quiet"].opts and "-q" in options["quiet"].opts, name
        assert options["as_json"].opts == ["--json"], name
        # the shared options, not a copy: the same help on every command
        assert options["quiet"].help == QUIET.help and options["as_json"].help == JSON.help, name


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """What the cheap cases read: a 2-row-per-depth chase manifest for tiny-llama, a short corpus, a tiny recipe."""
    from workbench.models import load_tokenizer
    from workbench.tasks import build_rows
    from workbench.tasks.manifest import write_manifest

    root = tmp_path_factory.mktemp("output_inputs")
    write_manifest(build_rows("chase", [1, 2], 2, 5, alphabet=4, tokenizer=load_tokenizer("tiny-llama")),
                   root / "rows.jsonl")
    (root / "corpus.txt").write_text("\n".join(f"Text {i}: the rule maps each letter to the next one." for i in range(6)))
    recipe = merge(TINY_RECIPE, {"stages": [{"name": "a", "depths": [1], "steps": 1}], "eval": {"per_depth": 2}})
    (root / "recipe.toml").write_text(tomli_w.dumps(recipe))
    return root


CASES = {  # command -> its arguments, given the inputs and a fresh output folder
    "claims": lambda i, d: ["claims", "--out", d / "ledger"],
    "compare": lambda i, d: ["compare", BATTERY_A, BATTERY_B, "--out", d / "cmp"],
    "report": lambda i, d: ["report", SMALL_RESULTS, "--out", d / "report.html"],
    "figures": lambda i, d: ["figures", "--results", SMALL_RESULTS, "--format", "html", "--out", d / "figs"],
    "rows": lambda i, d: ["rows", "--task", "state", "--depths", "2-3", "--per-depth", "2", "--seed", "1",
                          "--out", d / "r.jsonl"],
    "identity": lambda i, d: ["identity", "--model", "tiny-llama", "--block", "1:3", "--loops", "2"],
    "probe": lambda i, d: ["probe", "--checkpoint", "untrained:tiny-llama:2:4", "--rows", i / "rows.jsonl",
                           "--only", "depth_matrix", "--out", d / "res"],
    "select-block": lambda i, d: ["select-block", "--model", "tiny-llama", "--corpus", i / "corpus.txt",
                                  "--window", "2", "--out", d / "sel"],
    "train": lambda i, d: ["train", i / "recipe.toml", "--out", d / "run"],
    "generate": lambda i, d: ["generate", "tiny-llama", "--block", "2:4", "-p", "Hello", "--loops", "1,2",
                              "--max-new-tokens", "3"],
}
WITH_BARS = ("probe", "select-block", "train")   # the cases whose library calls draw bars on a terminal


@pytest.mark.parametrize("name", CASES)
def test_json_is_one_object_and_quiet_prints_only_its_paths(capsys, monkeypatch, tmp_path, inputs, name):
    code, out, err = invoke(capsys, monkeypatch, *CASES[name](inputs, tmp_path / "json"), "--json")
    assert code == 0, err[-2000:]
    record = json.loads(out)   # fails on anything beside the one object
    assert isinstance(record, dict) and isinstance(record["wrote"], list)
    assert all(Path(p).exists() for p in record["wrote"])
    assert not any(mark in err for mark in BAR_MARKS), err[-500:]
    if name == "identity":   # what a script reads from identity: the eight fresh retrofits, every one exact
        assert record["kind"] == "fresh retrofit" and len(record["rows"]) == 8 and record["max_abs_diff"] == 0.0

    code, out, err = invoke(capsys, monkeypatch, *CASES[name](inputs, tmp_path / "quiet"), "--quiet")
    assert code == 0 and err == "", err[-2000:]
    assert out.splitlines() == [p.replace(str(tmp_path / "json"), str(tmp_path / "quiet")) for p in record["wrote"]]

    if name in WITH_BARS:   # the person's text, and still no bar on a stream that is not a terminal
        code, out, err = invoke(capsys, monkeypatch, *CASES[name](inputs, tmp_path / "plain"))
        assert code == 0 and out.strip(), err[-2000:]
        assert not any(mark in err for mark in BAR_MARKS), err[-500:]


def test_launch_passes_quiet_and_json_to_the_main_rank(capsys, monkeypatch, tmp_path, inputs):
    from workbench.commands import launch

    seen = {}

    def run(cmd, env):
        seen["cmd"] = cmd
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(launch.subprocess, "run", run)
    code, out, err = invoke(capsys, monkeypatch, "launch", inputs / "recipe.toml", "--preset", "ddp", "--cpu",
                            "--processes", "1", "--out", tmp_path / "run", "--quiet", "--json")
    assert code == 0, err
    assert seen["cmd"][-2:] == ["--quiet", "--json"] and out == ""


def test_a_rank_other_than_the_main_one_prints_nothing(capsys, monkeypatch, tmp_path, inputs):
    monkeypatch.setenv("RANK", "1")
    code, out, err = invoke(capsys, monkeypatch, "train", inputs / "recipe.toml", "--out", tmp_path / "run", "--json")
    assert code == 0 and out == "", err[-2000:]


def start_on_a_terminal(args, cwd: Path) -> tuple[subprocess.Popen, bytearray, threading.Thread]:
    """`workbench ARGS` with stderr on a pseudo-terminal; returns the process, what the terminal has shown so far
    (filled by a thread) and that thread, which ends once the process has closed the terminal."""
    leader, follower = pty.openpty()
    # a new pseudo-terminal is 0 columns wide, and tqdm draws a 0-column bar there: give it a person's width
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "workbench", *map(str, args)], cwd=cwd, stdout=subprocess.DEVNULL,
                            stderr=follower)
    os.close(follower)
    seen = bytearray()

    def drain():
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:   # EIO: the process ended and the terminal closed
                chunk = b""
            if not chunk:
                os.close(leader)
                return
            seen.extend(chunk)

    thread = threading.Thread(target=drain, daemon=True)
    thread.start()
    return proc, seen, thread


@pytest.mark.slow   # a fresh workbench process on a pseudo-terminal (the in-process cases above are fast)
def test_a_bar_on_a_terminal(tmp_path, inputs):
    """A real process on a pseudo-terminal draws the bar. The same command with stderr not a terminal draws none:
    test_json_is_one_object_and_quiet_prints_only_its_paths[select-block] runs it plain, in-process (a real pipe
    here cost a second fresh process, 14 s, for the same isatty() answer)."""
    args = ["select-block", "--model", "tiny-llama", "--corpus", inputs / "corpus.txt", "--window", "2", "--out", "sel"]
    (tmp_path / "tty").mkdir()
    proc, seen, thread = start_on_a_terminal(args, tmp_path / "tty")
    assert proc.wait(timeout=600) == 0
    thread.join(timeout=60)
    assert b"angular distance" in seen and b"\r" in seen, bytes(seen[-500:])
