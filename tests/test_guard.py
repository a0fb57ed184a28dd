"""One output guard (workbench.guard.guard_output): every writer asks it before any work, and it never lets a
command replace what a user owns, what the command reads, a repository root, or a run being trained.

The first test enumerates the commands from the Typer app itself: a new command with --out that does
not reach the guard fails it. The others are the cases an adversarial pass found (issue 29), run
through the CLI in process, each asserting one line, exit 2 and every file unchanged (checksums).
"""

import hashlib
import inspect
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.test_cli_errors import assert_clean_error, copy_run, invoke, probe_args
from workbench import cli
from workbench import guard as output_guard
from workbench.errors import WorkbenchError
from workbench.guard import OUTPUT_MARKER, guard_output
from workbench.io import LOCK
from workbench.probes.battery import RESULTS_OUTPUT
from workbench.runs import RUN_OUTPUT

ROOT = Path(__file__).resolve().parents[1]
KEEPER = ROOT / "training" / "keepers" / "smollm2-chase"


def checksums(path: Path) -> dict:
    """{relative path: sha256} of every file and link under `path` (links by their target)."""
    out = {}
    for p in sorted(Path(path).rglob("*")):
        rel = str(p.relative_to(path))
        if p.is_symlink():
            out[rel] = "link:" + os.readlink(p)
        elif p.is_file():
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
        elif p.is_dir():
            out[rel] = "dir"
    return out


class Reached(Exception):
    """Raised by the patched guard: the command got there."""


def _writer_args(tmp: Path) -> dict[str, list]:
    """Minimal arguments with which each writing command gets as far as its output guard."""
    out = tmp / "out"
    return {
        "demo": ["demo", "--out", out],
        "select-block": ["select-block", "--model", "tiny-llama", "--out", out],
        "train": ["train", "smollm2_lora_chase", "--out", out],
        "launch": ["launch", "smollm2_lora_chase", "--preset", "ddp", "--processes", "2", "--cpu", "--out", out],
        "probe": ["probe", "--checkpoint", KEEPER, "--battery", "demo", "--out", out],
        "compare": ["compare", tmp / "a", tmp / "b", "--out", out],
        "report": ["report", tmp / "a", "--out", tmp / "r.html"],
        "figures": ["figures", "--results", tmp / "a", "--format", "html", "--out", out],
        "claims": ["claims", "--out", out],
        "rows": ["rows", "--task", "state", "--depths", "1-2", "--per-depth", "2", "--seed", "1",
                 "--out", tmp / "r.jsonl"],
    }


def _writers() -> list[str]:
    """Every registered command that takes --out: a writer."""
    names = []
    for command in cli.app.registered_commands:
        params = inspect.signature(command.callback).parameters
        if "out" in params:
            names.append(command.name or command.callback.__name__)
    return names


def test_every_writer_reaches_the_guard_before_any_work(monkeypatch, tmp_path):
    writers = _writers()
    args = _writer_args(tmp_path)
    assert sorted(writers) == sorted(args), "a command with --out has no case here: add one (it must use the guard)"

    def reached(self):
        raise Reached(self.command)

    def no_work(*a, **k):
        raise AssertionError("a model was loaded before the output guard")

    import importlib

    for module in ("workbench.train.trainer", "workbench.train.build", "workbench.probes.battery", "workbench.plots.export",
                   "workbench.analysis.claims", "workbench.plots.report", "workbench.selection.stage1",
                   "workbench.loop.identity", "workbench.tasks.manifest", "workbench.runs"):
        importlib.import_module(module)  # imported before the patch: none binds the patched load_base for good
    monkeypatch.setattr(output_guard.Guard, "_decide", reached)
    for module in ("workbench.models", "workbench.models.bases", "workbench.train.build", "workbench.runs"):
        monkeypatch.setattr(f"{module}.load_base", no_work)
    before = checksums(tmp_path)
    for name in writers:
        with pytest.raises(Reached) as exc:
            cli.app([str(a) for a in args[name]], standalone_mode=False)
        assert exc.value.args[0] == name  # its own guard, first
        assert checksums(tmp_path) == before, f"{name} wrote before its guard"



# ----------------------------------------------------------------------------- each writer declares its output
# Each writer's output kind, declared beside its code (module, name); the directories written in place (a run, a
# window sweep) are declared with the guard (`workbench.guard.in_place`), which asks both whatever the writer hands.
KINDS = {
    "demo": ("workbench.commands.demo", "DEMO_OUTPUT"),
    "select-block": ("workbench.commands.select_block", "SELECTION_OUTPUT"),
    "select-block --window-sweep": ("workbench.guard.in_place", "SWEEP_OUTPUT"),
    "train": ("workbench.guard.in_place", "RUN_OUTPUT"),
    "launch": ("workbench.guard.in_place", "RUN_OUTPUT"),
    "probe": ("workbench.probes.battery", "RESULTS_OUTPUT"),
    "compare": ("workbench.commands.compare", "COMPARE_OUTPUT"),
    "report": ("workbench.commands.report", "REPORT_OUTPUT"),
    "figures": ("workbench.plots.export", "FIGURES_OUTPUT"),
    "claims": ("workbench.analysis.claims.ledger", "LEDGER_OUTPUT"),
    "rows": ("workbench.tasks.manifest", "ROWS_OUTPUT"),
    "lens --html": ("workbench.plots.prompt_lens", "LENS_OUTPUT"),
    "export_run": ("workbench.runs", "EXPORT_OUTPUT"),
}


