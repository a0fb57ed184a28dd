"""How the workbench tells a directory it wrote: the output marker a command leaves in a directory it writes whole,
which is all `--overwrite` may replace, and a results directory's own files, a command's inputs."""

from __future__ import annotations

from pathlib import Path

from workbench.guard.kinds import OutputKind
from workbench.io import LOCK, write_json_atomic

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


def is_workbench_output(path: Path, kind: OutputKind) -> bool:
    """Whether directory `path` holds the output marker, or is one `kind` wrote before the marker existed
    (`kind.owns`): what --overwrite may replace, unless a directory written in place recognises it as its own."""
    return (Path(path) / OUTPUT_MARKER).is_file() or kind.wrote(path)


def dir_inputs(*folders, exclude=()) -> list[Path]:
    """The files of each results directory in `folders` (None skipped), except names in `exclude`: a command's inputs."""
    return [p for f in folders if f is not None and Path(f).is_dir() for p in Path(f).iterdir()
            if p.name not in exclude and p.name not in (OUTPUT_MARKER, LOCK)]
