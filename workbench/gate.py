"""The one output gate every writing command asks before any work: what it refuses and why is in docs/outputs.md.

`gate_output(path, command, kind=...)` decides whether `--out` may be written or replaced, holds a lock on it for
the command's life, and re-checks at the moment of the write or the move (`Gate.recheck`, `Gate.commit_dir`).
tests/test_gate.py enumerates the CLI's commands and fails on a writer that does not reach it.

The gate knows no writer's files and imports no writer (tests/test_imports.py). Each writer declares what it
writes as an `OutputKind` beside the code that writes it (probe results in `workbench.probes.battery`, the
figures in `workbench.plots.export`, a run and a sweep in `workbench.places`, ...) and hands it to the gate: how
its output is laid out (a directory written whole, a directory written in place and continued, or files), how to
tell an output of its own, and, for a directory written in place, which names inside it are its own and the words
of its refusals.

The directories written in place (a training run, a window sweep) are declared once, in `workbench.places`, and
declaring such a kind registers it here (`OutputKind.__post_init__`, `in_place_kinds`): the gate asks every
registered one to recognise its own directory, whatever the writer and whatever it hands, so that directory is never
replaced, nor written into under a name it keeps, and no writer can forget a kind. Registering at declaration rather
than by an explicit call means a new in-place kind cannot be declared and left unregistered; `workbench/__init__.py`
imports `workbench.places`, so the package's kinds are registered before any gate runs whatever a user imported. A
kind declared outside the package registers the same way when its module is imported; `beside` (`gate_output`) is
left for such a kind a writer wants asked even before that.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import tempfile
import weakref
from collections.abc import Callable, Container
from dataclasses import dataclass
from pathlib import Path

from workbench.errors import WorkbenchError
from workbench.io import LOCK, HeldLock, clean_stale_staging, replace_dir, write_json_atomic

OUTPUT_MARKER = ".workbench-output"  # in every directory a command writes whole: --overwrite may replace only these


def mark_output(path: Path, command: str) -> None:
    """Marks `path` as a directory `command` wrote, which a later --overwrite may replace."""
    write_json_atomic(Path(path) / OUTPUT_MARKER, {"written_by": f"workbench {command}"})


def marked_by(path: Path, command: str) -> bool:
    """Whether directory `path` holds the output marker of `command` (`mark_output(path, command)`)."""
    marker = Path(path) / OUTPUT_MARKER
    try:
        return marker.is_file() and f"workbench {command}".encode() in marker.read_bytes()[:200]
    except OSError:
        return False


# ----------------------------------------------------------------------------- what a writer declares
WHOLE = "whole"          # a directory written whole in a staging sibling and moved in (`Gate.commit_dir`)
IN_PLACE = "in place"    # a directory written where it stands and continued with --resume (a run, a sweep)
FILES = "files"          # a file, or the files `names` inside the directory --out


class _EveryName(Container):
    """The `keeps` of a directory written in place that no other output may be written into."""

    def __contains__(self, name) -> bool:
        return True

    def __repr__(self) -> str:
        return "EVERY_NAME"


EVERY_NAME = _EveryName()


@dataclass(frozen=True)
class Continued:
    """A directory written in place: how it is recognised and continued, what it keeps from other writers, and the
    refusals in its writer's words ('{p}' is --out).

    Attributes:
        entry: what a directory holds when it is one of these, to be continued (a run's recipe, a sweep's plan).
        what: how another writer's refusals name it ("a training run").
        keeps: the names inside it that no other output takes (EVERY_NAME: nothing else is written into it).
        not_a_directory: --out exists and is not a directory.
        holds_another: --out is not empty and lacks `entry`.
        holds_one: --out holds one and --resume was not given.
        nothing_to_resume: --resume on a new or empty directory; None when that starts a new one.
    """

    entry: str
    what: str
    keeps: Container[str]
    not_a_directory: str
    holds_another: str
    holds_one: str
    nothing_to_resume: str | None = None


# Every kind of directory written in place declared so far, in declaration order (`OutputKind.__post_init__`). Held
# weakly: a kind is asked while something holds it (a module declaring it holds it for good), and one built for a
# moment (a test's) does not outlive its use.
_DECLARED_IN_PLACE: list[weakref.ref] = []


def in_place_kinds() -> tuple[OutputKind, ...]:
    """Every declared kind of directory written in place (layout IN_PLACE), in declaration order: the kinds every gate
    asks to recognise their own directory. The workbench's own are declared in `workbench.places`, which
    `import workbench` imports."""
    _DECLARED_IN_PLACE[:] = [ref for ref in _DECLARED_IN_PLACE if ref() is not None]
    return tuple(k for ref in _DECLARED_IN_PLACE if (k := ref()) is not None)


@dataclass(frozen=True)
class OutputKind:
    """What one writer writes, declared beside the code that writes it and handed to `gate_output`.

    Attributes:
        name: the kind (run, sweep, results, figures, report, ...), for reading.
        layout: WHOLE, IN_PLACE or FILES.
        owns: whether an existing path is this writer's own, told from its content (never from the marker alone):
            for FILES, a file this writer wrote (only such a file is replaced); for WHOLE, a directory it wrote
            before the output marker existed; for IN_PLACE, a directory of its own, continued or finished (what
            no other writer replaces: every gate asks each declared IN_PLACE kind). None: nothing.
        continued: for IN_PLACE, how the directory is continued and what it keeps (`Continued`).
    """

    name: str
    layout: str = WHOLE
    owns: Callable[[Path], bool] | None = None
    continued: Continued | None = None

    def __post_init__(self):
        if self.layout not in (WHOLE, IN_PLACE, FILES):
            raise ValueError(f"output kind {self.name!r}: layout {self.layout!r}")
        if (self.layout == IN_PLACE) != (self.continued is not None):
            raise ValueError(f"output kind {self.name!r}: `continued` goes with layout IN_PLACE, and only with it")
        if self.layout == IN_PLACE:  # declared is registered: every gate asks it (`in_place_kinds`)
            _DECLARED_IN_PLACE.append(weakref.ref(self))

    def wrote(self, path: Path) -> bool:
        """Whether this writer's `owns` recognises `path` as its own (never without an `owns`)."""
        return self.owns is not None and bool(self.owns(Path(path)))


