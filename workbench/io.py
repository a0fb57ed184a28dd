"""Small file helpers every writer uses: atomic writes, hashing, output-directory checks.

Nothing is half-written: each file goes to a temporary name in the same directory, is fsynced
and `os.replace`d into place, so a killed process leaves either the old file or the new one.
`atomic_path` is that one mechanism; the write_*_atomic helpers and every writer that hands a
path to a library (parquet, safetensors) go through it.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import tomllib

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
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


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


OUTPUT_MARKER = ".workbench-output"  # in every directory a command writes whole: --overwrite may replace only these


def mark_output(path: Path, command: str) -> None:
    """Marks `path` as a directory `command` wrote, which a later --overwrite may replace."""
    write_json_atomic(Path(path) / OUTPUT_MARKER, {"written_by": f"workbench {command}"})


def is_workbench_output(path: Path) -> bool:
    """Whether `path` holds the output marker, or is a probe results directory written before the marker
    existed (only files, and a summary.json whose created_by names the workbench)."""
    path = Path(path)
    if (path / OUTPUT_MARKER).is_file():
        return True
    try:
        created_by = json.loads((path / "summary.json").read_text()).get("created_by", "")
    except (OSError, ValueError, AttributeError):
        return False
    return str(created_by).startswith("workbench") and all(p.is_file() for p in path.iterdir())


def check_out_dir(path: Path, overwrite: bool = False, reading=()) -> Path:
    """Refuses an output directory that exists and is not empty, unless `overwrite` and the workbench wrote it.

    Never replaces what a user owns: `overwrite` applies only to a directory holding the output
    marker (`mark_output`), and a directory that is or holds a path in `reading` (the checkpoint or
    manifests the command reads) is refused whatever the flags. Checked before any work starts, and
    nothing is created here: a refused or failed command leaves no directory behind.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise WorkbenchError(f"output '{path}' exists and is not a directory")
    target = path.resolve()
    for read in reading:
        read = Path(read).resolve()
        if read == target or target in read.parents:
            raise WorkbenchError(f"output directory '{path}' holds '{read}', which this command reads; "
                                 "choose another output directory")
    if path.is_dir() and any(path.iterdir()):
        if not overwrite:
            raise WorkbenchError(f"output directory '{path}' exists and is not empty; pass --overwrite to replace it")
        if not is_workbench_output(path):
            raise WorkbenchError(f"--overwrite replaces only a directory the workbench wrote (marked {OUTPUT_MARKER}); "
                                 f"'{path}' is not one: choose a new output directory")
    return path


LOCK = ".lock"


@contextmanager
def locked_dir(path: Path, what: str):
    """Holds an exclusive lock on directory `path` (made if missing) while the block runs.

    A second process asking for the same directory is refused at once with the holder's pid. The
    lock is an flock on `path/.lock`, so a killed holder never leaves it stale; the file is removed
    on release (the directory's layout stays its own), and a directory made here that holds
    nothing else is removed too.
    """
    path = Path(path)
    made = not path.exists()
    path.mkdir(parents=True, exist_ok=True)
    lock = path / LOCK
    handle = open(lock, "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if not lock.exists() or os.stat(lock).st_ino != os.fstat(handle.fileno()).st_ino:
            raise BlockingIOError  # the holder released and removed the file as we opened it: another may hold a new one
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "unknown"
        handle.close()
        raise WorkbenchError(f"{what} '{path}' is in use by another process (pid {holder}); wait for it to end "
                             "or choose another directory") from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    try:
        yield path
    finally:
        lock.unlink(missing_ok=True)  # while still held: whoever opens it next finds a new file
        handle.close()
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


def read_json(path: str | os.PathLike, kind: str) -> dict:
    """Parses a JSON object file; a missing file, bad JSON or another top-level type is a one-line WorkbenchError."""
    path = Path(path)
    if not path.is_file():
        raise WorkbenchError(f"{kind} '{path}' does not exist")
    try:
        value = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise WorkbenchError(f"{kind} '{path}' is not valid JSON ({str(err).splitlines()[0][:120]})") from None
    if not isinstance(value, dict):
        raise WorkbenchError(f"{kind} '{path}' holds a JSON {type(value).__name__}, not an object")
    return value


def read_toml(path: str | os.PathLike, kind: str) -> dict:
    """Parses a TOML file; a missing file or bad TOML is a WorkbenchError naming `kind` and the path."""
    path = Path(path)
    if not path.is_file():
        raise WorkbenchError(f"{kind} '{path}' does not exist")
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise WorkbenchError(f"{kind} '{path}' is not valid TOML: {err}") from None
