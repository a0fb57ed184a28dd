"""The figure registry: which figures a set of tables gets, and how parts reach builders."""

import pytest

from workbench.errors import WorkbenchError
from workbench.plots import build_all, captions, figure_key, figures, find_builder
from workbench.plots.heads import RETRIEVAL_MARK
from workbench.plots.registry import ORDER, builder_parts, part_names, resolve
from workbench.plots.report import section_heads
from workbench.probes import PROBES
from workbench.probes.spec import Figure


def test_every_probe_result_has_figures_with_unique_names():
    """Read from the probes' declarations: a probe without figures (or a table caption), a figure without a
    caption, a probe without a report section, or two builders with one name fail here."""
    registry = figures()
    assert set(registry) == set(PROBES) - {"identity"}  # identity is shown as a table in the report
    keys = [figure_key(b) for bs in registry.values() for b in bs]
    assert len(keys) == len(set(keys))
    assert [k for k in [*keys, "identity"] if not captions().get(k)] == []
    assert [r for r in PROBES if r not in section_heads()] == []
    for result, builders in registry.items():
        for b in builders:
            assert find_builder(figure_key(b)) == (result, b)


def test_the_presentation_order_names_only_probes():
    """A name left in ORDER after its probe is gone (or misspelt) would be skipped without a word."""
    assert len(ORDER) == len(set(ORDER)) and [n for n in ORDER if n not in PROBES] == []
    # after the block selection and its Stage 2 (the report's own sections); every probe is named today
    assert list(section_heads())[:2] == ["block_selection", "stage2"] and list(section_heads())[2:] == list(ORDER)


def test_a_figure_naming_a_missing_builder_is_one_line():
    with pytest.raises(WorkbenchError, match="'workbench.plots.lens' has no function 'lens_figure'"):
        resolve(Figure("workbench.plots.lens:lens_figure", "caption"))
    with pytest.raises(WorkbenchError, match="no module 'workbench.plots.lense'"):
        resolve(Figure("workbench.plots.lense:logit_lens_figure", "caption"))
    with pytest.raises(WorkbenchError, match="is not 'module:name_figure'"):
        Figure("workbench.plots.lens.logit_lens_figure", "caption")


def test_parts_are_the_dataframe_parameters():
    assert part_names("logit_lens") == {"logit_lens__top"}
    assert part_names("heads") == {"heads__summary"}
    assert part_names("depth_matrix") == {"depth_matrix__frontier"}
    _, concentration = find_builder("head_concentration")[0], find_builder("head_concentration")[1]
    assert builder_parts("heads", concentration) == {"summary": ("heads__summary", True)}


def test_build_all_renders_what_is_present(tables):
    built = build_all(tables)
    assert [k for _, k, _ in built] == [figure_key(b) for bs in figures().values() for b in bs]  # every figure, in order
    # A required part absent: that figure is skipped, the others stay.
    partial = {k: v for k, v in tables.items() if k != "heads__summary"}
    keys = [k for _, k, _ in build_all(partial)]
    assert "heads" in keys and "head_concentration" not in keys
    # An optional part is passed when present: the retrieval markers come from heads__summary.
    heads = dict((k, f) for _, k, f in built)["heads"]
    assert any(t.name == RETRIEVAL_MARK for t in heads.data)
    only = build_all({"depth_matrix": tables["depth_matrix"]})
    assert [k for _, k, _ in only] == ["depth_matrix", "frontier"]
    assert [k for _, k, _ in build_all(tables, only=["frontier"])] == ["frontier"]


def test_unknown_figure_is_an_error():
    with pytest.raises(WorkbenchError, match="figure 'fronteir' is unknown; accepted: logit_lens, lens_agreement, "):
        find_builder("fronteir")
