"""A probe's declaration of what it computes: `SPEC = ProbeSpec(...)` at the foot of its module.

The battery checks a probe's `needs` against the chosen rows, runs `run` and stores `summarize` in summary.json. What
is read from the tables and how they are shown is declared on the reading side, under the probe's name: its headline
in `workbench.analysis.headlines.<name>`, its report section and figures in a module of `workbench.plots` (`SECTIONS`,
`workbench.plots.registry`). Computation never imports presentation (tests/test_imports.py), and rendering a results
directory never imports a probe. docs/adding-a-probe.md walks through a real one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class ProbeSpec:
    """What one probe computes.

    Attributes:
        name: the probe's name, its main table's name and its key in summary.json.
        run: `run(model, tokenizer, rows, **options)` -> DataFrame or {table name: DataFrame}.
        parts: the part tables `run` may return beside its main one, each written as `<name>__<part>.parquet`; the
            battery refuses a table the probe does not declare (`tables`).
        summarize: tables -> the numbers for summary.json, with "headline" (the probe's headline, computed by its
            module of `workbench.analysis.headlines`).
        needs: the row fields `run` reads (`prompt`, `answer`, `symbols`, `chain`, `depth`, `table`, `start`, ...),
            then the `Need`s its rows and model must meet (one-token answers, function-table rows, a corrupted twin,
            a halting head). The battery asks every probe before the first runs (`workbench.probes.battery.unmet`)
            and records it "not applicable: needs <field>, ..." or the first unmet `Need`'s reason instead of
            running it; the probe's own checks (`require_symbols`, `require_chase`) still guard a direct call.
        requires: the model capabilities `run` needs (`workbench.models.looped.CAPABILITIES`); on a model that
            lacks one the probe is "not applicable", with the model's own reason (`LoopedModel.unsupported`).
        options: the record of `run`'s options (`workbench.probes.options.probe_options`): what a battery may set,
            typed, checked before any probe runs; the battery hands `run` the context values it declares
            (`batch_size`, `seed`, `progress`, `base`, `support`).
    """

    name: str
    run: Callable
    summarize: Callable
    parts: tuple[str, ...] = ()
    needs: tuple[str | Need, ...] = ()
    requires: tuple[str, ...] = ()
    options: type | None = None

    @property
    def tables(self) -> tuple[str, ...]:
        """The tables the probe writes: its main table, then `<name>__<part>` for each part."""
        return (self.name, *(f"{self.name}__{part}" for part in self.parts))

    def lacking(self, rows: list[dict]) -> list[str]:
        """The fields of `needs` that some row lacks, in `needs` order: absent or None, or for `depth` below 1
        (depth 0 is a row from a user's file that gives none, `workbench.tasks.user`)."""
        return [f for f in self.fields if any(lacks(r, f) for r in rows)]

    @property
    def fields(self) -> tuple[str, ...]:
        """The row fields of `needs`."""
        return tuple(n for n in self.needs if isinstance(n, str))

    @property
    def conditions(self) -> tuple[Need, ...]:
        """The `Need`s of `needs`, in order."""
        return tuple(n for n in self.needs if isinstance(n, Need))


@dataclass(frozen=True)
class Need:
    """A condition beyond a field that a probe's rows or model must meet, checked before any probe runs.

    Attributes:
        name: what is needed, as a user reads it ("one-token answers").
        why: `why(model, rows)` -> None when met, else the reason the probe is not applicable, opening with
            "needs <name>" or the model's own sentence; it reads no model output (no forward).
    """

    name: str
    why: Callable[[object, list[dict]], str | None]


def lacks(row: dict, field: str) -> bool:
    """Whether `row` lacks `field`: absent or None; a `depth` below 1 is not given (`workbench.tasks.user`)."""
    value = row.get(field)
    if value is None:
        return True
    return field == "depth" and isinstance(value, int) and value < 1
