"""Reading a probe results directory: its tables, its summary, and the depth matrices of two paired.

A results directory (`workbench probe --out`) holds `<table>.parquet` per probe table and
`summary.json`; the report, the headlines, `workbench compare` and the paper figures read it
through these functions.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from workbench.analysis.stats import paired_compare
from workbench.errors import WorkbenchError
from workbench.readers import json_value

SUMMARY = "summary.json"


def load_results(results_dir: str | os.PathLike) -> dict[str, pd.DataFrame]:
    """Returns {file stem: DataFrame} for every `*.parquet` in `results_dir` (e.g. "logit_lens__top")."""
    path = Path(results_dir)
    if not path.is_dir():
        raise WorkbenchError(f"results directory '{path}' does not exist")
    return {p.stem: read_table(p) for p in sorted(path.glob("*.parquet"))}


def read_table(path: str | os.PathLike) -> pd.DataFrame:
    """Reads one parquet table; a file that is not one (a text file named .parquet, cut short) is a WorkbenchError."""
    try:
        return pd.read_parquet(path)
    except (OSError, ValueError) as err:  # pyarrow's ArrowInvalid is a ValueError
        raise WorkbenchError(f"{path}: not a readable parquet table ({str(err).splitlines()[0][:100]})") from None


def probes_run(results_dir: str | os.PathLike) -> list[str]:
    """The probes a results directory's summary.json says ran, whose main table (`<name>.parquet`) is there."""
    return [name for name in (read_summary(results_dir).get("probes") or {})
            if (Path(results_dir) / f"{name}.parquet").is_file()]


def read_summary(results_dir: str | os.PathLike) -> dict:
    """Returns the parsed summary.json of `results_dir`, or {} when there is none."""
    path = Path(results_dir) / SUMMARY
    if not path.is_file():
        return {}
    value = json_value(path)
    if not isinstance(value, dict) or not isinstance(value.get("probes", {}), dict):
        raise WorkbenchError(f"{path}: holds a JSON {type(value).__name__} without a 'probes' object; not a "
                             "probe summary")
    return value


@dataclass
class _Result:
    """A results directory's depth matrix as `workbench.analysis.stats.paired_compare` takes it."""

    manifest_sha256: str
    table: pd.DataFrame
    manifest: str | None = None  # the manifest file the rows were drawn from (summary.json), by name

    def frame(self) -> pd.DataFrame:
        return self.table


def load_result(results_dir: Path) -> _Result:
    """Returns the depth matrix of a results directory with the digest of the rows it was computed on.

    Raises:
        WorkbenchError: no summary.json or depth_matrix.parquet in the directory.
    """
    summary_path, table_path = Path(results_dir) / "summary.json", Path(results_dir) / "depth_matrix.parquet"
    for p in (summary_path, table_path):
        if not p.is_file():
            raise WorkbenchError(f"'{results_dir}' is not a probe results directory with a depth matrix: {p.name} is missing")
    summary = read_summary(results_dir)
    rows = summary.get("probe_runs", {})
    for key in ("depth_matrix", "rows"):
        rows = rows.get(key, {}) if isinstance(rows, dict) else {}
    if not isinstance(rows, dict) or not isinstance(rows.get("rows_sha256"), str):
        raise WorkbenchError(f"{summary_path}: no rows digest recorded for depth_matrix")
    manifest = Path(rows["manifest"]).name if isinstance(rows.get("manifest"), str) else None
    return _Result(rows["rows_sha256"], read_table(table_path), manifest)


def compare_results(results_a: Path, results_b: Path) -> pd.DataFrame:
    """Returns per-depth helped / hurt / tied and exact McNemar p of B against A (last row: pooled).

    Two results drawn from the same manifest file (by name, as summary.json records it) are compared
    over the rows both read, matched by row id: a demo battery's 8 rows per depth against the default
    battery's 32 pair on the 8 they share. The frame's `attrs["rows"]` says how many: {"compared",
    "a", "b", "manifest"}.

    Raises:
        WorkbenchError: the results come from different manifests (or one without a recorded manifest and
            different rows), or share no row.
    """
    a, b = load_result(results_a), load_result(results_b)
    n_a, n_b = (r.table["row_id"].nunique() for r in (a, b))
    if a.manifest_sha256 != b.manifest_sha256:
        if a.manifest is None or a.manifest != b.manifest:
            raise WorkbenchError(f"refusing to compare results read from different manifests ({a.manifest or '?'}, "
                                 f"{n_a} rows vs {b.manifest or '?'}, {n_b} rows): paired tests need the same rows")
        common = set(a.table["row_id"]) & set(b.table["row_id"])
        if not common:
            raise WorkbenchError(f"the two results read no row in common from {a.manifest} ({n_a} and {n_b} rows)")
        a, b = (_Result(f"common rows of {a.manifest}", r.table[r.table["row_id"].isin(common)], r.manifest)
                for r in (a, b))
    table = paired_compare(a, b)
    table.attrs["rows"] = {"compared": int(a.table["row_id"].nunique()), "a": n_a, "b": n_b, "manifest": a.manifest}
    return table