def _every_writers_args(tmp: Path) -> dict[str, list]:
    """`_writer_args` and the writers that are not a command of their own: each case of KINDS but export_run."""
    return {**_writer_args(tmp),
            "select-block --window-sweep": ["select-block", "--model", "tiny-llama", "--window-sweep",
                                            "--out", tmp / "out"],
            "lens --html": ["lens", "tiny-llama", "--block", "1:2", "--prompt", "x", "--html", tmp / "l.html"]}


def test_each_writer_hands_the_guard_the_kind_its_module_declares(monkeypatch, tmp_path):
    import importlib

    from workbench.runs import export_run

    args = _every_writers_args(tmp_path)
    assert sorted(KINDS) == sorted([*args, "export_run"])
    assert set(_writers()) <= set(KINDS), "a command with --out declares no output kind here: add it"

    def reached(self):
        raise Reached(self.kind, {k.name for k in self.in_place})

    for module in ("workbench.train.trainer", "workbench.probes.battery", "workbench.plots.export",
                   "workbench.analysis.claims", "workbench.selection.window_sweep", "workbench.runs"):
        importlib.import_module(module)
    monkeypatch.setattr(output_guard.Guard, "_decide", reached)
    for name, (module, attr) in KINDS.items():
        with pytest.raises(Reached) as exc:
            if name == "export_run":
                export_run(KEEPER, tmp_path / "keeper")
            else:
                cli.app([str(a) for a in args[name]], standalone_mode=False)
        declared = getattr(importlib.import_module(module), attr)
        assert exc.value.args[0] is declared, f"{name} handed {exc.value.args[0]!r}, not {module}.{attr}"
        assert exc.value.args[1] == {"run", "sweep"}, name  # both kinds written in place, asked by all


def test_the_guard_takes_only_a_declared_kind_and_names_no_writers_file(tmp_path):
    from workbench.analysis.claims.ledger import LEDGER_FILES
    from workbench.commands.compare import WRITTEN
    from workbench.commands.select_block import SELECTION_HTML, SELECTION_JSON
    from workbench.plots.export import FIGURE_SUFFIXES
    from workbench.plots.report import REPORT
    from workbench.probes.battery import RESULTS_FILES
    from workbench.selection import window_sweep
    from workbench.tasks.manifest import SIDECAR_SUFFIX

    for kind in ("dir", "run", None):
        with pytest.raises(TypeError, match="OutputKind"):
            guard_output(tmp_path / "out", "probe", kind=kind)
    with pytest.raises(TypeError, match="written in place"):
        guard_output(tmp_path / "out", "probe", kind=RESULTS_OUTPUT, beside=(RESULTS_OUTPUT,))
    writers = {*RUN_OUTPUT.continued.keeps, window_sweep.SWEEP, window_sweep.TABLE, window_sweep.RUNS,
               window_sweep.READINGS, window_sweep.DAMAGE,
               *RESULTS_FILES, *LEDGER_FILES, *WRITTEN, *FIGURE_SUFFIXES, SIDECAR_SUFFIX, REPORT, SELECTION_JSON,
               SELECTION_HTML} - {OUTPUT_MARKER, LOCK}  # the output marker and io's training lock are the guard's own
    source = "".join(p.read_text() for p in Path(output_guard.__file__).parent.glob("*.py"))
    assert not sorted(n for n in writers if f'"{n}' in source or f"'{n}" in source)


# ----------------------------------------------------------------------------- writers that replaced user files
@pytest.fixture
def results(tmp_path, tiny_run, tiny_manifest):
    """A probe results directory of the tiny run (depth_matrix only)."""
    out = tmp_path / "res"
    code = subprocess_free_probe(tiny_run, tiny_manifest, out)
    assert code == 0
    return out


def subprocess_free_probe(run, manifest, out):
    from workbench.plots.report import write_report
    from workbench.probes.battery import run_battery

    run_battery(str(run), "default", out, rows=str(manifest), only=["depth_matrix"], progress=False,
                finish=lambda staging: write_report(staging, shown_as=out))
    return 0


def _refused(capsys, monkeypatch, root, *args, fragment=""):
    before = checksums(root)
    code, _, err = invoke(capsys, monkeypatch, *args)
    assert_clean_error(code, err, fragment)
    assert checksums(root) == before
    return err


