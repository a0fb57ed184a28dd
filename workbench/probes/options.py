"""A probe's options as a typed record: `@probe_options class Options` beside its `run`, named by `ProbeSpec.options`.

    @probe_options
    class Options:
        loops: int | None = None          # T, loops to read
        batch_size: Count = 16
        progress: bool = False

The battery checks every probe's options against its record before any probe runs (`check`): an unknown option is
refused naming the nearest known one, a value of the wrong type or out of its bounds in one line. The record is a
pydantic dataclass, as a recipe's tables are (`workbench.train.schema`), and declares the same names and defaults as
the probe's `run` (tests/probes/test_options.py holds the two together); the values the user gave are what `run` is
handed, so a checked battery computes exactly what it computed before.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import fields
from typing import Annotated

from pydantic import ConfigDict, Field, ValidationError
from pydantic.dataclasses import dataclass

from workbench.errors import WorkbenchError

CONFIG = ConfigDict(extra="forbid", allow_inf_nan=False, arbitrary_types_allowed=True)
Count = Annotated[int, Field(ge=1)]                  # a count: batch sizes, draws, rows
Fraction = Annotated[float, Field(gt=0.0, lt=1.0)]    # a share of the rows
Names = Sequence[str]                                 # a list of names (corruptions, sites, rules)
Layers = Sequence[int] | None                         # block layers by absolute index; None: every block layer
Paths = dict[str, str] | None                         # {name: run directory} (halting heads)
CONTEXT = ("model", "tokenizer", "rows")              # what `run` takes besides its options


def probe_options(cls):
    """A probe's option record: a frozen pydantic dataclass that refuses a name it does not declare."""
    return dataclass(frozen=True, config=CONFIG)(cls)


def names(record) -> list[str]:
    """The options a record declares, in declaration order."""
    return [f.name for f in fields(record)]


def check(probe: str, record, given: dict) -> None:
    """Raises WorkbenchError, one line, for the first option of `given` that `record` refuses.

    Raises:
        WorkbenchError: an unknown option (with the nearest declared name and the accepted ones), or a value of the
            wrong type or out of its bounds.
    """
    unknown = sorted(set(given) - set(names(record)))
    if unknown:
        accepted = [n for n in names(record) if n != "progress"]
        near = difflib.get_close_matches(unknown[0], accepted, n=1)
        hint = f"; did you mean '{near[0]}'?" if near else ""
        raise WorkbenchError(f"probe '{probe}' has no option '{unknown[0]}'; accepted: {', '.join(accepted)}{hint}")
    try:
        record(**given)
    except ValidationError as err:
        first = err.errors(include_url=False)[0]
        where = ".".join(str(part) for part in first["loc"])
        option = str(first["loc"][0]) if first["loc"] else where
        raise WorkbenchError(f"probe '{probe}' option {option} = {given.get(option)!r}: {first['msg'].lower()}"
                             + (f" (at {where})" if where != option else "")) from None
