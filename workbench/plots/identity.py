"""The identity probe's report section: shown as its main table (max |Δlogit| per comparison), with no figure."""

from __future__ import annotations

from workbench.plots.registry import Section

SECTIONS = {
    "identity": Section(
        title="Loop-1 identity",
        about="max |Δlogit| at loop 1 against a plain forward: 0.0 exactly in fp32 for the checkpoint against its own "
              "weights and for fresh retrofits; against the untouched base it measures how much training changed "
              "loop 1.",
        table_caption="max |Δlogit| at loop 1 per comparison. Predicted: 0.0 against the model's own weights, with the "
                      "adapter disabled and for every fresh retrofit; non-zero against the base only with a trained "
                      "adapter.",
    ),
}
