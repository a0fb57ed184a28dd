"""The guard's decision on one output (`Guard`) and the function every writer calls first (`guard_output`): what
`--out` may be, what it may replace, and the re-check at the moment of the write or the move."""

from __future__ import annotations

import os
import weakref
from pathlib import Path

from workbench.errors import WorkbenchError
from workbench.guard.in_place import IN_PLACE_KINDS
from workbench.guard.kinds import EVERY_NAME, FILES, IN_PLACE, WHOLE, OutputKind
from workbench.guard.lock import output_lock, training_lock_holder
from workbench.guard.marker import OUTPUT_MARKER, is_workbench_output
from workbench.io import LOCK, clean_stale_staging, replace_dir


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


# resolved directory -> the guard of this process through which its own in-place writer is at work in it (set once
# the guard's decision let it through, dropped at release); a refused guard, whose lock may outlive it, is never here
_WRITING_IN_PLACE: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def _held_here(folder: Path, kind: OutputKind) -> bool:
    """Whether this process is `kind`'s own writer at work in `folder` (resolved): its guard decided and holds it."""
    guard = _WRITING_IN_PLACE.get(str(folder))
    return guard is not None and guard.kind is kind and guard._lock.is_locked


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


# ----------------------------------------------------------------------------- the guard
class Guard:
    """The decision `guard_output` made on one output, and the lock that keeps it true until the command ends."""

    def __init__(self, path, command: str, kind: OutputKind, overwrite: bool, reading, names, resume: bool,
                 beside=()):
        self.path, self.command, self.kind = Path(path), command, kind
        self.overwrite, self.names, self.resume = overwrite, tuple(names), resume
        # the directories written in place that are asked to recognise their own: the kind's own, then `beside`, then
        # the workbench's own (`IN_PLACE_KINDS`), so no writer leaves one out
        self.in_place = tuple(dict.fromkeys(((kind,) if kind.layout == IN_PLACE else ()) + tuple(beside)
                                            + IN_PLACE_KINDS))
        self.reading = [_resolve(Path(r), "input") for r in reading if r is not None]
        self.target = self._check_path()
        self._lock = output_lock(self.target, self.path)
        clean_stale_staging(self.path)
        for name in self.names:
            clean_stale_staging(self.path / name)
        self._decide()
        self.state = self._fingerprint()
        if kind.layout == IN_PLACE:   # its own writer at work in it: only this guard lets outputs inside (`_keep`)
            _WRITING_IN_PLACE[str(self.target)] = self

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
        own writer, holding its guard (a window sweep training its runs, SWEEP/runs/<name>)."""
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
        """Re-runs the decision, under the guard's lock, just before the write: refused if --out changed since."""
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
        """Drops this guard's hold on the lock (the lock goes when no guard of this process holds it)."""
        if _WRITING_IN_PLACE.get(str(self.target)) is self:
            del _WRITING_IN_PLACE[str(self.target)]
        self._lock = _Released

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


class _Released:
    is_locked = False


def guard_output(path: str | os.PathLike, command: str, *, kind: OutputKind, overwrite: bool = False,
                 reading=(), names=(), resume: bool = False, beside=()) -> Guard:
    """The one output guard: decides, before any work, whether `path` may be written or replaced; returns the Guard.

    Args:
        path: the --out given.
        command: the command writing (for messages).
        kind: what the writer writes, declared beside it (`OutputKind`): a directory written whole in a staging
            sibling and moved in (`Guard.commit_dir`), a directory written in place (a training run, a Stage 2
            sweep: new, empty, or with `resume` one to continue), or files (a file, or with `names` those files
            inside the directory `path`).
        overwrite: the command's --overwrite: replace a directory the workbench wrote (marked), or a file of
            the kind's own that exists.
        reading: every input the command reads (checkpoint, run, manifests, battery, spec, results).
        names: for files, the files written inside `path`.
        resume: for a directory written in place, continue the one that is there.
        beside: kinds of directories written in place to ask besides the workbench's own. Those (`IN_PLACE_KINDS`: a
            run and a window sweep, declared in `workbench.guard.in_place`) are always asked, so the workbench's
            writers hand none; this is for a kind declared outside the package, which nothing else makes the guard
            ask. A directory one of them recognises as its own is never replaced nor written into as files, and no
            output takes a name it keeps inside it.
    Refused, as one-line WorkbenchErrors: `..`-only or empty names, a symbolic link, a symlink loop, a
    repository root / home / filesystem root, an output that is, holds or sits inside an input, a path under
    a running training's lock or another workbench process's guard, a non-empty directory the workbench did
    not write (or that a directory written in place recognises as its own), a name such a directory keeps, a file
    the kind's writer did not write. Stale staging siblings of killed writers are removed. The lock is held while
    the Guard lives (`with`, `release`, or the command's end).
    """
    if not isinstance(kind, OutputKind):
        raise TypeError(f"kind {kind!r}: the writer's OutputKind, declared beside its code")
    for other in beside:
        if not isinstance(other, OutputKind) or other.layout != IN_PLACE:
            raise TypeError(f"beside {other!r}: the OutputKind of a directory written in place")
    return Guard(path, command, kind, overwrite, reading, names, resume, beside)