def test_report_never_replaces_its_input_or_a_user_file(capsys, monkeypatch, tmp_path, results):
    _refused(capsys, monkeypatch, tmp_path, "report", results, "--out", results / "summary.json",
             fragment="which this command reads")
    notes = tmp_path / "home" / "notes.md"
    notes.parent.mkdir()
    notes.write_text("my notes")
    _refused(capsys, monkeypatch, tmp_path, "report", results, "--out", notes, fragment="did not write it")
    _refused(capsys, monkeypatch, tmp_path, "report", results, "--out", notes.parent, fragment="is a directory")
    code, _, err = invoke(capsys, monkeypatch, "report", results)  # its own report.html: replaced, as always
    assert code == 0, err


def test_claims_never_replaces_a_user_ledger(capsys, monkeypatch, tmp_path):
    out = tmp_path / "ledger"
    out.mkdir()
    (out / "LEDGER.md").write_text("my own ledger\n")
    _refused(capsys, monkeypatch, tmp_path, "claims", "--out", out, fragment="did not write it")
    (out / "LEDGER.md").unlink()
    code, _, err = invoke(capsys, monkeypatch, "claims", "--out", out)
    assert code == 0, err
    code, _, err = invoke(capsys, monkeypatch, "claims", "--out", out)  # its own ledger: rewritten
    assert code == 0, err
    bad = tmp_path / "bad.toml"
    bad.write_bytes(b"\xff\xfe not toml")
    _refused(capsys, monkeypatch, tmp_path, "claims", "--claims", bad, fragment="UTF-8")


@pytest.mark.parametrize("case", ["user dir", "repository root", "probe results", "recipe name", "file"])
def test_train_writes_only_a_new_dir_or_its_own_run(capsys, monkeypatch, tmp_path, results, case):
    recipe = ROOT / "training" / "smollm2_lora_chase.toml"
    if case == "user dir":
        out = tmp_path / "mine"
        out.mkdir()
        (out / "metrics.jsonl").write_text("my data\n")
        args, fragment = ("train", recipe, "--out", out), "holds no run"
    elif case == "repository root":
        out = tmp_path / "repo"
        (out / ".git").mkdir(parents=True)
        args, fragment = ("train", recipe, "--out", out), "repository root"
    elif case == "probe results":
        args, fragment = ("train", recipe, "--out", results), "holds no run"
    elif case == "file":
        (tmp_path / "f").write_text("x")
        args, fragment = ("train", recipe, "--out", tmp_path / "f"), "not a directory"
    else:
        text = recipe.read_text().replace('name = "smollm2-chase"', 'name = "../../escaped"')
        assert "../../escaped" in text
        (tmp_path / "r.toml").write_text(text)
        monkeypatch.chdir(tmp_path)
        args, fragment = ("train", tmp_path / "r.toml"), "recipe name"
    _refused(capsys, monkeypatch, tmp_path, *args, fragment=fragment)


def test_probe_overwrite_never_deletes_a_run_or_a_battery_inside_out(capsys, monkeypatch, tmp_path, results,
                                                                    tiny_run, tiny_manifest):
    run = copy_run(tiny_run, tmp_path)
    (run / OUTPUT_MARKER).write_text("{}")  # a marker does not make a run replaceable
    _refused(capsys, monkeypatch, tmp_path, *probe_args(tiny_run, tiny_manifest, run, "--overwrite"),
             fragment="training run")
    battery = results / "mine.toml"
    battery.write_text((ROOT / "workbench" / "data" / "probes" / "demo.toml").read_text())
    _refused(capsys, monkeypatch, tmp_path, "probe", "--checkpoint", tiny_run, "--battery", battery, "--rows",
             tiny_manifest, "--only", "depth_matrix", "--out", results, "--overwrite", fragment="this command reads")


def test_the_older_results_rule_takes_only_a_probes_own_files(tmp_path):
    old = tmp_path / "old"
    old.mkdir()
    (old / "summary.json").write_text(json.dumps({"created_by": "workbench 0.1", "probes": {}}))
    (old / "depth_matrix.parquet").write_bytes(b"x")
    assert output_guard.is_workbench_output(old, RESULTS_OUTPUT)
    (old / "thesis.tex").write_text("mine")
    assert not output_guard.is_workbench_output(old, RESULTS_OUTPUT)
    with pytest.raises(WorkbenchError, match="--overwrite replaces only"):
        guard_output(old, "probe", kind=RESULTS_OUTPUT, overwrite=True)


