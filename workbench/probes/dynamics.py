"""dynamics: where do the loops go? Step sizes, step angles and fixed points per pass and block layer, head stability.

From one forward per row batch to T (default the model's max_loops, so passes inside and beyond
the trained support are read; `workbench.probes.passes`), at the read position of every pass t
and every block layer i (`loop.{t}.block.{i}.hook_resid_post`; the last block layer's output is
the state h_t):

    rel_step    ||h_{t+1} - h_t|| / ||h_t||                      (t = 1..T-1)
    angle_deg   angle between the steps h_t - h_{t-1} and h_{t+1} - h_t   (t = 2..T-1)
    dist_last   ||h_t - h_T|| / ||h_T||, the distance to the last pass's state
    norm        ||h_t||, the state's norm
    norm_growth ||h_t|| / ||h_{t-1}||, the norm's growth over one step   (t = 2..T)

and per head the Jensen-Shannon divergence (nats) between the read position's attention rows of
consecutive passes t and t+1 (`attn.hook_pattern`; eager attention; skipped with `heads=False`
or on a model without pattern hooks).

Each (row, layer) is classed from its step sizes s_t = ||h_{t+1} - h_t|| past the row's depth:
the contraction rate rho = (s_{T-1} / s_{t0}) ^ (1 / (T-1-t0)), t0 = min(d, T-2) (the geometric
mean ratio of consecutive steps; exactly lambda for a linear contraction h_{t+1} - h* =
lambda (h_t - h*)), and

    settling  rho <= 1 - band          the steps shrink geometrically: the state approaches a fixed point
    drifting  rho >= 1 / (1 - band)    the steps grow
    marginal  otherwise                steps of about constant size (an orbit, or a slow walk)

(docs/analyses.md; band = 0.1: rho <= 0.9 settling, rho >= 1.11 drifting). A row whose steps
are all zero is settling (rho = 0). A row whose depth is not given (depth 0, a user's row,
`workbench.tasks.user`) is classed from pass 1 (t0 = 1) and its passes' past_depth is None.

Tables:
    dynamics: row_id, depth, layer, loop, rel_step, angle_deg, dist_last, norm, norm_growth, past_depth,
        beyond_support (norm and norm_growth are new: a table written before them reads without them)
    dynamics__rows: row_id, depth, layer, t0, rate, last_rel_step, cls — `layer` the block layer; the
        state's class is the last block layer's
    dynamics__heads: loop (t: passes t and t+1), layer, head, js_mean, js_max, n
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from workbench.analysis.headlines.dynamics import CLASSES, headline
from workbench.errors import WorkbenchError
from workbench.loop.hooks import hook_name
from workbench.probes.common import ONE_TOKEN, check_loops, require_symbols
from workbench.probes.options import Count, Layers, probe_options
from workbench.probes.passes import read_passes
from workbench.probes.spec import ProbeSpec


def run(model, tokenizer, rows: list[dict], loops: int | None = None, layers=None, heads: bool = True,
        band: float = 0.1, support: int | None = None, batch_size: int = 8,
        progress: bool = False) -> dict[str, pd.DataFrame]:
    """Returns {"dynamics", "dynamics__rows", "dynamics__heads"} (see the module docstring).

    Args:
        loops: T (default the model's max_loops, at least 3).
        layers: block layers (absolute indices); default every block layer.
        heads: read the attention patterns (eager attention only).
        band: the classification band.
        support: the trained support, marking passes beyond it (the battery passes the checkpoint's).
    """
    require_symbols(rows)
    T = check_loops(model, loops or max(3, model.max_loops))
    if T < 3:
        raise WorkbenchError(f"dynamics needs at least 3 passes (two steps), got loops={T}")
    if not 0 < band < 1:
        raise WorkbenchError(f"dynamics band {band} must lie strictly between 0 and 1")
    layers = list(range(model.a, model.b)) if layers is None else [int(i) for i in layers]
    bad = [i for i in layers if not model.a <= i < model.b]
    if bad or not layers:
        raise WorkbenchError(f"dynamics layer {bad[0] if bad else '(none)'} is not a block layer; accepted: "
                             f"{model.a}..{model.b - 1}")
    patterns = heads and hook_name("pattern", 1, layers[0]) in model.hook_dict
    if patterns and getattr(model.config, "_attn_implementation", "eager") != "eager":
        raise WorkbenchError("the dynamics probe reads attention patterns with eager attention only; "
                             "give heads = false for this model")
    passes = read_passes(model, tokenizer, rows, T, batch_size, progress, layers=layers, patterns=patterns,
                         desc="dynamics")
    steps, classes = [], []
    for i in layers:
        s, c = layer_tables(rows, passes.layers[i], i, band, support)
        steps.append(s)
        classes.append(c)
    return {"dynamics": pd.concat(steps, ignore_index=True), "dynamics__rows": pd.concat(classes, ignore_index=True),
            "dynamics__heads": heads_table(passes.pattern_js)}


def classify(rate: float, band: float = 0.1) -> str:
    """settling / marginal / drifting from the contraction rate (docs/analyses.md)."""
    if rate <= 1 - band:
        return "settling"
    if rate >= 1 / (1 - band):
        return "drifting"
    return "marginal"


def contraction_rate(step_norms: np.ndarray, t0: int) -> float:
    """(s_{T-1} / s_{t0}) ** (1 / (T-1-t0)) over step norms s_1..s_{T-1} (1-based t0); 0 when the steps vanish."""
    first, last, n = step_norms[t0 - 1], step_norms[-1], len(step_norms) - t0
    if first == 0:
        return 0.0 if last == 0 else float("inf")
    return float((last / first) ** (1.0 / n))


def layer_tables(rows: list[dict], h: np.ndarray, layer: int, band: float,
                 support: int | None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per row and pass, per row) tables of one block layer from its read-position states [R, T, D]."""
    R, T, _ = h.shape
    diff = h[:, 1:] - h[:, :-1]                                          # [R, T-1, D]: step t -> t+1
    s = np.linalg.norm(diff, axis=-1)                                    # [R, T-1]
    norm = np.linalg.norm(h, axis=-1)                                    # [R, T]
    rel = s / np.maximum(norm[:, :-1], 1e-30)
    dot = (diff[:, 1:] * diff[:, :-1]).sum(-1)
    cos = dot / np.maximum(s[:, 1:] * s[:, :-1], 1e-300)
    angle = np.degrees(np.arccos(np.clip(cos, -1, 1)))
    angle[(s[:, 1:] == 0) | (s[:, :-1] == 0)] = np.nan
    dist = np.linalg.norm(h - h[:, -1:], axis=-1) / np.maximum(norm[:, -1:], 1e-30)
    growth = norm_growth(norm)
    records, per_row = [], []
    for r, row in enumerate(rows):
        d = row["depth"]
        for t in range(1, T + 1):
            records.append((row["row_id"], d, layer, t, rel[r, t - 1] if t < T else np.nan,
                            angle[r, t - 2] if 2 <= t < T else np.nan, dist[r, t - 1], norm[r, t - 1],
                            growth[r, t - 2] if t >= 2 else np.nan, t > d if d >= 1 else None,
                            support is not None and t > support))
        t0 = max(1, min(d, T - 2))   # a depth not given (0): from pass 1
        rate = contraction_rate(s[r], t0)
        per_row.append((row["row_id"], d, layer, t0, rate, float(rel[r, -1]), classify(rate, band)))
    return (pd.DataFrame.from_records(records, columns=["row_id", "depth", "layer", "loop", "rel_step", "angle_deg",
                                                        "dist_last", "norm", "norm_growth", "past_depth",
                                                        "beyond_support"]),
            pd.DataFrame.from_records(per_row, columns=["row_id", "depth", "layer", "t0", "rate", "last_rel_step",
                                                        "cls"]))


def norm_growth(norm: np.ndarray) -> np.ndarray:
    """||h_t|| / ||h_{t-1}|| [R, T-1] from the state norms [R, T]; inf where a zero state grows, nan where it stays 0."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return norm[:, 1:] / norm[:, :-1]


def heads_table(js: dict[int, np.ndarray]) -> pd.DataFrame:
    """Per (pass pair, layer, head): mean and max JS divergence over rows."""
    records = []
    for layer, v in js.items():                                          # [R, T-1, H]
        for t in range(v.shape[1]):
            for h in range(v.shape[2]):
                records.append((t + 1, layer, h, float(v[:, t, h].mean()), float(v[:, t, h].max()), v.shape[0]))
    return pd.DataFrame.from_records(records, columns=["loop", "layer", "head", "js_mean", "js_max", "n"])


def summarize(tables: dict[str, pd.DataFrame]) -> dict:
    """Numbers for summary.json: class counts and median rate per layer, mean step per pass, head divergence."""
    r = tables["dynamics__rows"]
    per_layer = {str(int(layer)): {"median_rate": round(float(g["rate"].median()), 4),
                                   **{c: int((g["cls"] == c).sum()) for c in CLASSES}}
                 for layer, g in r.groupby("layer")}
    f = tables["dynamics"]
    state = f[f["layer"] == f["layer"].max()]
    steps = {str(int(t)): round(float(v), 4) for t, v in state.groupby("loop")["rel_step"].mean().dropna().items()}
    # a table written before the norm columns reads as it did, without the key
    growth = ({"state_norm_growth_by_loop": {str(int(t)): round(float(v), 4)
                                             for t, v in state.groupby("loop")["norm_growth"].mean().dropna().items()}}
              if "norm_growth" in state else {})
    h = tables.get("dynamics__heads")
    heads = {str(int(t)): round(float(v), 5) for t, v in h.groupby("loop")["js_mean"].mean().items()} \
        if h is not None and len(h) else {}
    return {"per_layer": per_layer, "state_rel_step_by_loop": steps, **growth, "head_js_by_loop": heads,
            "headline": headline(tables).to_dict()}


@probe_options
class Options:
    """The dynamics probe's options (`run`'s keywords), checked before any probe of a battery runs."""

    loops: int | None = None
    layers: Layers = None
    heads: bool = True
    band: float = 0.1
    support: int | None = None
    batch_size: Count = 8
    progress: bool = False


SPEC = ProbeSpec(
    name="dynamics", parts=("heads", "rows"), run=run, summarize=summarize,
    needs=("prompt", "answer", "symbols", ONE_TOKEN),
    options=Options,
)
