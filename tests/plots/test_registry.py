"""The figure registry: which figures a set of tables gets, and how parts reach builders."""

import pytest

from workbench.errors import WorkbenchError
from workbench.plots import FIGURES, build_all, figure_key, find_builder
from workbench.plots.registry import builder_parts, part_names
from workbench.plots.report import FIGURE_CAPTIONS, SECTIONS
from workbench.probes import PROBES


def test_every_probe_result_has_figures_with_unique_names():
    """Read from the probe registry and the report, not from a list kept beside FIGURES: a probe added without
    figures, a figure without a caption or a report section, or two builders with one name fail here."""
    assert set(FIGURES) == set(PROBES) - {"identity"}  # identity is shown as a table in the report
    keys = [figure_key(b) for bs in FIGURES.values() for b in bs]
    assert len(keys) == len(set(keys))
    assert [k for k in keys if k not in FIGURE_CAPTIONS] == []
    assert [r for r in FIGURES if r not in SECTIONS] == []
    for result, builders in FIGURES.items():
        for b in builders:
            assert find_builder(figure_key(b)) == (result, b)


def test_parts_are_the_dataframe_parameters():
    assert part_names("logit_lens") == {"logit_lens__top"}
    assert part_names("heads") == {"heads__summary"}
    assert part_names("depth_matrix") == {"depth_matrix__frontier"}
    _, concentration = find_builder("head_concentration")[0], find_builder("head_concentration")[1]
    assert builder_parts("heads", concentration) == {"summary": ("heads__summary", True)}


def test_build_all_renders_what_is_present(tables):
    built = build_all(tables)
    assert [k for _, k, _ in built] == [figure_key(b) for bs in FIGURES.values() for b in bs]  # every figure, in order
    # A required part absent: that figure is skipped, the others stay.
    partial = {k: v for k, v in tables.items() if k != "heads__summary"}
    keys = [k for _, k, _ in build_all(partial)]
    assert "heads" in keys and "head_concentration" not in keys
    # An optional part is passed when present: the retrieval markers come from heads__summary.
    heads = dict((k, f) for _, k, f in built)["heads"]
    assert any(t.name == "retrieval head" for t in heads.data)
    only = build_all({"depth_matrix": tables["depth_matrix"]})
    assert [k for _, k, _ in only] == ["depth_matrix", "frontier"]
    assert [k for _, k, _ in build_all(tables, only=["frontier"])] == ["frontier"]


def test_unknown_figure_is_an_error():
    with pytest.raises(WorkbenchError, match="figure 'fronteir' is unknown; accepted: logit_lens"):
        find_builder("fronteir")