def is_workbench_output(path: Path, kind: OutputKind) -> bool:
    """Whether directory `path` holds the output marker, or is one `kind` wrote before the marker existed
    (`kind.owns`): what --overwrite may replace, unless a directory written in place recognises it as its own."""
    return (Path(path) / OUTPUT_MARKER).is_file() or kind.wrote(path)


def dir_inputs(*folders, exclude=()) -> list[Path]:
    """The files of each results directory in `folders` (None skipped), except names in `exclude`: a command's inputs."""
    return [p for f in folders if f is not None and Path(f).is_dir() for p in Path(f).iterdir()
            if p.name not in exclude and p.name not in (OUTPUT_MARKER, LOCK)]


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


# ----------------------------------------------------------------------------- locks
_HELD: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # resolved target -> this process's lock


def lock_dir() -> Path:
    """Where the gate's locks live: outside the user's tree, so a refused command writes nothing there."""
    return Path(tempfile.gettempdir()) / f"workbench-locks-{os.getuid()}"


def _path_lock(target: Path, shown: Path) -> HeldLock:
    """The exclusive lock keyed by a resolved path (`HeldLock`), in `lock_dir`; released when the last gate drops it."""
    folder = lock_dir()
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    file = folder / (hashlib.sha256(str(target).encode()).hexdigest()[:32] + ".lock")
    return HeldLock(file, lambda holder: WorkbenchError(f"output '{shown}' is being written by another workbench "
                                                        f"process (pid {holder}); wait for it to end or choose "
                                                        "another --out"))


# resolved directory -> the gate of this process through which its own in-place writer is at work in it (set once
# the gate's decision let it through, dropped at release); a refused gate, whose lock may outlive it, is never here
_WRITING_IN_PLACE: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def _held_here(folder: Path, kind: OutputKind) -> bool:
    """Whether this process is `kind`'s own writer at work in `folder` (resolved): its gate decided and holds it."""
    gate = _WRITING_IN_PLACE.get(str(folder))
    return gate is not None and gate.kind is kind and gate._lock.is_locked


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


def _resolve(path: Path, what: str) -> Path:
    try:
        return Path(os.path.abspath(path.expanduser())).resolve()
    except (RuntimeError, OSError) as err:  # a symlink loop on the way
        raise WorkbenchError(f"{what} '{path}' cannot be resolved ({type(err).__name__}: a symlink loop?)") from None


def _repository_root(target: Path) -> bool:
    return (target / ".git").exists() or target == Path(target.anchor) or target == _resolve(Path.home(), "home")


def _head(path: Path) -> bytes:
    try:
        return path.read_bytes()[:200] if path.is_file() else b""
    except OSError:
        return b""


def _empty(path: Path) -> bool:
    return not any(e.name != LOCK for e in path.iterdir())