@pytest.mark.parametrize("kind", ["link to a dir", "dangling link", "link loop", "dot", "dotdot"])
def test_out_paths_that_name_no_new_place(tmp_path, kind):
    target = tmp_path / "real"
    target.mkdir()
    out = tmp_path / "out"
    if kind == "link to a dir":
        out.symlink_to(target)
    elif kind == "dangling link":
        out.symlink_to(tmp_path / "nowhere")
    elif kind == "link loop":
        out.symlink_to(tmp_path / "loop2")
        (tmp_path / "loop2").symlink_to(out)
        out = out / "sub"
    elif kind == "dot":
        out = Path(".")
    else:
        out = tmp_path / "real" / ".."
    before = checksums(tmp_path)
    with pytest.raises(WorkbenchError) as exc:
        guard_output(out, "probe", kind=RESULTS_OUTPUT, overwrite=True)
    assert "\n" not in str(exc.value)
    assert checksums(tmp_path) == before


def test_figure_spec_file_names_stay_inside_out(capsys, monkeypatch, tmp_path, results):
    for name in ("../escaped", "/tmp/escaped", "a/../../b"):
        spec = tmp_path / "spec.toml"
        spec.write_text(f'[[figure]]\nname = "depth_matrix"\nfile = "{name}"\n')
        _refused(capsys, monkeypatch, tmp_path, "figures", "--results", results, "--format", "html", "--spec", spec,
                 "--out", tmp_path / "figs", fragment="plain relative name")
    spec.write_text('[[figure]]\nname = "depth_matrix"\nwidth_in = "wide"\n')
    _refused(capsys, monkeypatch, tmp_path, "figures", "--results", results, "--format", "html", "--spec", spec,
             "--out", tmp_path / "figs", fragment="must be numbers")


# ----------------------------------------------------------------------------- races and locks
HOLD = textwrap.dedent("""
    import sys, time
    from workbench.io import locked_dir
    from workbench.guard import OutputKind, guard_output
    if sys.argv[1] == "guard":
        g = guard_output(sys.argv[2], "probe", kind=OutputKind("held"))
        print("held", flush=True); time.sleep(60)
    else:
        with locked_dir(sys.argv[2], "run directory"):
            print("held", flush=True); time.sleep(60)
""")


@pytest.mark.slow   # a second, fresh interpreter holds the directory (flock is per process)
@pytest.mark.parametrize("holder", ["guard", "training lock"])
def test_a_second_writer_is_refused_while_the_first_holds_out(tmp_path, holder):
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", HOLD, "guard" if holder == "guard" else "lock", str(out)],
                            stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout.readline().strip() == "held"
        for kind in (RESULTS_OUTPUT, RUN_OUTPUT):
            with pytest.raises(WorkbenchError, match="another workbench process|in use by another process"):
                guard_output(out, "probe", kind=kind, overwrite=True)
    finally:
        proc.kill()
        proc.wait()
    guard_output(out, "probe", kind=RESULTS_OUTPUT).release()  # free once the holder is gone (flock: never stale)


NO_PID = 4_194_305   # above Linux's largest pid (2**22): no process holds it, as after a killed writer


def test_the_output_lock_is_filelocks(tmp_path):
    """The lock on an output is filelock's: while a guard holds --out, filelock cannot take the lock's file, and while
    any filelock user holds that file, the guard is refused in one line."""
    from filelock import FileLock, Timeout

    from workbench.guard import output_lock_file

    out = tmp_path / "out"
    file = output_lock_file(out.resolve())
    guard = guard_output(out, "probe", kind=RESULTS_OUTPUT)
    with pytest.raises(Timeout):
        FileLock(file, timeout=0).acquire()
    assert file.read_text().strip() == str(os.getpid())
    guard.release()
    theirs = FileLock(file, timeout=0)
    with theirs, pytest.raises(WorkbenchError, match="being written by another workbench process"):
        guard_output(out, "probe", kind=RESULTS_OUTPUT)
    guard_output(out, "probe", kind=RESULTS_OUTPUT).release()


def test_a_stale_lock_of_a_killed_writer_is_taken(tmp_path):
    """A lock file a killed writer left behind (its pid in it, nobody holding it) locks nothing: the guard takes the
    output and writes its own pid, and a run's stale `.lock` refuses nothing until a training holds it again."""
    from workbench.guard import output_lock_file
    from workbench.io import locked_dir

    out = tmp_path / "out"
    file = output_lock_file(out.resolve())
    file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    file.write_text(f"{NO_PID}\n")
    guard = guard_output(out, "probe", kind=RESULTS_OUTPUT)
    assert file.read_text().strip() == str(os.getpid())
    guard.release()
    run = tmp_path / "run"
    run.mkdir()
    (run / LOCK).write_text(f"{NO_PID}\n")
    guard_output(run / "battery", "probe", kind=RESULTS_OUTPUT).release()
    with locked_dir(run, "run directory"), pytest.raises(WorkbenchError, match=f"pid {os.getpid()}\\)"):
        guard_output(run / "battery", "probe", kind=RESULTS_OUTPUT)


