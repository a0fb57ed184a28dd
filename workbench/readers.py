"""Reading the JSON and TOML files a command is given: a missing file, bad bytes or a bad value is one line.

Each reader names the file and what it was read as, so the CLI prints a `WorkbenchError` the user can act on
instead of a traceback.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import tomllib

from workbench.errors import WorkbenchError

log = logging.getLogger(__name__)
_NOTED: set[Path] = set()   # each old name is noted once a process, however often it is read


def json_value(path: Path) -> object:
    """Parses a JSON file of any top-level type (the caller checks the shape); bad bytes or bad JSON are one line
    naming the file."""
    try:
        return json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError:
        raise WorkbenchError(f"{path}: not UTF-8 text") from None
    except json.JSONDecodeError as err:
        raise WorkbenchError(f"{path}: not valid JSON ({err.msg} at line {err.lineno})") from None


def under_old_name(folder: str | os.PathLike, name: str, old: str) -> Path:
    """Returns folder/name, or folder/old where only a file under that older name is there (noted once, one line)."""
    folder = Path(folder)
    if (folder / name).exists() or not (folder / old).exists():
        return folder / name
    if folder / old not in _NOTED:
        _NOTED.add(folder / old)
        log.warning("%s: read as %s (its old name)", folder / old, name)
    return folder / old


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
        return tomllib.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as err:
        raise WorkbenchError(f"{kind} '{path}' is not UTF-8 text (byte {err.start}); TOML files are UTF-8") from None
    except tomllib.TOMLDecodeError as err:
        raise WorkbenchError(f"{kind} '{path}' is not valid TOML: {str(err).splitlines()[0]}") from None
