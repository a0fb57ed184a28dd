"""Figures: each function takes tidy data (a DataFrame or a result object) and returns a
`plotly.graph_objects.Figure` styled with the one workbench theme (`workbench.plots.theme`).
Nothing here writes files or calls `.show()`. Inside a Jupyter kernel, importing this package
makes the "workbench" renderer plotly's default (`workbench.plots.notebook`): every figure output
then also carries offline HTML and a PNG, so it survives `nbconvert --to html` and static viewers.
"""
# ruff: noqa: PLC0415, F401 - the face imports its names inside `_figures`, on the first one asked for

import sys


def _figures() -> dict:
    """Every public name, imported: on the first one asked for (`__getattr__`), not when the package is imported.
    A command that prints a table imports `workbench.plots.terminal`, and so this package, and never draws a
    figure: the figure modules' plotly import was about 2 s of CPU in every such process."""
    from workbench.plots.audit import gradient_audit_figure, latency_figure
    from workbench.plots.classes import overshoot_cost_figure, overshoot_figure, splice_figure
    from workbench.plots.depth import depth_matrix_figure, frontier_figure
    from workbench.plots.drift import drift_figure, drift_heads_figure
    from workbench.plots.halting import halting_figure
    from workbench.plots.heads import head_concentration_figure, heads_figure
    from workbench.plots.lens import lens_agreement_figure, logit_lens_figure
    from workbench.plots.linear_probe import linear_probe_figure
    from workbench.plots.loop_accuracy import loop_accuracy_figure
    from workbench.plots.patching import attribution_figure, patching_figure, patching_steps_figure, paths_figure
    from workbench.plots.prompt_lens import lens_figure
    from workbench.plots.registry import build_all, captions, figure_key, figures, find_builder
    from workbench.plots.theme import THEME, apply_theme
    return {name: value for name, value in locals().items() if name in __all__}


__all__ = [
    "THEME", "apply_theme", "attribution_figure", "build_all", "captions", "depth_matrix_figure", "drift_figure",
    "drift_heads_figure", "figure_key", "figures", "find_builder", "frontier_figure", "gradient_audit_figure", "halting_figure",
    "head_concentration_figure", "heads_figure", "latency_figure", "lens_agreement_figure", "lens_figure",
    "linear_probe_figure", "logit_lens_figure", "loop_accuracy_figure", "overshoot_cost_figure", "overshoot_figure",
    "patching_figure", "patching_steps_figure", "paths_figure", "splice_figure",
]


def __getattr__(name: str):
    if name in __all__:
        globals().update(_figures())
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


# The renderer serves a Jupyter kernel, which imported IPython before any cell ran; elsewhere (every CLI process)
# it waits for an import of workbench.plots.notebook: plotly's renderer registry imports nbformat and, through it,
# jsonschema's format grammars, about 3.5 s of CPU in a process that never shows a figure.
if "IPython" in sys.modules:
    import workbench.plots.notebook  # noqa: F401 - registers the renderer, the default inside a kernel