def test_two_writers_of_one_lock_take_it_in_turn(tmp_path):
    """Two threads asking for one lock (processes: the slow test above): the second is refused with the first's pid
    while the first holds it, and takes it once the first lets go."""
    import threading

    from workbench.io import HeldLock

    file, taken = tmp_path / "x.lock", []

    def second():
        try:
            taken.append(HeldLock(file, lambda pid: WorkbenchError(f"held by {pid}")))
        except WorkbenchError as err:
            taken.append(str(err))

    def in_a_thread():
        thread = threading.Thread(target=second)
        thread.start()
        thread.join()

    first = HeldLock(file, lambda pid: WorkbenchError(pid))
    in_a_thread()
    first.release()
    in_a_thread()
    assert taken[0] == f"held by {os.getpid()}" and taken[1].is_locked


def test_the_move_is_rechecked_under_the_lock(tmp_path):
    out = tmp_path / "out"
    guard = guard_output(out, "probe", kind=RESULTS_OUTPUT)
    staging = tmp_path / ".out.tmp1"
    staging.mkdir()
    (staging / "summary.json").write_text("{}")
    out.mkdir()  # another writer (not a workbench process) got there first
    (out / "theirs.txt").write_text("theirs")
    with pytest.raises(WorkbenchError, match="changed while this command ran"):
        guard.commit_dir(staging)
    assert (out / "theirs.txt").read_text() == "theirs"


def test_stale_staging_of_a_killed_writer_is_cleaned(tmp_path):
    # a pid that was a process and is gone: a shell (milliseconds; an interpreter would take seconds) that exited
    proc = subprocess.run(["sh", "-c", "echo $$"], capture_output=True, text=True, check=True)
    dead = int(proc.stdout)
    stale = tmp_path / f".out.tmp{dead}"
    stale.mkdir()
    (stale / "half.parquet").write_bytes(b"x")
    alive = tmp_path / f".out.tmp{os.getpid()}"
    alive.mkdir()
    other = tmp_path / f".other.tmp{dead}"
    other.mkdir()
    guard_output(tmp_path / "out", "probe", kind=RESULTS_OUTPUT).release()
    assert not stale.exists() and alive.exists() and other.exists()


# ----------------------------------------------------------------------------- resume never loses history
def test_resume_on_a_finished_run_or_a_keeper_is_refused(capsys, monkeypatch, tmp_path, tiny_run):
    run = copy_run(tiny_run, tmp_path)
    before = checksums(tmp_path)
    code, _, err = invoke(capsys, monkeypatch, "train", run / "recipe.toml", "--out", run, "--resume")
    assert_clean_error(code, err, "finished run")
    keeper = tmp_path / "keeper"
    import shutil

    shutil.copytree(KEEPER, keeper)
    before = checksums(tmp_path)
    code, _, err = invoke(capsys, monkeypatch, "train", keeper / "recipe.toml", "--out", keeper, "--resume")
    assert_clean_error(code, err, "finished run")
    assert checksums(tmp_path) == before


def test_resume_without_a_checkpoint_keeps_the_metrics(capsys, monkeypatch, tmp_path, tiny_run):
    run = copy_run(tiny_run, tmp_path)
    (run / "provenance.json").unlink()  # an unfinished run killed before its first checkpoint
    shutil_rm = __import__("shutil").rmtree
    shutil_rm(run / "checkpoints", ignore_errors=True)
    assert (run / "metrics.jsonl").read_text().strip()
    before = checksums(tmp_path)
    code, _, err = invoke(capsys, monkeypatch, "train", run / "recipe.toml", "--out", run, "--resume")
    assert_clean_error(code, err, "no checkpoint to continue from", "metrics.jsonl")
    assert checksums(tmp_path) == before


def test_tensors_are_written_with_the_users_umask(tmp_path):
    import torch

    from workbench.train.rundir import save_tensors

    mask = os.umask(0o022)
    try:
        save_tensors(tmp_path / "t.safetensors", {"a": torch.zeros(2)})
    finally:
        os.umask(mask)
    assert (tmp_path / "t.safetensors").stat().st_mode & 0o777 == 0o644


def test_a_shard_index_may_not_leave_the_model_directory(tmp_path):
    from workbench.models.weights_check import weights_index

    (tmp_path / "m").mkdir()
    (tmp_path / "outside.safetensors").write_bytes(b"")
    (tmp_path / "m" / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "../outside.safetensors"}}))
    with pytest.raises(WorkbenchError, match="not a file in"):
        weights_index(tmp_path / "m")


def test_export_run_goes_through_the_guard_and_never_into_its_own_run(monkeypatch, tmp_path):
    from workbench.runs import export_run

    run = tmp_path / "run"
    shutil.copytree(KEEPER, run, ignore=shutil.ignore_patterns("arms", "battery", "final", "loops"))
    for dest in (run / "copy", tmp_path):  # inside the run it copies, or above it: refused before any copy
        with pytest.raises(WorkbenchError, match="which this command reads|already exists"):
            export_run(run, dest)
    assert not (run / "copy").exists()
    tmp_path = tmp_path / "elsewhere"
    tmp_path.mkdir()

    def reached(self):
        raise Reached(self.command)

    monkeypatch.setattr(output_guard.Guard, "_decide", reached)
    with pytest.raises(Reached, match="export"):
        export_run(KEEPER, tmp_path / "keeper")
    assert list(tmp_path.iterdir()) == []


