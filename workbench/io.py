"""Small file helpers every writer uses: atomic writes, hashing, directory locks.

Nothing is half-written: each file goes to a temporary name in the same directory, is fsynced
and `os.replace`d into place, so a killed process leaves either the old file or the new one.
`atomic_path` is that one mechanism; the write_*_atomic helpers and every writer that hands a
path to a library (parquet, safetensors) go through it. A whole directory is written into a
hidden staging sibling and moved in (`replace_dir`); what a killed writer left of either is
removed by `clean_stale_staging`.

Reading JSON and TOML files is `workbench.readers`; the output guard every writing command asks
before any work is `workbench.guard`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout, lock_descriptor

from workbench.errors import WorkbenchError


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yields a temporary path beside `path` to write one file to; on success it is fsynced and
    `os.replace`d onto `path`, on an exception it is removed and `path` is left as it was.

        with atomic_path(out / "table.parquet") as tmp:
            frame.to_parquet(tmp, index=False)
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        yield tmp
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # a library may create its file 0600 (safetensors): the user's umask decides
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Writes `data` to `path` atomically (`atomic_path`)."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_text_atomic(path: Path, text: str) -> None:
    """Writes UTF-8 `text` atomically."""
    write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: Path, obj, indent: int | None = 2) -> None:
    """Writes `obj` as JSON (sorted keys, trailing newline) atomically."""
    write_text_atomic(path, json.dumps(obj, indent=indent, sort_keys=True, default=str) + "\n")


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """SHA-256 hex digest of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def sha256_bytes(data: bytes) -> str:
    """SHA-256 hex digest of bytes."""
    return hashlib.sha256(data).hexdigest()


LOCK = ".lock"


class HeldLock:
    """An exclusive lock on `file`, taken at once, with this process's pid written in it; its file goes on release.

    A process asking for a held lock is refused at once: `refused(the holder's pid)` is raised. The lock is
    filelock's flock, so a killed holder never leaves it stale. Its file is removed while still held, so whoever opens
    it next makes a new one (filelock does not let through a process that locked the removed file as it went).
    """

    def __init__(self, file: Path, refused: Callable[[str], WorkbenchError]):
        self.file = Path(file)
        self._lock = FileLock(self.file, timeout=0, thread_local=False, on_acquired=_write_pid)
        try:
            self._lock.acquire()
        except Timeout:
            try:
                holder = self.file.read_text().strip()
            except OSError:   # released and removed as we read
                holder = ""
            raise refused(holder or "unknown") from None

    @property
    def is_locked(self) -> bool:
        return self._lock.is_locked

    def release(self) -> None:
        if self._lock.is_locked:
            self.file.unlink(missing_ok=True)
            self._lock.release()

    def __del__(self):
        if "_lock" in self.__dict__:
            self.release()


def _write_pid(fd: int) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)


def lock_holder(file: Path) -> str | None:
    """The pid written in `file` while a `HeldLock` on it is held, else None (no file, or a killed holder's file).

    Asked with filelock's own primitive on a descriptor opened for reading, so the probe creates nothing, and a
    lock held by this process through another `HeldLock` counts as held.
    """
    try:
        fd = os.open(file, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)   # never through a link, never waiting on a fifo
    except OSError:
        return None
    try:
        if lock_descriptor(fd, blocking=False):
            return None   # nobody holds it: closing the descriptor lets it go
        return os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
    finally:
        os.close(fd)


@contextmanager
def locked_dir(path: Path, what: str):
    """Holds an exclusive lock on directory `path` (made if missing) while the block runs.

    A second process asking for the same directory is refused at once with the holder's pid (`HeldLock` on
    `path/.lock`); the file is removed on release (the directory's layout stays its own), and a directory made here
    that holds nothing else is removed too.
    """
    path = Path(path)
    made = not path.exists()
    path.mkdir(parents=True, exist_ok=True)
    lock = HeldLock(path / LOCK, lambda holder: WorkbenchError(
        f"{what} '{path}' is in use by another process (pid {holder}); wait for it to end or choose another directory"))
    try:
        yield path
    finally:
        lock.release()
        if made and not any(path.iterdir()):
            path.rmdir()


def replace_dir(staging: Path, target: Path) -> None:
    """Moves a fully written staging directory to `target`, replacing what was there."""
    target = Path(target)
    if target.exists():
        old = target.with_name(f".{target.name}.old{os.getpid()}")
        os.replace(target, old)
        os.replace(staging, target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(staging, target)


_STAGING = re.compile(r"^\.(?P<name>.+)\.(?:tmp|old)(?P<pid>\d+)$")  # `atomic_path`'s and `replace_dir`'s names


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_stale_staging(path: Path) -> list[Path]:
    """Removes the staging entries (`.NAME.tmpPID`, `.NAME.oldPID`) a killed writer left beside `path`."""
    path = Path(path)
    removed = []
    if not path.parent.is_dir():
        return removed
    for entry in path.parent.iterdir():
        m = _STAGING.match(entry.name)
        if not m or m["name"] != path.name:
            continue
        if _pid_alive(int(m["pid"])):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        removed.append(entry)
    return removed
