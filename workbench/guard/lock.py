"""The locks the guard reads: its own on each output, held for the command's life, and a training run's on its
directory. Both are `workbench.io.HeldLock`, filelock's flock with the holder's pid written in it."""

from __future__ import annotations

import hashlib
import os
import tempfile
import weakref
from pathlib import Path

from workbench.errors import WorkbenchError
from workbench.io import LOCK, HeldLock, lock_holder

_HELD: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # resolved target -> this process's lock


def lock_dir() -> Path:
    """Where the guard's locks live: outside the user's tree, so a refused command writes nothing there."""
    return Path(tempfile.gettempdir()) / f"workbench-locks-{os.getuid()}"


def output_lock(target: Path, shown: Path) -> HeldLock:
    """This process's exclusive lock on the resolved output `target` (`HeldLock`, in `lock_dir`), taken if no guard of
    this process holds it yet; released when the last guard holding it drops it.

    Raises:
        WorkbenchError: another process holds it (`shown` is the --out given).
    """
    lock = _HELD.get(str(target))
    if lock is None:
        file = output_lock_file(target)
        file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        lock = HeldLock(file, lambda holder: WorkbenchError(f"output '{shown}' is being written by another workbench "
                                                            f"process (pid {holder}); wait for it to end or choose "
                                                            "another --out"))
        _HELD[str(target)] = lock
    return lock


def output_lock_file(target: Path) -> Path:
    """The file of the lock on the resolved output `target`: in `lock_dir`, named by the path's SHA-256."""
    return lock_dir() / (hashlib.sha256(str(target).encode()).hexdigest()[:32] + ".lock")


def training_lock_holder(path: Path) -> tuple[Path, str] | None:
    """(the directory, the pid) of a training lock (`locked_dir`'s `.lock`) held on `path` or above it, else None."""
    return next(((folder, pid) for folder in (path, *path.parents) if (pid := lock_holder(folder / LOCK)) is not None),
                None)
