"""Head specialisation (retrofit paper Sec. 12): per-loop retrieval attention of every block head.

At loop t the block must look up x_{t-1} (x_0 = the start) in the table. For every (loop,
block layer, head) the probe records, from the read position (the last prompt token), the
attention mass on the tokens of the table line whose key is x_{t-1} (`target_mass`) and on
the whole table (`table_mass`), reading `loop.{t}.block.{i}.attn.hook_pattern` (the hooked
eager path; one forward per row batch, active loops t <= d only).

A head is a retrieval head at a loop when its target mass is >= `ratio` x its layer's median
(over the layer's heads, same row and loop) on >= `min_frac` of rows. `share` is the head's
part of all heads' target mass at that loop (pooled over rows); `concentration` is the sum of
squares of the two largest shares. Its null ("random rotations"): every row's vector of
per-head masses is circularly shifted by an independent random offset, which keeps each
row's spread of mass but breaks which head carries it; `null_p95` is the 95th percentile of
the concentration over `n_null` such draws.

Tables:
    heads: row_id, depth, loop, layer, head, target_mass, table_mass
    heads__summary: loop, layer, head, retrieval_frac, is_retrieval, share, concentration, null_p95
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from workbench.analysis.headlines.heads import headline
from workbench.devices import device_of
from workbench.errors import WorkbenchError
from workbench.loop.hooks import hook_name
from workbench.loop.positions import last_real_token
from workbench.probes.common import FUNCTION_TABLE, batches, check_loops, iterate, line_spans, require_chase
from workbench.probes.options import Count, Layers, probe_options
from workbench.probes.spec import ProbeSpec


def run(model, tokenizer, rows: list[dict], layers=None, ratio: float = 3.0, min_frac: float = 0.5,
        n_null: int = 200, batch_size: int = 8, seed: int = 0, progress: bool = False) -> dict[str, pd.DataFrame]:
    """Returns {"heads": per (row, loop, layer, head), "heads__summary": per (loop, layer, head)}.

    Args:
        layers: block layers to record (absolute indices); default every block layer.
        ratio, min_frac: the retrieval-head rule.
        n_null: draws of the circular-shift null.
    """
    require_chase(rows)
    attn = getattr(model.config, "_attn_implementation", "eager")
    if attn != "eager":  # other implementations may leave the causal mask to the kernel
        raise WorkbenchError(f"the heads probe needs eager attention; this model was loaded with '{attn}'")
    layers = list(range(model.a, model.b)) if layers is None else [int(i) for i in layers]
    bad = [i for i in layers if not model.a <= i < model.b]
    if bad:
        raise WorkbenchError(f"heads layer {bad[0]} is not a block layer; accepted: {model.a}..{model.b - 1}")
    T = check_loops(model, max(r["depth"] for r in rows))
    device = device_of(model)
    frames = []
    for idx, enc in tqdm(list(batches(tokenizer, rows, batch_size, device)), disable=not progress, desc="heads"):
        frames.append(_batch_masses(model, tokenizer, [rows[i] for i in idx], enc, layers, T))
    frame = pd.concat(frames, ignore_index=True)
    return {"heads": frame, "heads__summary": summary_table(frame, ratio, min_frac, n_null, seed)}


def target_masks(tokenizer, rows: list[dict], seq_len: int, loops: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (target [B, T, S], table [B, S]) 0/1 masks in a left-padded batch of length `seq_len`.

    target[b, t-1] marks the tokens of the table line whose key is x_{t-1} of row b.
    """
    target = torch.zeros(len(rows), loops, seq_len)
    table = torch.zeros(len(rows), seq_len)
    for b, row in enumerate(rows):
        spans, (first, last), n = line_spans(tokenizer, row)
        pad = seq_len - n
        table[b, pad + first:pad + last] = 1
        for t in range(1, loops + 1):
            s, e = spans[iterate(row, t - 1)]
            target[b, t - 1, pad + s:pad + e] = 1
    return target, table


