"""Honest exit codes and interrupts: real subprocesses stopped by SIGINT / SIGTERM, and each failure's code.

Exit status: 0 done, 1 a failed check, 2 bad input, 130 SIGINT (Ctrl-C), 143 SIGTERM. A stopped
command leaves the previous complete state or nothing: no staging directory, no half results, and
`--resume` continues a stopped run.
"""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tomli_w

from tests.test_cli_errors import invoke
from tests.test_cli_output import start_on_a_terminal
from tests.training.conftest import TINY_RECIPE, merge

pytestmark = pytest.mark.multiprocess  # end-to-end runs: real `workbench` subprocesses started, then interrupted mid-run


def start(*args, cwd, ignore_sigint=False):
    """`workbench ARGS` in a subprocess; with `ignore_sigint` it starts as a shell's background job does."""
    pre = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if ignore_sigint else None
    return subprocess.Popen([sys.executable, "-m", "workbench", *map(str, args)], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=pre)


def wait_for(proc, found, what: str, timeout: float = 600.0):
    """Polls until `found()` is true; fails if the process ends first."""
    end = time.monotonic() + timeout
    while not found():
        if proc.poll() is not None:
            pytest.fail(f"the command ended (status {proc.returncode}) before {what}: "
                        f"{proc.stderr.read()[-2000:] if proc.stderr else '(stderr in a file)'}")
        if time.monotonic() > end:
            proc.kill()
            pytest.fail(f"no {what} after {timeout} s")
        time.sleep(0.02)


def stop(proc, sig) -> tuple[int, str]:
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=600)
    return proc.returncode, err


@pytest.fixture(scope="module")
def many_rows(tmp_path_factory):
    """2,000 chase rows (depths 1-2): a probe over them runs long enough to be stopped midway."""
    from workbench.models import load_tokenizer
    from workbench.tasks import build_rows
    from workbench.tasks.manifest import write_manifest

    path = tmp_path_factory.mktemp("many") / "rows.jsonl"
    write_manifest(build_rows("chase", [1, 2], 1000, 5, alphabet=4, tokenizer=load_tokenizer("tiny-llama")), path)
    return path


def test_sigterm_during_probe_leaves_nothing(tmp_path, tiny_run, many_rows):
    out = tmp_path / "res"
    proc = start("probe", "--checkpoint", tiny_run, "--rows", many_rows, "--only", "depth_matrix", "--out", out,
                 cwd=tmp_path)
    wait_for(proc, lambda: any(p.name.startswith(".res.tmp") for p in tmp_path.iterdir()), "the staging directory")
    code, err = stop(proc, signal.SIGTERM)
    assert code == 143, err[-2000:]
    assert list(tmp_path.iterdir()) == [], "a staging directory or partial results were left"


def test_sigterm_during_probe_keeps_the_previous_results(tmp_path, tiny_run, tiny_manifest, many_rows):
    out = tmp_path / "res"  # the previous results: a probe over 4 rows; only the run stopped needs the 2,000
    done = subprocess.run([sys.executable, "-m", "workbench", "probe", "--checkpoint", tiny_run, "--rows",
                           tiny_manifest, "--only", "depth_matrix", "--out", out], capture_output=True, text=True,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    proc = start("probe", "--checkpoint", tiny_run, "--rows", many_rows, "--only", "depth_matrix", "--out", out,
                 "--overwrite", cwd=tmp_path)
    wait_for(proc, lambda: any(p.name.startswith(".res.tmp") for p in tmp_path.iterdir()), "the staging directory")
    code, err = stop(proc, signal.SIGTERM)
    assert code == 143, err[-2000:]
    assert [p.name for p in tmp_path.iterdir()] == ["res"]
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def tiny_recipe(tmp_path, steps: int) -> Path:
    recipe = merge(TINY_RECIPE, {"checkpoint": {"every": 2, "keep": 2},
                                 "stages": [{"name": "a", "depths": [1, 2], "steps": steps}]})
    path = tmp_path / "recipe.toml"
    path.write_text(tomli_w.dumps(recipe))
    return path


def test_ctrl_c_during_train_exits_130_and_resume_finishes(tmp_path):
    """Started with SIGINT ignored, as a shell starts a background job: `kill -INT` must still stop it."""
    recipe, run = tiny_recipe(tmp_path, 20), tmp_path / "run"
    proc = start("train", recipe, "--out", run, cwd=tmp_path, ignore_sigint=True)
    wait_for(proc, lambda: (run / "checkpoints" / "step_2").is_dir(), "the first checkpoint")
    code, err = stop(proc, signal.SIGINT)
    assert code == 130, err[-2000:]
    assert not (run / "provenance.json").exists()  # not a finished run: nothing may load it as one
    assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".")]
    done = subprocess.run([sys.executable, "-m", "workbench", "train", recipe, "--out", run, "--resume"],
                          capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads((run / "provenance.json").read_text())["status"] == "finished"
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()
             if json.loads(line)["kind"] == "train"]
    assert steps == list(range(1, 21))  # every step once: the lines logged after the checkpoint were dropped