# ----------------------------------------------------------------------------- the gate
class Gate:
    """The decision `gate_output` made on one output, and the lock that keeps it true until the command ends."""

    def __init__(self, path, command: str, kind: OutputKind, overwrite: bool, reading, names, resume: bool,
                 beside=()):
        self.path, self.command, self.kind = Path(path), command, kind
        self.overwrite, self.names, self.resume = overwrite, tuple(names), resume
        # the directories written in place that are asked to recognise their own: the kind's own, then `beside`, then
        # every declared one (`in_place_kinds`), so no writer leaves one out
        self.in_place = tuple(dict.fromkeys(((kind,) if kind.layout == IN_PLACE else ()) + tuple(beside)
                                            + in_place_kinds()))
        self.reading = [_resolve(Path(r), "input") for r in reading if r is not None]
        self.target = self._check_path()
        key = str(self.target)
        lock = _HELD.get(key)
        if lock is None:
            lock = _path_lock(self.target, self.path)
            _HELD[key] = lock
        self._lock = lock
        clean_stale_staging(self.path)
        for name in self.names:
            clean_stale_staging(self.path / name)
        self._decide()
        self.state = self._fingerprint()
        if kind.layout == IN_PLACE:   # its own writer at work in it: only this gate lets outputs inside (`_keep`)
            _WRITING_IN_PLACE[key] = self

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

    def _kept(self, path: Path) -> OutputKind | None:
        """The kind, of those asked (`in_place`) other than the writer's own, that recognises directory `path`."""
        return next((k for k in self.in_place if k is not self.kind and k.wrote(path)), None)

    def _keep(self, out: Path) -> None:
        """Refused when a directory anywhere above `out` is one written in place (`in_place`) that keeps the name on
        the way down to `out` (a run's checkpoints/, anything in a sweep), unless this process is that directory's
        own writer, holding its gate (a window sweep training its runs, SWEEP/runs/<name>)."""
        child = out
        for folder in out.parents:
            keeper = folder.is_dir() and next((k for k in self.in_place if child.name in k.continued.keeps
                                               and k.wrote(folder)), None)
            if keeper and not _held_here(folder, keeper):
                inside = "" if folder == out.parent else f" ('{child.name}' of '{folder}')"
                if keeper.continued.keeps is EVERY_NAME:
                    raise WorkbenchError(f"--out '{self.path}' lies inside {keeper.continued.what}{inside}, which no "
                                         "other output writes into; choose another place")
                raise WorkbenchError(f"--out '{self.path}' names {keeper.continued.what}'s own file or directory"
                                     f"{inside}; choose another name")
            child = folder

    def _decide(self) -> None:
        """The rules every output obeys, then those of its kind's layout."""
        p, target = self.path, self.target
        if self.names:  # files written inside --out: --out itself is a name the directory above it may keep
            self._keep(target)
        for out in self._outputs():
            above = next((a for a in out.parents if a.exists() and not a.is_dir()), None)
            if above is not None:
                raise WorkbenchError(f"--out '{p}' lies under '{above}', which is a file")
            self._keep(out)
            for read in self.reading:
                # An output inside a run it reads is allowed (keepers hold their battery results, RUN/battery),
                # but never the input itself nor a directory that holds it.
                if read == out or out in read.parents:
                    if self.kind.layout == WHOLE:
                        raise WorkbenchError(f"output directory '{p}' holds '{read}', which this command reads; "
                                             "choose another output directory")
                    raise WorkbenchError(f"--out '{p}' would replace '{read}', which this command reads; "
                                         "choose another output")
        held = training_lock_holder(target)
        if held is not None:
            folder, pid = held
            raise WorkbenchError(f"run directory '{p if folder == target else folder}' is in use by another process "
                                 f"(pid {pid}): a training run in progress; wait for it to end or choose another --out")
        {FILES: self._files, IN_PLACE: self._in_place, WHOLE: self._directory}[self.kind.layout]()

    def _files(self) -> None:
        """Files: each replaced only when its kind's writer wrote it, and only with --overwrite; files named inside
        --out go into a directory that is new or empty, the workbench's, or one they are written beside."""
        p = self.path
        if self.names:
            if p.exists() and not p.is_dir():
                raise WorkbenchError(f"--out '{p}' exists and is not a directory")
            keeper = p.is_dir() and self._kept(p)
            if keeper:
                raise WorkbenchError(f"--out '{p}' holds {keeper.continued.what}; write its outputs elsewhere")
        for out, shown in zip(self._outputs(), [p / n for n in self.names] or [p]):
            if shown.is_symlink():
                raise WorkbenchError(f"'{shown}' is a symbolic link; the workbench never writes through a link")
            if out.is_dir():
                raise WorkbenchError(f"--out '{shown}' is a directory; give a file path")
            if out.exists():
                if not self.kind.wrote(out):
                    raise WorkbenchError(f"'{shown}' exists and the workbench did not write it; choose another "
                                         "--out (nothing a user owns is replaced)")
                if not self.overwrite:
                    raise WorkbenchError(f"--out: '{shown}' already exists; choose another file, or pass "
                                         "--overwrite to replace it")
        foreign = self.names and p.is_dir() and self._foreign(self.target)
        if foreign:
            raise WorkbenchError(f"--out '{p}' holds '{foreign.name}', which {self.command} did not write; write its "
                                 "files into a new or empty directory, or one the workbench wrote")

    def _foreign(self, folder: Path) -> Path | None:
        """The first entry of `folder` that is neither the kind's own nor read by this command (a comparison is
        written beside the results it reads), unless `folder` carries a command's output marker."""
        if b'"written_by": "workbench ' in _head(folder / OUTPUT_MARKER):
            return None
        return next((e for e in sorted(folder.iterdir()) if e.name not in (OUTPUT_MARKER, LOCK)
                     and e not in self.reading and not self.kind.wrote(e)), None)

    def _in_place(self) -> None:
        """A directory written in place: new, empty, or (with --resume) one of its kind to continue."""
        p, words = self.path, self.kind.continued
        if p.exists() and not p.is_dir():
            raise WorkbenchError(words.not_a_directory.format(p=p))
        if not p.is_dir() or _empty(p):
            if self.resume and words.nothing_to_resume is not None:
                raise WorkbenchError(words.nothing_to_resume.format(p=p))
            return
        if not (p / words.entry).is_file():
            raise WorkbenchError(words.holds_another.format(p=p))
        if not self.resume:
            raise WorkbenchError(words.holds_one.format(p=p))

    def _directory(self) -> None:
        """A directory written whole: new, empty, or (with --overwrite) one the workbench wrote."""
        p = self.path
        if p.exists() and not p.is_dir():
            raise WorkbenchError(f"output '{p}' exists and is not a directory")
        if p.is_dir() and not _empty(p):
            keeper = self._kept(p)
            if keeper:
                raise WorkbenchError(f"output directory '{p}' holds {keeper.continued.what}; it is never replaced "
                                     "(choose another output directory)")
            if not self.overwrite:
                raise WorkbenchError(f"output directory '{p}' exists and is not empty; pass --overwrite to replace it")
            if not is_workbench_output(p, self.kind):
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
        if not self._lock.is_locked:
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
        if _WRITING_IN_PLACE.get(str(self.target)) is self:
            del _WRITING_IN_PLACE[str(self.target)]
        self._lock = _Released

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