def test_the_file_writers_write_nothing_into_a_run(capsys, monkeypatch, tmp_path):
    """report, figures, claims and compare never load the run format (no torch), yet the guard asks the run's kind,
    declared without it (`workbench.guard.in_place`): their files never go into a run nor under one of its names."""
    run = tmp_path / "run"
    shutil.copytree(KEEPER, run, ignore=shutil.ignore_patterns("arms", "battery*", "final", "loops", "verbal*"))
    res = ROOT / "training" / "keepers" / "smollm2-chase-anneal" / "battery"
    for args, fragment in ((("claims", "--out", run), "holds a training run"),
                           (("compare", res, res, "--out", run), "holds a training run"),
                           (("figures", "--results", res, "--format", "html", "--out", run), "holds a training run"),
                           (("report", res, "--out", run / "checkpoints"), "training run's own")):
        _refused(capsys, monkeypatch, tmp_path, *args, fragment=fragment)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("mine")
    _refused(capsys, monkeypatch, tmp_path, "claims", "--out", mine, fragment="'thesis.tex', which claims did not")


def test_results_inside_a_run_it_reads_but_never_its_own_names(tmp_path):
    from workbench.commands.report import REPORT_OUTPUT

    run = tmp_path / "run"
    shutil.copytree(KEEPER, run, ignore=shutil.ignore_patterns("arms", "battery", "final", "loops"))
    probe = {"kind": RESULTS_OUTPUT, "reading": [run]}  # as the battery asks: the run's kind is asked unhanded
    guard_output(run / "battery", "probe", **probe).release()  # the keepers' layout: RUN/battery
    for name in ("checkpoints", "metrics.jsonl", "trainable.safetensors"):
        with pytest.raises(WorkbenchError, match="training run's own"):
            guard_output(run / name, "probe", **probe)
        with pytest.raises(WorkbenchError, match="training run's own"):
            guard_output(run / name, "train", kind=RUN_OUTPUT)  # a run asks itself: no run inside a run's own names
    with pytest.raises(WorkbenchError, match="which is a file"):
        guard_output(run / "recipe.toml" / "x.html", "report", kind=REPORT_OUTPUT)


