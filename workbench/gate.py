"""The one output gate every writing command asks before any work: what it refuses and why is in docs/outputs.md.

`gate_output(path, command, kind=...)` decides whether `--out` may be written or replaced, holds a lock on it for
the command's life, and re-checks at the moment of the write or the move (`Gate.recheck`, `Gate.commit_dir`).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import tempfile
import weakref
from pathlib import Path

from workbench.errors import WorkbenchError
from workbench.io import LOCK, clean_stale_staging, replace_dir, write_json_atomic

OUTPUT_MARKER = ".workbench-output"  # in every directory a command writes whole: --overwrite may replace only these


def mark_output(path: Path, command: str) -> None:
    """Marks `path` as a directory `command` wrote, which a later --overwrite may replace."""
    write_json_atomic(Path(path) / OUTPUT_MARKER, {"written_by": f"workbench {command}"})


def check_out_dir(path: Path, overwrite: bool = False, reading=()) -> Path:
    """Checks an output directory as `gate_output` does (kind "dir") without keeping its lock; returns `path`.

    Never replaces what a user owns: `overwrite` applies only to a directory holding the output
    marker (`mark_output`), and a directory that is or holds a path in `reading` is refused whatever
    the flags. Nothing is created in the user's tree here.
    """
    gate_output(path, "write", overwrite=overwrite, reading=reading).release()
    return Path(path)


# ----------------------------------------------------------------------------- the output gate
# Every command that writes asks `gate_output` first, before any work: it decides whether --out may be
# written or replaced, holds a lock on it for the command's life, and re-checks at the moment of the move
# (`Gate.commit_dir`, `Gate.recheck`). tests/test_gate.py enumerates the CLI's commands and fails on a
# writer that does not reach it.

RUN_ENTRIES = ("recipe.toml", "retrofit.json", "trainable.safetensors", "provenance.json", "checkpoints")
SWEEP_PLAN = "sweep.json"   # a Stage 2 block-selection sweep (`select-block --stage2 train`): it holds training runs
PROBE_FILES = ("summary.json", "report.html", OUTPUT_MARKER, LOCK)  # and *.parquet: a probe results directory
FIGURE_SUFFIXES = (".pdf", ".svg", ".png", ".html", ".csv", ".js")  # what `workbench figures` writes in its folders
_HELD: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # resolved target -> this process's _PathLock


def lock_dir() -> Path:
    """Where the gate's locks live: outside the user's tree, so a refused command writes nothing there."""
    return Path(tempfile.gettempdir()) / f"workbench-locks-{os.getuid()}"


class _PathLock:
    """An exclusive flock keyed by a resolved path; released (and its file removed) when the last holder drops it."""

    def __init__(self, target: Path, shown: Path):
        folder = lock_dir()
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.file = folder / (hashlib.sha256(str(target).encode()).hexdigest()[:32] + ".lock")
        self.handle = open(self.file, "a+")
        try:
            fcntl.flock(self.handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if not self.file.exists() or os.stat(self.file).st_ino != os.fstat(self.handle.fileno()).st_ino:
                raise BlockingIOError
        except BlockingIOError:
            self.handle.seek(0)
            holder = self.handle.read().strip() or "unknown"
            self.handle.close()
            self.handle = None
            raise WorkbenchError(f"output '{shown}' is being written by another workbench process (pid {holder}); "
                                 "wait for it to end or choose another --out") from None
        self.handle.seek(0)
        self.handle.truncate()
        self.handle.write(f"{os.getpid()}\n")
        self.handle.flush()

    def release(self) -> None:
        if self.handle is not None:
            self.file.unlink(missing_ok=True)  # while still held: whoever opens it next finds a new file
            self.handle.close()
            self.handle = None

    def __del__(self):
        self.release()


def training_lock_holder(path: Path) -> tuple[Path, str] | None:
    """(the directory, the pid) of a training lock (`locked_dir`'s `.lock`) held on `path` or above it, else None."""
    for folder in (path, *path.parents):
        lock = folder / LOCK
        if not lock.is_file():
            continue
        try:
            with open(lock) as handle:
                try:
                    fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
                except BlockingIOError:
                    return folder, handle.read().strip() or "unknown"
        except OSError:
            continue
    return None


def safe_child(root: str | os.PathLike, name: str, what: str) -> Path:
    """`root / name` for a `name` taken from a file's content, refused when absolute, holding `..`, or empty.

    Raises:
        WorkbenchError: the name would place a file outside `root`.
    """
    text = str(name)
    parts = Path(text).parts
    if (not text.strip() or Path(text).is_absolute() or ".." in parts or "\x00" in text or text.startswith("~")
            or os.path.normpath(text) == "."):  # "." or "a/.." would name `root` itself
        raise WorkbenchError(f"{what} {text!r} must be a plain relative name (no '..', no absolute path): it names "
                             "where a file is written")
    return Path(root) / text


def _ours_file(path: Path) -> bool:
    """Whether the file at `path` is one the workbench wrote (recognized by its content)."""
    try:
        head = path.read_bytes()[:1 << 16] if path.suffix != ".html" else path.read_bytes()  # a report is a few MB
    except OSError:
        return False
    name = path.name
    marker = path.parent / OUTPUT_MARKER
    if path.suffix in FIGURE_SUFFIXES and marker.is_file() and b"workbench figures" in marker.read_bytes()[:200]:
        return True
    if name.endswith(".html"):
        return b"name='generator' content='workbench" in head or b"id='render-status'" in head or \
            b"<title>Claims ledger</title>" in head
    if name == "LEDGER.md":
        return head.startswith(b"# Claims ledger") or b"workbench claims" in head
    if name in ("ledger.json", "compare.json") or name.endswith(".manifest.json"):
        try:
            value = json.loads(path.read_bytes())
        except (OSError, ValueError):
            return False
        if name == "ledger.json":
            return isinstance(value, list) and all(isinstance(r, dict) and "verdict" in r for r in value)
        if name == "compare.json":
            return isinstance(value, dict) and {"a", "b", "depths"} <= set(value)
        return isinstance(value, dict) and "rows_sha256" in value
    if name == "compare.parquet":
        return (path.parent / "compare.json").is_file() and _ours_file(path.parent / "compare.json")
    if name.endswith(".jsonl"):  # a manifest: ours with its sidecar
        return _ours_file(path.with_name(path.name[:-len(".jsonl")] + ".manifest.json"))
    return False


def dir_inputs(*folders, exclude=()) -> list[Path]:
    """The files of each results directory in `folders` (None skipped), except names in `exclude`: a command's inputs."""
    return [p for f in folders if f is not None and Path(f).is_dir() for p in Path(f).iterdir()
            if p.name not in exclude and p.name not in (OUTPUT_MARKER, LOCK)]


def _holds_run(path: Path) -> bool:
    """Whether `path` is a training run, or a Stage 2 sweep (whose runs lie under it): never replaced."""
    return any((path / name).exists() for name in (*RUN_ENTRIES, SWEEP_PLAN))


def is_workbench_output(path: Path) -> bool:
    """Whether `path` holds the output marker, or is a probe results directory written before the marker
    existed (only a probe's own files: *.parquet, summary.json whose created_by names the workbench, report.html).
    A directory holding a training run is never one, marker or not."""
    path = Path(path)
    if _holds_run(path):
        return False
    if (path / OUTPUT_MARKER).is_file():
        return True
    try:
        created_by = json.loads((path / "summary.json").read_text()).get("created_by", "")
    except (OSError, ValueError, AttributeError):
        return False
    return str(created_by).startswith("workbench") and all(
        p.is_file() and not p.is_symlink() and (p.suffix == ".parquet" or p.name in PROBE_FILES)
        for p in path.iterdir())


def _resolve(path: Path, what: str) -> Path:
    try:
        return Path(os.path.abspath(path.expanduser())).resolve()
    except (RuntimeError, OSError) as err:  # a symlink loop on the way
        raise WorkbenchError(f"{what} '{path}' cannot be resolved ({type(err).__name__}: a symlink loop?)") from None


def _repository_root(target: Path) -> bool:
    return (target / ".git").exists() or target == Path(target.anchor) or target == _resolve(Path.home(), "home")


class Gate:
    """The decision `gate_output` made on one output, and the lock that keeps it true until the command ends."""

    def __init__(self, path, command: str, kind: str, overwrite: bool, reading, names, resume: bool):
        self.path, self.command, self.kind = Path(path), command, kind
        self.overwrite, self.names, self.resume = overwrite, tuple(names), resume
        self.reading = [_resolve(Path(r), "input") for r in reading if r is not None]
        self.target = self._check_path()
        key = str(self.target)
        lock = _HELD.get(key)
        if lock is None:
            lock = _PathLock(self.target, self.path)
            _HELD[key] = lock
        self._lock = lock
        clean_stale_staging(self.path)
        for name in self.names:
            clean_stale_staging(self.path / name)
        self._decide()
        self.state = self._fingerprint()

    # ---------------------------------------------------------------- the checks
    def _check_path(self) -> Path:
        p = self.path
        if p.name in ("", ".", "..") or str(p).endswith(("/.", "/..")):
            raise WorkbenchError(f"--out '{p}' names no new file or directory (give a name such as results/run1)")
        if p.is_symlink():
            raise WorkbenchError(f"--out '{p}' is a symbolic link; give the path itself (the workbench never "
                                 "writes through a link)")
        target = _resolve(p, "--out")
        if _repository_root(target):
            raise WorkbenchError(f"--out '{p}' is a repository root, the home directory or a filesystem root; "
                                 "choose a directory inside it")
        return target

    def _outputs(self) -> list[Path]:
        return [self.target / n for n in self.names] if self.names else [self.target]

    def _decide(self) -> None:
        p, target = self.path, self.target
        for out in self._outputs():
            above = next((a for a in out.parents if a.exists() and not a.is_dir()), None)
            if above is not None:
                raise WorkbenchError(f"--out '{p}' lies under '{above}', which is a file")
            if out.parent.is_dir() and _holds_run(out.parent) and out.name in (*RUN_ENTRIES, "metrics.jsonl", LOCK):
                raise WorkbenchError(f"--out '{p}' names a training run's own file or directory; choose another name")
            for read in self.reading:
                # An output inside a run it reads is allowed (keepers hold their battery results, RUN/battery),
                # but never the input itself nor a directory that holds it.
                if read == out or out in read.parents:
                    if self.kind == "dir":
                        raise WorkbenchError(f"output directory '{p}' holds '{read}', which this command reads; "
                                             "choose another output directory")
                    raise WorkbenchError(f"--out '{p}' would replace '{read}', which this command reads; "
                                         "choose another output")
        held = training_lock_holder(target)
        if held is not None:
            folder, pid = held
            raise WorkbenchError(f"run directory '{p if folder == target else folder}' is in use by another process "
                                 f"(pid {pid}): a training run in progress; wait for it to end or choose another --out")
        if self.kind == "file":
            self._decide_files()
        elif self.kind == "run":
            self._decide_run()
        elif self.kind == "sweep":
            self._decide_sweep()
        else:
            self._decide_dir()

    def _decide_files(self) -> None:
        p = self.path
        if self.names:
            if p.exists() and not p.is_dir():
                raise WorkbenchError(f"--out '{p}' exists and is not a directory")
            if p.is_dir() and _holds_run(p):
                raise WorkbenchError(f"--out '{p}' holds a training run; write its outputs elsewhere")
        for out, shown in zip(self._outputs(), [p / n for n in self.names] or [p]):
            if shown.is_symlink():
                raise WorkbenchError(f"'{shown}' is a symbolic link; the workbench never writes through a link")
            if out.is_dir():
                raise WorkbenchError(f"--out '{shown}' is a directory; give a file path")
            if out.exists():
                if not _ours_file(out):
                    raise WorkbenchError(f"'{shown}' exists and the workbench did not write it; choose another "
                                         "--out (nothing a user owns is replaced)")
                if not self.overwrite:
                    raise WorkbenchError(f"--out: '{shown}' already exists; choose another file, or pass "
                                         "--overwrite to replace it")

    def _decide_run(self) -> None:
        p = self.path
        if p.exists() and not p.is_dir():
            raise WorkbenchError(f"run directory '{p}' exists and is not a directory")
        if not p.is_dir():
            return
        entries = [e.name for e in p.iterdir() if e.name != LOCK]
        if not entries:
            return
        if not (p / "recipe.toml").is_file():
            raise WorkbenchError(f"run directory '{p}' is not empty and holds no run (no recipe.toml); training "
                                 "writes only into a new or empty directory or a run it can resume")
        if not self.resume:
            raise WorkbenchError(f"run directory '{p}' already holds a run; pass --resume or another --out")

    def _decide_sweep(self) -> None:
        p = self.path
        if p.exists() and not p.is_dir():
            raise WorkbenchError(f"output '{p}' exists and is not a directory")
        if not p.is_dir() or not any(e.name != LOCK for e in p.iterdir()):
            if self.resume:
                raise WorkbenchError(f"--resume: '{p}' holds no Stage 2 sweep to continue; drop --resume to start one")
            return
        if not (p / SWEEP_PLAN).is_file():
            raise WorkbenchError(f"output directory '{p}' is not empty and holds no Stage 2 sweep ({SWEEP_PLAN}); a "
                                 "sweep writes into a new or empty directory or one it can resume")
        if not self.resume:
            raise WorkbenchError(f"output directory '{p}' holds a Stage 2 sweep; pass --resume to continue it "
                                 "or choose another --out (its training runs are never replaced)")

    def _decide_dir(self) -> None:
        p = self.path
        if p.exists() and not p.is_dir():
            raise WorkbenchError(f"output '{p}' exists and is not a directory")
        if p.is_dir() and any(e.name != LOCK for e in p.iterdir()):
            if _holds_run(p):
                raise WorkbenchError(f"output directory '{p}' holds a training run; it is never replaced (choose "
                                     "another output directory)")
            if not self.overwrite:
                raise WorkbenchError(f"output directory '{p}' exists and is not empty; pass --overwrite to replace it")
            if not is_workbench_output(p):
                raise WorkbenchError(f"--overwrite replaces only a directory the workbench wrote (marked "
                                     f"{OUTPUT_MARKER}); '{p}' is not one: choose a new output directory")

    def _fingerprint(self):
        def one(path: Path):
            try:
                st = os.lstat(path)
            except OSError:
                return None
            return (st.st_ino, st.st_mtime_ns, st.st_size if not path.is_dir() else None)
        return [one(o) for o in self._outputs()]

    # ---------------------------------------------------------------- at the moment of writing
    def recheck(self) -> None:
        """Re-runs the decision, under the gate's lock, just before the write: refused if --out changed since."""
        if self._lock.handle is None:
            raise WorkbenchError(f"the lock on '{self.path}' was released before the write")
        if self.path.is_symlink() or _resolve(self.path, "--out") != self.target:
            raise WorkbenchError(f"--out '{self.path}' became a symbolic link while this command ran; nothing written")
        if self._fingerprint() != self.state:
            raise WorkbenchError(f"--out '{self.path}' changed while this command ran (another writer?); nothing "
                                 "was replaced, run it again")
        self._decide()

    def wrote(self) -> None:
        """Records the command's own writes, so that a later `recheck` compares against them."""
        self.state = self._fingerprint()

    def commit_dir(self, staging: Path) -> None:
        """Re-checks, then moves a fully written staging directory onto --out (`replace_dir`)."""
        self.recheck()
        replace_dir(staging, self.path)
        self.state = self._fingerprint()

    def release(self) -> None:
        """Drops this gate's hold on the lock (the lock goes when no gate of this process holds it)."""
        self._lock = _Released

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


class _Released:
    handle = None


def gate_output(path: str | os.PathLike, command: str, *, kind: str = "dir", overwrite: bool = False,
                reading=(), names=(), resume: bool = False) -> Gate:
    """The one output gate: decides, before any work, whether `path` may be written or replaced; returns the Gate.

    Args:
        path: the --out given.
        command: the command writing (for messages).
        kind: "dir" (a directory written whole in a staging sibling and moved in, `Gate.commit_dir`),
            "run" (a training run directory: new, empty, or with `resume` a run), or "file" (a file, or with
            `names` those files inside the directory `path`).
        overwrite: the command's --overwrite: replace a directory the workbench wrote (marked), or a file of
            its own that exists.
        reading: every input the command reads (checkpoint, run, manifests, battery, spec, results).
        names: for kind="file", the files written inside `path`.
        resume: for kind="run", continue a run that is there; for kind="sweep" (a directory of training runs
            written in place, `select-block --stage2 train`), continue the sweep that is there.
    Refused, as one-line WorkbenchErrors: `..`-only or empty names, a symbolic link, a symlink loop, a
    repository root / home / filesystem root, an output that is, holds or sits inside an input, a path under
    a running training's lock or another workbench process's gate, a non-empty directory the workbench did
    not write (or that holds a run), a file the workbench did not write. Stale staging siblings of killed
    writers are removed. The lock is held while the Gate lives (`with`, `release`, or the command's end).
    """
    if kind not in ("dir", "run", "file", "sweep"):
        raise ValueError(f"kind {kind!r}")
    return Gate(path, command, kind, overwrite, reading, names, resume)
