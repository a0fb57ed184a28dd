"""Series that can coincide stay visible: no two lines on the same axes share both their x values and
their look (dash and width), so equal series show as a stripe inside a stripe, never one hidden under
another (the lens chart once drew "coda: x_t" exactly under "raw: x_t")."""

from itertools import combinations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest

from workbench.plots import build_all, lens_agreement_figure
from workbench.plots.base import nested


def _lines(fig: go.Figure) -> list:
    return [t for t in fig.data if t.type == "scatter" and "lines" in (t.mode or "lines")
            and (t.line.width is None or t.line.width > 0)]  # width 0: the edge of a filled band


def look(trace) -> tuple:
    return trace.line.dash or "solid", trace.line.width or 2  # plotly draws an unset width as 2


def hidden_pairs(fig: go.Figure) -> list[tuple[str, str]]:
    """Returns the names of line pairs that could be drawn one exactly over the other."""
    out = []
    for a, b in combinations(_lines(fig), 2):
        same_axes = (a.xaxis or "x", a.yaxis or "y") == (b.xaxis or "x", b.yaxis or "y")
        if same_axes and set(np.asarray(a.x).tolist()) & set(np.asarray(b.x).tolist()) and look(a) == look(b):
            out.append((a.name, b.name))
    return out


def test_no_two_lines_of_any_figure_can_hide_each_other(tables):
    figures = build_all(tables)
    assert len(figures) == 25
    bad = {key: pairs for _, key, fig in figures if (pairs := hidden_pairs(fig))}
    assert not bad, f"lines that can coincide and look the same: {bad}"


def test_the_check_catches_two_equal_lines():
    fig = go.Figure([go.Scatter(x=[1, 2], y=[0.5, 1], name="a"), go.Scatter(x=[1, 2], y=[0.5, 1], name="b")])
    assert hidden_pairs(fig) == [("a", "b")]


def test_equal_lenses_are_drawn_nested(tables):
    """Raw and coda reading exactly the same: both lines stay visible, the later one inside the earlier."""
    lens = tables["logit_lens"].copy()
    coda = lens[lens["lens"] == "coda"]
    lens = pd.concat([lens[lens["lens"] != "raw"], coda.assign(lens="raw")], ignore_index=True)
    fig = lens_agreement_figure(lens)
    coda_t, raw_t = (next(t for t in fig.data if t.name == f"{n}: x_t") for n in ("coda", "raw"))
    np.testing.assert_array_equal(coda_t.y, raw_t.y)
    assert coda_t.line.width > raw_t.line.width and coda_t.marker.size > raw_t.marker.size
    assert coda_t.marker.symbol != raw_t.marker.symbol
    assert not hidden_pairs(fig)


@pytest.mark.parametrize("n", [1, 2, 3, 7])
def test_nested_widths_shrink_in_drawing_order(n):
    styles = [nested(i, n) for i in range(n)]
    widths = [line["width"] for line, _ in styles]
    assert widths == sorted(widths, reverse=True) and len(set(widths)) == n and min(widths) >= 1
    assert all(marker["size"] > line["width"] for line, marker in styles)
