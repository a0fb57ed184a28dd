"""Frozen row manifests: `F.jsonl` (one canonical JSON row a line) and its sidecar `F.manifest.json`.

The sidecar holds `rows` (the count), `depth_counts`, `row_ids_sha256` (SHA-256 of the
newline-joined row ids) and `rows_sha256` (SHA-256 of the canonical JSON of every row, each
followed by a newline: exactly the bytes of `F.jsonl`, so `sha256sum F.jsonl` agrees).
Both files are written atomically; the same rows always give byte-identical files.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from pathlib import Path
from typing import Iterable, NamedTuple

from workbench.errors import WorkbenchError
from workbench.guard import FILES, OutputKind
from workbench.io import write_bytes_atomic
from workbench.texts import read_json_lines

SIDECAR_SUFFIX = ".manifest.json"


def manifest_file(path: Path) -> bool:
    """Whether `path` is half of a manifest the workbench wrote: a sidecar holding the rows' digest, or rows
    (`F.jsonl`) whose sidecar is one."""
    path = Path(path)
    if path.name.endswith(SIDECAR_SUFFIX):
        try:
            sidecar = json.loads(path.read_bytes())
        except (OSError, ValueError):
            return False
        return isinstance(sidecar, dict) and "rows_sha256" in sidecar
    if path.name.endswith(".jsonl"):
        return manifest_file(path.with_name(path.name[:-len(".jsonl")] + SIDECAR_SUFFIX))
    return False


# What `rows` writes, handed to the output guard (once for F.jsonl, once for its sidecar): each replaced only with
# --overwrite, and only when it is a manifest's own half.
ROWS_OUTPUT = OutputKind("rows", FILES, owns=manifest_file)


class Manifest(NamedTuple):
    """Rows read from a manifest, and its verified sidecar."""

    rows: list[dict]
    sidecar: dict

    @property
    def digest(self) -> str:
        """The manifest's `rows_sha256`, which results record."""
        return self.sidecar["rows_sha256"]


def canonical_json(obj) -> str:
    """Returns JSON with sorted keys, no whitespace, UTF-8 text kept as is."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def rows_jsonl(rows: Iterable[dict]) -> bytes:
    """Returns the manifest file's bytes: one canonical JSON row a line."""
    return "".join(canonical_json(r) + "\n" for r in rows).encode()


def rows_sha256(rows: Iterable[dict]) -> str:
    """Returns the SHA-256 over the canonical JSON of every row (the JSONL bytes)."""
    return hashlib.sha256(rows_jsonl(rows)).hexdigest()


def row_ids_sha256(rows: Iterable[dict]) -> str:
    """Returns the SHA-256 over the newline-joined row ids."""
    return hashlib.sha256("\n".join(r["row_id"] for r in rows).encode()).hexdigest()


def sidecar_path(path: str | os.PathLike) -> Path:
    """Returns `F.manifest.json` for `F.jsonl`."""
    path = Path(path)
    if path.suffix != ".jsonl":
        raise WorkbenchError(f"manifest '{path}' must end in .jsonl")
    return path.with_suffix(SIDECAR_SUFFIX)


def summarize(rows: list[dict], name: str, meta: dict | None = None) -> dict:
    """Returns the sidecar for `rows` stored as the file `name`."""
    counts = Counter(r["depth"] for r in rows)
    sidecar = {
        "jsonl": name,
        "rows": len(rows),
        "depth_counts": {str(d): counts[d] for d in sorted(counts)},
        "row_ids_sha256": row_ids_sha256(rows),
        "rows_sha256": rows_sha256(rows),
    }
    if meta is not None:
        sidecar["meta"] = meta
    return sidecar


def write_manifest(rows: list[dict], path: str | os.PathLike, meta: dict | None = None) -> dict:
    """Writes `rows` to `path` (.jsonl) and its sidecar, atomically; returns the sidecar.

    Args:
        rows: row dicts, each with a unique `row_id` and a `depth`.
        path: the `.jsonl` file to write.
        meta: what produced the rows (generator options), stored in the sidecar as is.
    """
    path = Path(path)
    side = sidecar_path(path)
    _check_rows(rows, path)
    sidecar = summarize(rows, path.name, meta)
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_atomically(path, rows_jsonl(rows))
    _write_atomically(side, (json.dumps(sidecar, sort_keys=True, indent=2) + "\n").encode())
    return sidecar


def read_manifest(path: str | os.PathLike) -> Manifest:
    """Returns the rows of `path` and its sidecar, after checking one against the other.

    Raises:
        WorkbenchError: a missing file, a malformed line, or rows that do not match the sidecar.
    """
    path = Path(path)
    side = sidecar_path(path)
    if path.is_file() and not side.exists():   # a user's own rows, not yet checked and frozen
        raise WorkbenchError(f"'{path}' has no sidecar '{side.name}': it is not a frozen manifest; check and freeze "
                             f"your rows with `workbench rows --from {path} --out FROZEN.jsonl` and give that")
    lines = read_json_lines(path, "manifest")   # the one reader of a user's text
    rows = [value for _, value in lines]
    bad_row = next((n for n, r in lines if not isinstance(r, dict)), None)
    if bad_row is not None:
        raise WorkbenchError(f"manifest '{path}' line {bad_row} is not a JSON object")
    _check_rows(rows, path)
    try:
        sidecar = json.loads(side.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise WorkbenchError(f"manifest sidecar '{side}' is not valid JSON") from None
    if not isinstance(sidecar, dict):
        raise WorkbenchError(f"manifest sidecar '{side}' is not a JSON object")
    expected = summarize(rows, path.name, sidecar.get("meta"))
    bad = [k for k in ("rows", "depth_counts", "row_ids_sha256", "rows_sha256") if sidecar.get(k) != expected[k]]
    if bad:
        raise WorkbenchError(f"manifest '{path}' does not match its sidecar '{side.name}' ({', '.join(bad)} differ)")
    return Manifest(rows, sidecar)


def _check_rows(rows: list[dict], path: Path) -> None:
    if not rows:
        raise WorkbenchError(f"rows for '{path}' are empty; a manifest holds at least one row")
    missing = [i for i, r in enumerate(rows) if not isinstance(r.get("row_id"), str)
               or not isinstance(r.get("depth"), int) or isinstance(r.get("depth"), bool)]
    if missing:
        raise WorkbenchError(f"rows for '{path}' lack a string row_id or an integer depth (first at index {missing[0]})")
    no_prompt = next((i for i, r in enumerate(rows) if not isinstance(r.get("prompt"), str) or not r["prompt"]), None)
    if no_prompt is not None:  # every reader tokenizes it: found here, not as a KeyError after the model loaded
        raise WorkbenchError(f"rows for '{path}' lack a non-empty string prompt (first at index {no_prompt})")
    dupes = [rid for rid, n in Counter(r["row_id"] for r in rows).items() if n > 1]
    if dupes:
        raise WorkbenchError(f"rows for '{path}' repeat row ids, e.g. '{dupes[0]}'")


_write_atomically = write_bytes_atomic
