"""The figure registry: which figures a set of tables gets, and how parts reach builders."""

from pathlib import Path

import pytest

from workbench.analysis.headlines import HEADLINE_MODULES
from workbench.defaults import PROBE_ORDER, probe_order
from workbench.errors import WorkbenchError
from workbench.plots import build_all, captions, figure_key, figures, find_builder
from workbench.plots.heads import RETRIEVAL_MARK
from workbench.plots.lens import logit_lens_figure
from workbench.plots.registry import SECTION_MODULES, Figure, builder_parts, discover, part_names, section
from workbench.plots.report import section_heads
from workbench.probes import PROBES


def test_every_probe_result_has_figures_with_unique_names():
    """Read from the plots' declarations: a probe without figures (or a table caption), a figure without a
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


def stated_rank(name: str) -> tuple[int, str]:
    """Where PROBE_ORDER puts probe `name`: its place there, or after all of them, by name."""
    return (PROBE_ORDER.index(name) if name in PROBE_ORDER else len(PROBE_ORDER), name)


def test_one_order_lists_the_probes_their_headlines_and_their_sections():
    """The probe order is stated once (`workbench.defaults.PROBE_ORDER`): the probes, their headline modules and
    their sections are each found by name and listed in it. A name left in it after its probe is gone (or misspelt)
    would be skipped without a word."""
    assert len(PROBE_ORDER) == len(set(PROBE_ORDER)) and [n for n in PROBE_ORDER if n not in PROBES] == []
    # held to PROBE_ORDER itself, not to `probe_order` (which built all three): the named ones first, then any other
    # by name; a helper that listed them in another order would otherwise agree with itself
    assert list(PROBES)[:len(PROBE_ORDER)] == list(PROBE_ORDER)
    for found in (PROBES, HEADLINE_MODULES, SECTION_MODULES):  # a headline or a section of its own is optional
        assert set(found) <= set(PROBES) and list(found) == sorted(found, key=stated_rank)
    # after the block selection and its Stage 2 (the report's own sections)
    assert list(section_heads())[:2] == ["block_selection", "window_sweep"] and list(section_heads())[2:] == list(SECTION_MODULES)
    assert list(figures()) == [n for n in SECTION_MODULES if n != "identity"]
    # each probe PROBE_ORDER names has a headline and a section of its own (what the shipped report relies on); a
    # probe it does not name may have neither (its report section and figure are its table's: table_section)
    assert [n for n in HEADLINE_MODULES if n in PROBE_ORDER] == [n for n in SECTION_MODULES if n in PROBE_ORDER] == list(
        PROBE_ORDER)


def test_probe_order_puts_the_named_probes_first_and_a_new_one_after_them_by_name():
    """Every shipped probe is named in PROBE_ORDER, so the tail (a probe it does not name) is checked here."""
    names = {"zeta_probe", "splice", "alpha_probe", "identity", "depth_matrix"}
    assert probe_order(names) == ["identity", "depth_matrix", "splice", "alpha_probe", "zeta_probe"]


def test_a_plots_module_declares_sections_by_probe_name(tmp_path):
    """`discover` finds the modules whose top level assigns `SECTIONS = {"<probe>": ...}` (parsed, not imported);
    one mentioned only in a docstring does not count, and two modules declaring one probe is an error."""
    shipped = Path(__file__).resolve().parents[2] / "workbench" / "plots"
    assert discover(shipped) == SECTION_MODULES and SECTION_MODULES["overshoot"] == "workbench.plots.classes"
    (tmp_path / "mine.py").write_text('"""SECTIONS = {"x": ...} in a docstring"""\nSECTIONS = {"first_loop": None}\n')
    (tmp_path / "helper.py").write_text('"""declares\nSECTIONS = {"y": ...} at its top level"""\n')
    assert discover(tmp_path) == {"first_loop": "workbench.plots.mine"}
    (tmp_path / "again.py").write_text('SECTIONS = {"first_loop": None}\n')
    with pytest.raises(WorkbenchError, match="section of probe 'first_loop' is declared twice"):
        discover(tmp_path)


def test_a_figure_or_section_that_is_not_declared_is_one_line():
    with pytest.raises(WorkbenchError, match="is not a function named '<name>_figure'"):
        Figure(section, "caption")
    with pytest.raises(WorkbenchError, match="is not a function named '<name>_figure'"):
        Figure("workbench.plots.lens:logit_lens_figure", "caption")
    assert Figure(logit_lens_figure, "caption").builder is logit_lens_figure
    with pytest.raises(WorkbenchError, match="no plots module declares a section for probe 'first_loop'; declared: "
                                             "identity, depth_matrix"):
        section("first_loop")


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
    with pytest.raises(WorkbenchError, match="figure 'fronteir' is unknown; accepted: depth_matrix, frontier, "):
        find_builder("fronteir")