@torch.no_grad()
def _batch_masses(model, tokenizer, rows, enc, layers, T) -> pd.DataFrame:
    mask = enc["attention_mask"]
    S = mask.shape[1]
    target, table = (m.to(mask.device) for m in target_masks(tokenizer, rows, S, T))
    read_pos = last_real_token(mask)
    batch = torch.arange(len(rows), device=mask.device)
    masses: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}

    def record(t, i):
        def hook(pattern, hook):  # [B, H, q, k]
            at_read = pattern[batch, :, read_pos, :].float()            # [B, H, k]
            masses[(t, i)] = ((at_read * target[:, t - 1, None, :]).sum(-1).cpu(),
                              (at_read * table[:, None, :]).sum(-1).cpu())
        return hook

    hooks = [(hook_name("pattern", t, i), record(t, i)) for t in range(1, T + 1) for i in layers]
    with model.hooks(fwd_hooks=hooks):
        model(enc["input_ids"], attention_mask=mask, loops=T)
    records = []
    for b, row in enumerate(rows):
        for t in range(1, row["depth"] + 1):
            for i in layers:
                tm, tb = masses[(t, i)]
                records += [(row["row_id"], row["depth"], t, i, h, float(tm[b, h]), float(tb[b, h]))
                            for h in range(tm.shape[1])]
    return pd.DataFrame.from_records(records, columns=["row_id", "depth", "loop", "layer", "head",
                                                       "target_mass", "table_mass"])


def summary_table(frame: pd.DataFrame, ratio: float = 3.0, min_frac: float = 0.5, n_null: int = 200,
                  seed: int = 0) -> pd.DataFrame:
    """Returns loop, layer, head, retrieval_frac, is_retrieval, share, concentration, null_p95."""
    rng = np.random.default_rng(seed)
    out = []
    for loop, g in frame.groupby("loop"):
        median = g.groupby(["row_id", "layer"])["target_mass"].transform("median")
        g = g.assign(hit=g["target_mass"] >= ratio * median)
        per_head = g.groupby(["layer", "head"]).agg(retrieval_frac=("hit", "mean"), mass=("target_mass", "sum"))
        total = per_head["mass"].sum()
        per_head["share"] = per_head["mass"] / total if total > 0 else 0.0
        per_head["is_retrieval"] = per_head["retrieval_frac"] >= min_frac
        wide = g.pivot_table(index="row_id", columns=["layer", "head"], values="target_mass").to_numpy()
        per_head["concentration"] = concentration(per_head["share"].to_numpy())
        per_head["null_p95"] = float(np.percentile(shift_null(wide, n_null, rng), 95))
        out.append(per_head.drop(columns="mass").reset_index().assign(loop=int(loop)))
    cols = ["loop", "layer", "head", "retrieval_frac", "is_retrieval", "share", "concentration", "null_p95"]
    return pd.concat(out, ignore_index=True)[cols]


def concentration(shares: np.ndarray) -> float:
    """Sum of squares of the two largest shares."""
    top = np.sort(np.asarray(shares, dtype=float))[::-1][:2]
    return float((top ** 2).sum())


def shift_null(masses: np.ndarray, n_null: int, rng: np.random.Generator) -> np.ndarray:
    """Concentrations after circularly shifting each row's head-mass vector [R, M] by a random offset."""
    R, M = masses.shape
    cols = np.arange(M)
    out = np.empty(n_null)
    for k in range(n_null):
        shifts = rng.integers(0, M, size=R)
        rolled = masses[np.arange(R)[:, None], (cols[None, :] + shifts[:, None]) % M]
        pooled = rolled.sum(0)
        out[k] = concentration(pooled / pooled.sum()) if pooled.sum() > 0 else 0.0
    return out


def summarize(tables: dict[str, pd.DataFrame]) -> dict:
    """Headline numbers: retrieval heads, concentration and its null per loop."""
    s = tables["heads__summary"]
    out = {}
    for loop, g in s.groupby("loop"):
        top = g.sort_values("share", ascending=False).head(3)
        out[str(int(loop))] = {
            "retrieval_heads": [f"L{int(r.layer)}H{int(r.head)}" for r in g[g["is_retrieval"]].itertuples()],
            "top_share": [[f"L{int(r.layer)}H{int(r.head)}", round(float(r.share), 4)] for r in top.itertuples()],
            "concentration": round(float(g["concentration"].iloc[0]), 4),
            "null_p95": round(float(g["null_p95"].iloc[0]), 4),
        }
    return {"per_loop": out, "rows": int(tables["heads"]["row_id"].nunique()), "headline": headline(tables).to_dict()}


@probe_options
class Options:
    """The heads probe's options (`run`'s keywords), checked before any probe of a battery runs."""

    layers: Layers = None
    ratio: float = 3.0
    min_frac: float = 0.5
    n_null: int = 200
    batch_size: Count = 8
    seed: int = 0
    progress: bool = False


SPEC = ProbeSpec(
    name="heads", parts=("summary",), run=run, summarize=summarize,
    needs=("prompt", "depth", "table", "start", FUNCTION_TABLE),
    options=Options,
)