def test_rows_never_writes_a_file_a_run_keeps(capsys, monkeypatch, tmp_path):
    """A frozen manifest is a file, but not one of a run's: a run that has not written its metrics.jsonl yet (started,
    no step logged) still keeps the name, and `rows --out RUN/metrics.jsonl` is refused, the run untouched."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "recipe.toml").write_text('name = "x"\n')
    _refused(capsys, monkeypatch, tmp_path, "rows", "--task", "chase", "--depths", "1-2", "--seed", "1",
             "--out", run / "metrics.jsonl", fragment="names a training run's own file")
    assert sorted(p.name for p in run.iterdir()) == ["recipe.toml"]


@pytest.mark.parametrize("writer", ["train", "probe"])
def test_nothing_but_the_sweep_writes_into_a_sweep(capsys, monkeypatch, tmp_path, writer):
    """A window sweep keeps every name in it: a run or results written directly inside one under a name of a run's
    (`checkpoints`, which would make the sweep read as a run) is refused, as the guard refused it before the kinds were
    split, and the sweep is untouched."""
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "sweep.json").write_text("{}")
    args = {**_writer_args(tmp_path)}[writer]
    args = [*args[:args.index("--out") + 1], sweep / "checkpoints"]
    _refused(capsys, monkeypatch, tmp_path, *args, fragment="window sweep")
    assert sorted(p.name for p in sweep.iterdir()) == ["sweep.json"]


# ----------------------------------------------------------------------------- every writer asks every place
# The directories written in place (a run, a window sweep) are declared once (`workbench.guard.in_place`) and asked by every
# guard, so no writer can forget one. Each writer is sent at each of them: --out a name the place keeps (`inside`), or
# the place itself carrying a forged output marker (`marked`: a marker alone never makes a run or a sweep the
# workbench's own output to write into or replace). Writers whose --out is one file (and export_run, which refuses a
# destination that exists) are sent to a name inside the place, with the marker there in the `marked` cases.
PLACES = ("inside a run", "a marked run", "inside a sweep", "a marked sweep", "deep inside a run", "deep inside a sweep")
FILE_WRITERS = {"report": ".html", "rows": ".jsonl", "lens --html": ".html", "export_run": ""}
# Refused in the writer's own words where it writes in place and --out is the other place itself: a run directory
# that holds no run, or a run already there without --resume.
OWN_WORDS = {("train", "a marked run"): "already holds a run", ("launch", "a marked run"): "already holds a run",
             ("train", "a marked sweep"): "holds no run", ("launch", "a marked sweep"): "holds no run",
             ("select-block --window-sweep", "a marked run"): "holds no window sweep"}


class Passed(Exception):
    """Raised by the patched guard once its real decision let the output through: the command would have written."""


def _plant(tmp: Path, place: str) -> tuple[Path, str]:
    """The place planted under `tmp` (a run in progress, before its first step: its recipe.toml alone; a window sweep:
    its plan alone), a forged marker in it for the `marked` cases; returns it and the words naming it."""
    where = tmp / "place"   # a neutral name: a refusal must name the place by its kind, not by its path
    where.mkdir()
    if place.endswith("run"):
        (where / "recipe.toml").write_text('name = "x"\n')
    else:
        (where / "sweep.json").write_text("{}")
    if place.startswith("a marked"):
        (where / OUTPUT_MARKER).write_text(json.dumps({"written_by": "workbench claims"}))
    return where, "training run" if place.endswith("run") else "window sweep"


def _out_at(writer: str, place: str, where: Path) -> Path:
    """Where `writer` is sent: a name `where` keeps (a run keeps checkpoints and metrics.jsonl, a sweep every name), or
    `where` itself when the place is marked and --out is a directory."""
    if place.startswith("a marked") and writer not in FILE_WRITERS:
        return where
    if place.startswith("deep"):   # below a name the place keeps, not at it: every ancestor is asked, not the parent
        return where / ("new" if place.endswith("sweep") else "checkpoints") / f"x{FILE_WRITERS.get(writer, '')}"
    if place.endswith("sweep"):
        return where / f"x{FILE_WRITERS.get(writer, '')}"
    return where / ("metrics.jsonl" if writer == "rows" else "checkpoints")


def _cases() -> list:
    cases = []
    for writer in KINDS:
        for place in PLACES:
            if writer == "lens --html" and place in ("inside a run", "a marked run"):
                continue  # a lens page is an .html file (its suffix is checked first) and a run keeps no such name
            cases.append(pytest.param(writer, place, id=f"{writer} | {place}"))
    return cases


@pytest.mark.parametrize(("writer", "place"), _cases())
def test_no_writer_writes_into_a_run_or_a_sweep(capsys, monkeypatch, tmp_path, writer, place):
    """Planted: each writer's --out at a run or a sweep it does not hand the guard (before they were declared once, figures,
    report, compare, claims and lens handed none, rows and export_run the run's only): refused by the guard itself,
    one line, every file unchanged. The guard's real decision runs; one that lets the output through raises Passed
    before any work, so a writer that would write there fails here without writing."""
    from workbench.runs import export_run

    assert sorted(KINDS) == sorted([*_every_writers_args(tmp_path), "export_run"])
    where, words = _plant(tmp_path, place)
    out = _out_at(writer, place, where)
    decide = output_guard.Guard._decide

    def decide_then_stop(self):
        decide(self)
        raise Passed(f"{self.command} --out {self.path}")

    monkeypatch.setattr(output_guard.Guard, "_decide", decide_then_stop)
    fragment = OWN_WORDS.get((writer, place), words)
    before = checksums(tmp_path)
    try:
        if writer == "export_run":
            with pytest.raises(WorkbenchError) as exc:
                export_run(KEEPER, out)
            assert fragment in str(exc.value) and "\n" not in str(exc.value), str(exc.value)
        else:
            res = ROOT / "training" / "keepers" / "smollm2-chase-anneal" / "battery"  # real results: real file names
            args = {**_every_writers_args(tmp_path), "compare": ["compare", res, res, "--out", out],
                    "report": ["report", res, "--out", out],
                    "figures": ["figures", "--results", res, "--format", "html", "--out", out]}[writer]
            flag = "--html" if writer == "lens --html" else "--out"
            args = [*args[:args.index(flag) + 1], out, *args[args.index(flag) + 2:]]
            code, _, err = invoke(capsys, monkeypatch, *args)
            assert_clean_error(code, err, fragment)
    except Passed as passed:
        pytest.fail(f"the guard let {passed} through ({place})")
    assert checksums(tmp_path) == before


def test_only_the_sweep_itself_writes_its_runs_while_it_holds_its_guard(tmp_path):
    """A sweep's runs lie inside it (SWEEP/runs/<name>): its own process, holding the sweep's guard, trains them
    there; any other writer, a `train --out SWEEP/runs/x` of its own included, is refused, at any depth."""
    from workbench.guard import RUN_OUTPUT, SWEEP_OUTPUT

    sweep = tmp_path / "sweep"
    held = guard_output(sweep, "select-block", kind=SWEEP_OUTPUT)
    sweep.mkdir()
    (sweep / "sweep.json").write_text("{}")
    guard_output(sweep / "runs" / "2-8-seed1", "train", kind=RUN_OUTPUT).release()   # the sweep's own run
    held.release()
    with pytest.raises(WorkbenchError, match="holds a window sweep") as refused:   # no --resume: refused
        guard_output(sweep, "select-block", kind=SWEEP_OUTPUT)
    assert refused.value   # kept alive, with its lock: a refused guard is not the sweep's writer at work
    for out in (sweep / "runs" / "2-8-seed1", sweep / "runs" / "mine", sweep / "a" / "b" / "c"):
        with pytest.raises(WorkbenchError, match="lies inside a window sweep"):
            guard_output(out, "train", kind=RUN_OUTPUT)
    run = tmp_path / "run"
    run.mkdir()
    (run / "recipe.toml").write_text('name = "x"\n')
    with pytest.raises(WorkbenchError, match="names a training run's own file or directory \\('checkpoints' of"):
        guard_output(run / "checkpoints" / "step-9" / "x", "probe", kind=RESULTS_OUTPUT)
    guard_output(run / "battery" / "deeper", "probe", kind=RESULTS_OUTPUT).release()   # a name the run does not keep


def _planted_place(tmp_path):
    """A kind written in place declared outside the package (as a user's module would), and a directory of its."""
    from workbench.guard import EVERY_NAME, IN_PLACE, Continued, OutputKind

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "plan.txt").write_text("x")
    kind = OutputKind("mine", IN_PLACE, owns=lambda p: (p / "plan.txt").is_file(), continued=Continued(
        entry="plan.txt", what="a planted place", keeps=EVERY_NAME, not_a_directory="{p}", holds_another="{p}",
        holds_one="{p}"))
    return kind, mine


