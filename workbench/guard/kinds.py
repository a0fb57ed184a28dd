"""What a writer declares of its output (`OutputKind`): its layout, how to tell an output of its own, and for a
directory written in place how it is continued and what it keeps from other writers."""

from __future__ import annotations

from collections.abc import Callable, Container
from dataclasses import dataclass
from pathlib import Path

WHOLE = "whole"          # a directory written whole in a staging sibling and moved in (`Guard.commit_dir`)
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


@dataclass(frozen=True)
class OutputKind:
    """What one writer writes, declared beside the code that writes it and handed to `guard_output`.

    Attributes:
        name: the kind (run, sweep, results, figures, report, ...), for reading.
        layout: WHOLE, IN_PLACE or FILES.
        owns: whether an existing path is this writer's own, told from its content (never from the marker alone):
            for FILES, a file this writer wrote (only such a file is replaced); for WHOLE, a directory it wrote
            before the output marker existed; for IN_PLACE, a directory of its own, continued or finished (what
            no other writer replaces: every guard asks `IN_PLACE_KINDS` and those handed beside). None: nothing.
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

    def wrote(self, path: Path) -> bool:
        """Whether this writer's `owns` recognises `path` as its own (never without an `owns`)."""
        return self.owns is not None and bool(self.owns(Path(path)))
