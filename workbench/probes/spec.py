"""A probe's declaration: `SPEC = ProbeSpec(...)` at the foot of its module, the one place that names it.

The battery runs `run` and stores `summarize`; the headlines read `headline`; the report gives the
probe a section (`title`, `about`) and draws each of its `figures` with the figure's caption;
`workbench figures` exports the same figures. A figure's builder is named, not imported
("workbench.plots.lens:logit_lens_figure"): computation never imports presentation
(tests/test_imports.py), and the presentation resolves the name when it draws (`workbench.plots.registry`).
docs/adding-a-probe.md walks through a real one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from workbench.errors import WorkbenchError


@dataclass(frozen=True)
class Figure:
    """One figure of a probe's results.

    Attributes:
        builder: "module:function" of the plot; the function takes the probe's main table (further
            DataFrame parameters receive its part tables, `workbench.plots.registry`) and returns a
            plotly Figure. Its name without `_figure` names the figure ("frontier").
        caption: what the figure shows, then what the looped mechanism predicts ("Predicted: ...").
    """

    builder: str
    caption: str

    def __post_init__(self):
        module, _, function = self.builder.partition(":")
        if not module or not function.endswith("_figure"):
            raise WorkbenchError(f"figure builder '{self.builder}' is not 'module:name_figure'")


@dataclass(frozen=True)
class ProbeSpec:
    """Everything the rest of the workbench knows about one probe.

    Attributes:
        name: the probe's name, its main table's name and its key in summary.json.
        run: `run(model, tokenizer, rows, **options)` -> DataFrame or {table name: DataFrame}.
        summarize: tables -> the numbers for summary.json, with "headline" (the probe's headline, computed by its
            module of `workbench.analysis.headlines`).
        title: the report section's heading.
        about: the sentence under the heading: what the probe measures.
        figures: the figures the report draws in the section and `workbench figures` exports, in order.
        table_caption: for a probe shown as its main table instead of figures (identity), the caption under it.
        needs: the row fields `run` reads (`prompt`, `answer`, `symbols`, `chain`, `depth`, `table`, `start`, ...).
            The battery (through `workbench.probes.battery.run_probe`) records the probe "not applicable: needs
            <field>" when a chosen row lacks one, instead of running it (`lacking`); the probe's own checks
            (`require_symbols`, `require_chase`) still test the values. Empty: no check.
    """

    name: str
    run: Callable
    summarize: Callable
    title: str
    about: str
    figures: tuple[Figure, ...] = ()
    table_caption: str | None = None
    needs: tuple[str, ...] = ()

    def lacking(self, rows: list[dict]) -> list[str]:
        """The fields of `needs` that some row lacks, in `needs` order: absent or None, or for `depth` below 1
        (depth 0 is a row from a user's file that gives none, `workbench.tasks.user`)."""
        return [f for f in self.needs if any(lacks(r, f) for r in rows)]


def lacks(row: dict, field: str) -> bool:
    """Whether `row` lacks `field`: absent or None; a `depth` below 1 is not given (`workbench.tasks.user`)."""
    value = row.get(field)
    if value is None:
        return True
    return field == "depth" and isinstance(value, int) and value < 1
