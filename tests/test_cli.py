"""The CLI end to end, as a user types it (a real subprocess, a temporary directory)."""

import subprocess
import sys

import pytest


def workbench(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "workbench", *args], capture_output=True, text=True, cwd=cwd)


def test_help_lists_commands():
    res = workbench("--help")
    assert res.returncode == 0
    for command in ("identity", "demo"):
        assert command in res.stdout


def test_identity_on_a_tiny_model_prints_zero():
    res = workbench("identity", "--model", "tiny-qwen2", "--block", "1:4")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().endswith("max |Δlogit| over 6 prompts = 0.0")
    assert res.stdout.count("max|Δlogit| = 0.0") == 8


@pytest.mark.parametrize("args,message", [
    (("identity", "--model", "tiny-llama", "--block", "4:2"), "block 4:2 is invalid for a model with 6 layers"),
    (("identity", "--model", "tiny-llama", "--block", "0:9"), "need 0 <= a < b <= 6"),
    (("identity", "--model", "/no/such/dir", "--block", "1:2"), "'/no/such/dir' does not exist"),
])
def test_bad_input_is_one_line_and_exit_2(args, message):
    res = workbench(*args)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], res.stderr
    assert "Traceback" not in res.stderr


def test_debug_shows_the_traceback():
    res = workbench("--debug", "identity", "--model", "tiny-llama", "--block", "4:2")
    assert res.returncode != 0 and "Traceback" in res.stderr


@pytest.mark.slow
def test_identity_on_the_embedded_default():
    res = workbench("identity", "--model", "smollm2-135m-instruct", "--block", "10:16", "--loops", "2")
    assert res.returncode == 0, res.stderr
    assert "smollm2-135m-instruct block 10:16: max |Δlogit| over 6 prompts = 0.0" in res.stdout