def test_a_kind_written_in_place_outside_the_package_is_asked_when_handed_beside(tmp_path):
    """What a guard asks is a plain declaration (`IN_PLACE_KINDS`: the run and the sweep), the writer's kind and what
    it hands `beside`; declaring another kind registers nothing, so only a guard handed it asks it."""
    from workbench.guard import IN_PLACE_KINDS, RUN_OUTPUT, SWEEP_OUTPUT

    kind, mine = _planted_place(tmp_path)
    assert IN_PLACE_KINDS == (RUN_OUTPUT, SWEEP_OUTPUT)
    guard_output(mine / "x", "probe", kind=RESULTS_OUTPUT).release()
    with pytest.raises(WorkbenchError, match="lies inside a planted place"):
        guard_output(mine / "x", "probe", kind=RESULTS_OUTPUT, beside=(kind,))


def _guard_state() -> dict[str, str]:
    """{module.name: repr} of every value the output guard's modules hold, containers by their content (after a
    collection: the held locks are weak values that earlier tests' guards leave to the collector)."""
    import gc
    from collections.abc import Mapping

    gc.collect()
    state = {}
    for name, module in sorted(sys.modules.items()):
        if name == "workbench.guard" or name.startswith("workbench.guard."):
            for attr, value in vars(module).items():
                state[f"{name}.{attr}"] = repr(dict(value) if isinstance(value, Mapping) else value)
    return state


def test_declaring_a_kind_changes_no_state_of_the_guard(tmp_path):
    """Declaring an output kind, the run's and the sweep's or one of a user's, is a value and nothing more: the
    guard's modules hold what they held (no registry filled as a side effect)."""
    before = _guard_state()
    kind, _ = _planted_place(tmp_path)
    assert _guard_state() == before


@pytest.mark.slow   # a fresh interpreter: what an import changes is only visible from a clean start
def test_importing_the_places_and_the_writers_changes_no_state_of_the_guard():
    """A fresh interpreter imports the guard alone, then `workbench.places` and the writers that declare an output kind
    without torch (the others declare theirs the same way: `test_declaring_a_kind_changes_no_state_of_the_guard`):
    the guard's modules hold exactly what they held, and the guard loads no torch."""
    code = inspect.getsource(_guard_state) + textwrap.dedent("""
        import sys
        import workbench.guard
        before, torch = _guard_state(), "torch" in sys.modules
        import workbench.places, workbench.plots.export, workbench.plots.prompt_lens, workbench.analysis.claims.ledger
        import workbench.commands.compare, workbench.commands.demo, workbench.commands.report
        import workbench.commands.select_block
        print(_guard_state() == before, torch)
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "True False", out.stdout + out.stderr


def test_every_kind_written_in_place_is_declared_with_the_guard():
    """The guard asks `IN_PLACE_KINDS` whatever the writer hands, so a kind written in place declared in any other
    module of the package would be asked only by the writers that hand it."""
    package = ROOT / "workbench"
    elsewhere = sorted(str(p.relative_to(ROOT)) for p in package.rglob("*.py")
                       if p.parent.name != "guard" and "IN_PLACE" in p.read_text())
    assert elsewhere == []
