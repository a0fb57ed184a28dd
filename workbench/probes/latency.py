"""Latency: per-loop cost at a fixed sequence length, and the one-pass forced read against per-depth reruns.

All timings come from one run on one fixed batch (rows of the most common token length; the
median of `repeats` calls after a warm-up), so only their ratios are meant to travel:
    loops        a forward to loop t (Coda and full-vocabulary head once, at the end), t = 1..T;
                 ratio = time / time at t = 1;
    forced_read  one `read` to T reading every loop through the Coda (candidates only);
                 ratio = time / forward to T;
    reruns       what a naive sweep costs: a forward to t for every t = 1..T, summed;
                 ratio = reruns / forced_read.
`predicted_ratio` is the same ratio from a cost model counting decoder layers (each a layer's
parameter count per token) and the full-vocabulary head (d_model x vocab per token); the
attention's quadratic term is ignored, which is small at prompt lengths.

Table:
    latency: what ("loops" | "forced_read" | "reruns"), loops, seconds, ratio, predicted_ratio
"""

from __future__ import annotations

import statistics
import time
from collections import Counter

import numpy as np
import pandas as pd
import torch

from workbench.analysis.headlines.latency import headline
from workbench.devices import device_of
from workbench.probes.common import (
    ONE_TOKEN,
    check_loops,
    default_loops,
    require_symbols,
    row_candidates,
    shared_candidates,
    token_lengths,
)
from workbench.probes.options import Count, probe_options
from workbench.probes.spec import ProbeSpec
from workbench.tasks.reader import encode_prompts


def run(model, tokenizer, rows: list[dict], loops: int | None = None, batch_size: int = 8,
        repeats: int = 3) -> pd.DataFrame:
    """Returns the latency table (see the module docstring).

    Args:
        loops: T (default the rows' max depth; `common.default_loops` when a row gives none).
        batch_size: rows in the fixed batch.
        repeats: timed calls per measurement (the median is kept).
    """
    require_symbols(rows)   # the forced read scores candidates: rows read exactly have none
    T = check_loops(model, loops or default_loops(model, rows))
    lengths = token_lengths(tokenizer, rows)
    common = Counter(lengths).most_common(1)[0][0]
    batch = [r for r, n in zip(rows, lengths) if n == common][:batch_size]
    device = device_of(model)
    enc = encode_prompts(tokenizer, [r["prompt"] for r in batch]).to(device)
    ids, mask = enc["input_ids"], enc["attention_mask"]
    cands = shared_candidates(row_candidates(tokenizer, batch).to(device))
    forward = [_time(lambda t=t: model(ids, attention_mask=mask, loops=t), repeats, device) for t in range(1, T + 1)]
    forced = _time(lambda: model.read(ids, attention_mask=mask, loops=T, candidates=cands), repeats, device)
    reruns = sum(forward)
    cost = CostModel.of(model)
    records = [("loops", t, s, s / forward[0], cost.forward(t) / cost.forward(1)) for t, s in enumerate(forward, 1)]
    records.append(("forced_read", T, forced, forced / forward[-1], cost.read(T) / cost.forward(T)))
    records.append(("reruns", T, reruns, reruns / forced, sum(cost.forward(t) for t in range(1, T + 1)) / cost.read(T)))
    frame = pd.DataFrame.from_records(records, columns=["what", "loops", "seconds", "ratio", "predicted_ratio"])
    return frame.assign(batch_size=len(batch), seq_len=int(ids.shape[1]))


class CostModel:
    """Per-token cost in parameter-multiplies: decoder layers and the full-vocabulary head."""

    def __init__(self, a: int, block: int, coda: int, layer: float, head: float):
        self.a, self.block, self.coda, self.layer, self.head = a, block, coda, layer, head

    @classmethod
    def of(cls, model) -> "CostModel":
        layer = sum(p.numel() for p in model.layers[model.a].parameters())
        head = model.base.lm_head.weight.numel()
        return cls(model.a, model.b - model.a, model.n_layers - model.b, float(layer), float(head))

    def forward(self, t: int) -> float:
        """A forward to loop t: Prelude, t blocks, the Coda once, the head at every position."""
        return (self.a + t * self.block + self.coda) * self.layer + self.head

    def read(self, t: int) -> float:
        """A forced read to loop t: the Coda at every loop, the head on a few candidates only."""
        return (self.a + t * (self.block + self.coda)) * self.layer


@torch.no_grad()
def _time(fn, repeats: int, device) -> float:
    fn()  # warm-up
    times = []
    for _ in range(max(1, repeats)):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return float(statistics.median(times))


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def summarize(tables: dict[str, pd.DataFrame]) -> dict:
    """Headline numbers: seconds per extra loop, and the measured and predicted ratios."""
    f = tables["latency"]
    loops = f[f["what"] == "loops"]
    slope = float(np.polyfit(loops["loops"], loops["seconds"], 1)[0]) if len(loops) > 1 else float("nan")
    pick = lambda w: f[f["what"] == w].iloc[0]  # noqa: E731
    return {"seconds_per_loop": round(slope, 5), "seconds_loop1": round(float(loops["seconds"].iloc[0]), 5),
            "forced_read_over_forward": round(float(pick("forced_read")["ratio"]), 3),
            "reruns_over_forced_read": round(float(pick("reruns")["ratio"]), 3),
            "reruns_over_forced_read_predicted": round(float(pick("reruns")["predicted_ratio"]), 3),
            "batch_size": int(f["batch_size"].iloc[0]), "seq_len": int(f["seq_len"].iloc[0]),
            "headline": headline(tables).to_dict()}


@probe_options
class Options:
    """The latency probe's options (`run`'s keywords), checked before any probe of a battery runs."""

    loops: int | None = None
    batch_size: Count = 8
    repeats: Count = 3


SPEC = ProbeSpec(
    name="latency", run=run, summarize=summarize,
    needs=("prompt", "symbols", ONE_TOKEN),
    requires=("dense_loop_cost",),
    options=Options,
)
