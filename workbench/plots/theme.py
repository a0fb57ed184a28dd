"""The one Plotly theme for every workbench figure: `THEME` (a template) and `apply_theme(fig)`.

One place for fonts, colours and margins, so that figures from different probes sit side by
side in a report without looking like they came from different tools. The colour sequence
is Okabe-Ito (distinguishable under the common colour-vision deficiencies).
"""

from __future__ import annotations

import plotly.graph_objects as go
import plotly.io as pio

# Okabe & Ito (2008), without black (kept for text and reference lines).
COLORWAY = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442"]
INK = "#222222"
GRID = "#E5E5E5"
FONT = "Inter, Helvetica Neue, Arial, sans-serif"

_AXIS = dict(showgrid=True, gridcolor=GRID, zeroline=False, linecolor=INK, ticks="outside",
             tickcolor=INK, showline=True, mirror=False, title=dict(standoff=8))

THEME = go.layout.Template(
    layout=go.Layout(
        font=dict(family=FONT, size=13, color=INK),
        title=dict(font=dict(size=16), x=0.0, xanchor="left"),
        colorway=COLORWAY,
        paper_bgcolor="white",
        plot_bgcolor="white",
        xaxis=_AXIS,
        yaxis=_AXIS,
        legend=dict(bgcolor="rgba(255,255,255,0.8)", borderwidth=0),
        hoverlabel=dict(font=dict(family=FONT)),
        margin=dict(l=70, r=30, t=70, b=60),
    )
)
pio.templates["workbench"] = THEME  # usable by name as well: template="workbench"


def apply_theme(fig: go.Figure) -> go.Figure:
    """Returns `fig` with the workbench template applied (in place, for chaining)."""
    fig.update_layout(template=THEME)
    return fig