class _Released:
    is_locked = False


def gate_output(path: str | os.PathLike, command: str, *, kind: OutputKind, overwrite: bool = False,
                reading=(), names=(), resume: bool = False, beside=()) -> Gate:
    """The one output gate: decides, before any work, whether `path` may be written or replaced; returns the Gate.

    Args:
        path: the --out given.
        command: the command writing (for messages).
        kind: what the writer writes, declared beside it (`OutputKind`): a directory written whole in a staging
            sibling and moved in (`Gate.commit_dir`), a directory written in place (a training run, a window
            sweep: new, empty, or with `resume` one to continue), or files (a file, or with `names` those files
            inside the directory `path`).
        overwrite: the command's --overwrite: replace a directory the workbench wrote (marked), or a file of
            the kind's own that exists.
        reading: every input the command reads (checkpoint, run, manifests, battery, spec, results).
        names: for files, the files written inside `path`.
        resume: for a directory written in place, continue the one that is there.
        beside: kinds of directories written in place to ask besides the declared ones. Every declared kind
            (`in_place_kinds`: a run and a window sweep, declared in `workbench.places`) is always asked, so the
            workbench's writers hand none; this is for a kind declared outside the package whose module may not
            have been imported yet. A directory one of them recognises as its own is never replaced nor written
            into as files, and no output takes a name it keeps inside it.
    Refused, as one-line WorkbenchErrors: `..`-only or empty names, a symbolic link, a symlink loop, a
    repository root / home / filesystem root, an output that is, holds or sits inside an input, a path under
    a running training's lock or another workbench process's gate, a non-empty directory the workbench did
    not write (or that a directory written in place recognises as its own), a name such a directory keeps, a file
    the kind's writer did not write. Stale staging siblings of killed writers are removed. The lock is held while
    the Gate lives (`with`, `release`, or the command's end).
    """
    if not isinstance(kind, OutputKind):
        raise TypeError(f"kind {kind!r}: the writer's OutputKind, declared beside its code")
    for other in beside:
        if not isinstance(other, OutputKind) or other.layout != IN_PLACE:
            raise TypeError(f"beside {other!r}: the OutputKind of a directory written in place")
    return Gate(path, command, kind, overwrite, reading, names, resume, beside)
