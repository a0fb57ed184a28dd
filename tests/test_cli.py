"""The CLI end to end, as a user types it (a real subprocess, a temporary directory)."""

import json
import subprocess
import sys

import pytest


def workbench(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "workbench", *args], capture_output=True, text=True, cwd=cwd)


@pytest.mark.slow   # a fresh interpreter; tests/test_imports.py checks --help's imports in one too
def test_help_lists_commands():
    res = workbench("--help")
    assert res.returncode == 0
    for command in ("identity", "demo"):
        assert command in res.stdout


@pytest.mark.slow   # a fresh process (about 16 CPU-s: 11 of them importing torch, transformers, peft and
# transformer_lens); tests/test_cli_output.py runs identity in-process and checks its --json record, and
# tests/test_readme.py runs it on the embedded default as the README types it (the same line as here, on 135M)
def test_identity_on_a_tiny_model_prints_zero():
    res = workbench("identity", "--model", "tiny-qwen2", "--block", "1:4")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().endswith("tiny-qwen2 block 1:4, fresh retrofit, loop 1 vs base: max |Δlogit| over "
                                       "6 prompts = 0.0")
    rows = [line.split() for line in res.stdout.splitlines() if line.split()[:1] in (["bridge"], ["inject"])]
    assert len(rows) == 8 and all(r[-1] == "0.0" for r in rows)
    assert max(len(line) for line in res.stdout.splitlines()) <= 100


@pytest.mark.slow   # a fresh process (6-7 s quiet, 15 s on an AVX2 EPYC): the entry point turns an error raised after the
# model loaded into one line and exit 2; tests/test_cli_errors.py runs the bad blocks and paths in-process through the
# same entry point (workbench.cli.run), a fraction of a second each
def test_bad_input_is_one_line_and_exit_2():
    message = "block 4:2 is invalid for a model with 6 layers"
    res = workbench("identity", "--model", "tiny-llama", "--block", "4:2")
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.slow   # the one `workbench demo` end to end: the 135M model, a training, the demo battery, minutes
def test_demo_trains_a_short_run_probes_it_and_writes_the_report(tmp_path):
    """`workbench demo --train-steps` as a user types it, from a folder outside the repository (every default
    resolves from the package): the default recipe for 3 steps, identity, the demo battery, the report. The keeper
    path (no --train-steps) shares everything after the training; tests/test_anywhere.py probes the shipped keeper
    with the demo battery by name and tests/test_signals.py starts that path and stops it. One held-out row per
    depth before and after: nothing here reads the evaluation's numbers, and its default 16 cost half a minute."""
    out = tmp_path / "demo"
    res = workbench("demo", "--skip-selection", "--train-steps", "3", "--eval-per-depth", "1", "--out", str(out),
                    cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"report: {out / 'probe' / 'report.html'}" in res.stdout
    assert (out / "probe" / "report.html").is_file()
    headline = json.loads((out / "demo.json").read_text())
    assert headline["identity_max_abs_diff"] == 0.0 and "selection" not in headline
    summary = json.loads((out / "probe" / "summary.json").read_text())
    assert summary["checkpoint"]["path"] == str(out / "run") and summary["checkpoint"]["kind"] == "run"
    assert set(headline["probes"]) == set(summary["probes"]) >= {"depth_matrix", "overshoot", "splice", "heads"}
    assert (out / "run" / "provenance.json").exists() and (out / "probe" / "depth_matrix.parquet").exists()
    evals = [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines() if '"eval"' in line]
    assert [e["step"] for e in evals if e.get("kind") == "eval"] == [0, 3]   # before and after, as the option asked