def test_failed_check_exits_1(capsys, monkeypatch):
    """`identity` when loop 1 differs from the base: the command's own status reaches the shell."""
    import workbench.loop.identity as module

    monkeypatch.setattr(module, "identity_report", lambda *a, **k: [
        {"reentry": "bridge", "memory": False, "lora": False, "max_abs_diff": 0.5}])
    code, out, _ = invoke(capsys, monkeypatch, "identity", "--model", "tiny-llama", "--block", "1:3")
    assert code == 1 and "= 0.5" in out


def test_the_console_script_passes_the_status_through():
    """The installed `workbench` script is `sys.exit(run())`: run() must exit itself, never return a code."""
    res = subprocess.run([sys.executable, "-c", "import sys; from workbench.cli import run; "
                          "sys.argv = ['workbench', 'identity', '--model', '/no/model', '--block', '1:2']; "
                          "sys.exit(run())"], capture_output=True, text=True)
    assert res.returncode == 2 and res.stderr.startswith("error: model '/no/model' does not exist")


def test_a_full_disk_is_one_line_and_leaves_no_staging(capsys, monkeypatch, tmp_path, tiny_run):
    """The battery's writer fails as on a full disk: exit 1, one line, no staging directory, no results."""
    import errno

    import workbench.probes.battery as battery

    def full(frame, path):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    from workbench.models import load_tokenizer
    from workbench.tasks import build_rows
    from workbench.tasks.manifest import write_manifest

    monkeypatch.setattr(battery, "_write_parquet", full)
    rows = tmp_path / "rows.jsonl"
    write_manifest(build_rows("chase", [1], 2, 5, alphabet=4, tokenizer=load_tokenizer("tiny-llama")), rows)
    code, _, err = invoke(capsys, monkeypatch, "probe", "--checkpoint", tiny_run, "--rows", rows, "--only",
                          "depth_matrix", "--out", tmp_path / "res")
    # stderr also carries the progress bars (carriage returns); the error itself is one line, the last
    last = err.strip().splitlines()[-1]
    assert code == 1 and last.startswith("error: No space left on device: '")
    assert sum(line.startswith("error:") for line in err.splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rows.jsonl", "rows.manifest.json"]


def staged(parent: Path, name: str, inner: str) -> bool:
    """Whether a staging directory `.NAME.tmpPID` under `parent` holds an entry whose name starts with `inner`."""
    try:
        return any(p.name.startswith(f".{name}.tmp") and any(q.name.startswith(inner) for q in p.iterdir())
                   for p in parent.iterdir())
    except FileNotFoundError:  # the staging directory moved or went while we looked
        return False


def test_ctrl_c_during_demo_keeps_the_previous_demo(tmp_path):
    """The demo on the embedded model, stopped while its battery runs: the previous demo is untouched."""
    from workbench.guard import mark_output

    out = tmp_path / "demo"
    out.mkdir()
    (out / "demo.json").write_text('{"model": "a previous demo"}\n')
    mark_output(out, "demo")  # a demo the workbench wrote, which --overwrite may replace
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    proc = start("demo", "--skip-selection", "--out", out, "--overwrite", cwd=tmp_path)
    wait_for(proc, lambda: staged(tmp_path, "demo", ".probe.tmp"), "the demo's battery")
    code, err = stop(proc, signal.SIGINT)
    assert code == 130, err[-2000:]
    assert [p.name for p in tmp_path.iterdir()] == ["demo"], "a staging directory was left"
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_sigterm_during_demo_training_leaves_nothing(tmp_path):
    out = tmp_path / "demo"
    proc = start("demo", "--skip-selection", "--train-steps", "30", "--out", out, cwd=tmp_path)
    wait_for(proc, lambda: staged(tmp_path, "demo", "run"), "the demo's training run")
    code, err = stop(proc, signal.SIGTERM)
    assert code == 143, err[-2000:]
    assert list(tmp_path.iterdir()) == [], "a staging directory or a partial demo was left"


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_an_interrupted_select_block_keeps_the_previous_selection(tmp_path, sig, code):
    """select-block stopped during its sweep: the previous selection (both files) is untouched, nothing staged."""
    from workbench.commands.select_block import SELECTION_HTML, SELECTION_JSON
    from workbench.guard import mark_output

    out = tmp_path / "sel"
    out.mkdir()
    (out / SELECTION_JSON).write_text('{"recommended": [1, 3]}\n')
    (out / SELECTION_HTML).write_text("<html>a previous selection</html>\n")
    mark_output(out, "select-block")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    corpus = tmp_path / "corpus.txt"  # long enough that the sweep is still running when the signal comes
    corpus.write_text("\n".join(f"Text {i}: " + "the rule maps each letter to the next one " * 12 for i in range(4000)))
    # stderr on a terminal, where the sweep draws its bar (on a pipe it draws none)
    proc, seen, _ = start_on_a_terminal(["select-block", "--model", "tiny-llama", "--corpus", corpus, "--window", "2",
                                         "--out", out, "--overwrite"], cwd=tmp_path)
    wait_for(proc, lambda: b"angular distance" in seen, "the angular-distance sweep")
    proc.send_signal(sig)
    proc.wait(timeout=600)
    assert proc.returncode == code, bytes(seen[-2000:]).decode(errors="replace")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.txt", "sel"], "staging was left"
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
