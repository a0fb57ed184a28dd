"""The lens on your own prompts drawn: per prompt, a loop x position map of the top token and its probability.

`lens_figure(frame, prompt_index, lens)` draws one prompt's reading through one lens (`workbench.lenses.lens`'s
tidy frame); `lens_page(frame, title)` is the offline HTML page `workbench lens --html` writes: plotly.js
embedded once, every text escaped, one figure per prompt and lens.
"""

from __future__ import annotations

import html
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

from workbench.guard import FILES, OutputKind
from workbench.plots.theme import apply_theme

CAPTION = ("Each cell is one loop (row) at one position of the prompt (column, labelled by the token there): the "
           "token the lens ranks first for the next position, coloured by its probability. The coda lens at the "
           "last loop is the model's own next-token distribution; a column whose top token settles early is one "
           "the later loops only confirm.")



def lens_page_file(path: Path) -> bool:
    """Whether `path` is a page the workbench generated, as `lens_page` is: HTML whose generator tag names the
    workbench."""
    if not path.name.endswith(".html"):
        return False
    try:
        return b"name='generator' content='workbench" in path.read_bytes()
    except OSError:
        return False


# What `lens --html` writes, handed to the output guard: one HTML file, replaced only when the workbench generated it.
LENS_OUTPUT = OutputKind("lens page", FILES, owns=lens_page_file)

def lens_figure(frame: pd.DataFrame, prompt_index: int, lens: str = "coda") -> go.Figure:
    """Loop x position heatmap of the top-1 token (text) and its probability (colour) for one prompt and lens."""
    part = frame[(frame.prompt_index == prompt_index) & (frame.lens == lens) & (frame.kind == "top") & (frame.k == 0)]
    if part.empty:
        raise ValueError(f"no '{lens}' lens rows for prompt {prompt_index}")
    positions = sorted(part.position.unique())
    loops = sorted(part.loop.unique())
    labels = {int(r.position): r.input_token for r in part.drop_duplicates("position").itertuples()}
    z = np.full((len(loops), len(positions)), np.nan)
    text = np.full((len(loops), len(positions)), "", dtype=object)
    col, row = {p: j for j, p in enumerate(positions)}, {t: i for i, t in enumerate(loops)}
    for r in part.itertuples():
        z[row[r.loop], col[r.position]] = r.prob
        text[row[r.loop], col[r.position]] = _show(r.token)
    x = [f"{p}:{_show(labels[p])}" for p in positions]
    fig = go.Figure(go.Heatmap(
        z=z, x=x, y=[str(t) for t in loops], text=text, texttemplate="%{text}", zmin=0, zmax=1,
        colorscale="Blues", colorbar=dict(title="p(top)"),
        hovertemplate="loop %{y}, position %{x}<br>top token %{text}: p = %{z:.3f}<extra></extra>"))
    fig.update_layout(title=f"Prompt {prompt_index + 1}, {lens} lens: top token per loop and position",
                      xaxis_title="position: token", yaxis_title="loop", height=max(260, 60 + 40 * len(loops)))
    return apply_theme(fig)


def lens_page(frame: pd.DataFrame, title: str = "Per-loop lens") -> str:
    """The offline HTML page of a lens reading: a figure per prompt and lens, the prompts escaped."""
    prompts = frame.attrs.get("prompts") or []
    body = [f"<h1>{html.escape(title)}</h1><p class='caption'>{html.escape(CAPTION)}</p>"]
    lenses = [n for n in ("coda", "raw", "tuned") if n in set(frame.lens)]
    for i in sorted(frame.prompt_index.unique()):
        text = prompts[i] if i < len(prompts) else ""
        body.append(f"<h2>Prompt {i + 1}</h2><pre>{html.escape(text)}</pre>")
        for name in lenses:
            fig = lens_figure(frame, int(i), name)
            body.append("<div class='figure'>" + fig.to_html(
                full_html=False, include_plotlyjs=False, div_id=f"lens-{i}-{name}",
                config={"displaylogo": False, "responsive": True}) + "</div>")
    return ("<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'><meta name='generator' content='workbench lens'>"
            f"<title>{html.escape(title)}</title><style>body{{font-family:sans-serif;max-width:1100px;margin:2em auto}}"
            "pre{background:#f6f6f6;padding:.6em;white-space:pre-wrap}.caption{color:#444}</style>"
            f"<script type='text/javascript'>{get_plotlyjs()}</script></head><body>{''.join(body)}</body></html>\n")


def _show(token: str) -> str:
    """A token as a label: newlines and tabs visible, leading spaces as a dot."""
    return token.replace("\n", "⏎").replace("\t", "⇥").replace(" ", "·")
