"""patching: where the answer is made, by exact activation patching over loop x block layer x position x component.

Every clean row gets corrupted twins that differ in one fact the answer depends on, paired by construction
(`workbench.probes.pairs.corrupt_pairs`: the entry and start corruptions, and the position classes below).
The metric is the logit difference LD = logit(clean answer) - logit(corrupted answer)
at the read position after T loops (T = the row's depth; the model's own count when it gives none).
For each loop t <= T, each block layer i and each component

    resid   loop.{t}.block.{i}.hook_resid_post   the residual stream after layer i
    attn    loop.{t}.block.{i}.attn.hook_out     the attention output of layer i (before the residual add)
    mlp     loop.{t}.block.{i}.mlp.hook_out      the MLP output of layer i

the clean run's activation is written into the corrupted run at one class of positions

    edited    the edited text's tokens (the changed table line, or the start symbol)
    entries   the rest of the table: its header, the other lines and the breaks between them
    start     the start symbol's tokens (empty for the start corruption, where they are the edited ones)
    question  the rest of the question line and the answer cue, up to the read position
    other     (a user's row) every token but the edited ones and the read position
    read      the read position (the last token)

A user's row (`workbench rows --from`) brings its own twin as `corrupt` ({"prompt", "answer"}: the same token
count, another answer among the candidates): corruption "user", classes edited (the tokens that differ), other
and read.

and the corrupted run's LD is read after T loops. A cell's recovered share is
mean(LD_patched - LD_corrupted) / mean(LD_clean - LD_corrupted) over the pairs (a ratio of means, so
pairs where the model barely separates the answers weigh little), with a 95% row-bootstrap interval
(pairs clustered by their clean row). 1 means the clean activation at that cell alone restores the clean
answer's margin; 0 means it carries nothing the corruption changed.

Exactness and cost: patches at positions >= p never change activations before p (causal attention), so
for a retrofit each position class runs only its suffix, on a KV cache of the corrupted prefix, with every
cell of the grid a replica in one batch (`prefix_cache`; the same numbers as recomputing the whole
prompt, tested). Native looped models recompute the whole prompt.

Tables:
    patching           pair_id, row_id, depth, corruption, step, loop, layer, position, component,
                       n_positions, ld_patched, ld_clean, ld_corrupted: one row per (pair, cell)
    patching__grid     corruption, loop, layer, position, component, recovered, low, high, n: the grid
    patching__steps    step, loop, recovered, low, high, n: the entry corruption's read-position state
                       (resid after the block's last layer) patched at loop t, per step k
    patching__pairs    pair_id, row_id, depth, corruption, step, edited, clean_answer, corrupted_answer,
                       ld_clean, ld_corrupted
"""

from __future__ import annotations

import copy
import time

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from workbench.analysis.headlines.patching import first_recovering, headline
from workbench.devices import device_of
from workbench.errors import WorkbenchError
from workbench.loop.hooks import hook_name
from workbench.probes.common import check_loops, default_loops
from workbench.probes.options import Count, Layers, Names, probe_options
from workbench.probes.pairs import CORRUPT_TWIN, CORRUPTIONS, POSITIONS, Pair, corrupt_pairs, require_pairs
from workbench.probes.spec import ProbeSpec

COMPONENTS = ("resid", "attn", "mlp")
SITE_OF = {"resid": "block_resid", "attn": "attn_out", "mlp": "mlp_out"}
N_BOOT = 2000


def site(component: str, loop: int, layer: int) -> str:
    """The hook point of a grid cell (`workbench.loop.hooks`)."""
    if component not in SITE_OF:
        raise WorkbenchError(f"patching component '{component}' is unknown; accepted: {', '.join(COMPONENTS)}")
    return hook_name(SITE_OF[component], loop, layer)


# ----------------------------------------------------------------------------- the runs
def block_layers(model, layers=None) -> list[int]:
    """The block layers of the grid (default every one), checked."""
    every = list(range(model.a, model.b))
    if layers is None:
        return every
    out = [int(i) for i in layers]
    bad = [i for i in out if i not in every]
    if bad:
        raise WorkbenchError(f"patching layer {bad[0]} is not a block layer; accepted: {model.a}..{model.b - 1}")
    return out


def check_choices(values, accepted, what: str) -> list[str]:
    """`values` as a list, each one of `accepted`, at least one; else one line naming the first bad one."""
    out = list(values)
    bad = [v for v in out if v not in accepted]
    if bad or not out:
        raise WorkbenchError(f"{what} {bad[0] if bad else '(none)'!r} is unknown; accepted: {', '.join(accepted)}")
    return out


def check_components(components) -> list[str]:
    return check_choices(components, COMPONENTS, "patching component")


def loops_of(model, pair: Pair, rows_loops: int) -> int:
    return check_loops(model, pair.row["depth"] if pair.row.get("depth", 0) >= 1 else rows_loops)


def margins(model, ids: torch.Tensor, pair: Pair, T: int) -> float:
    """LD after T loops of one unpadded prompt: logit(clean answer) - logit(corrupted answer) at the last token."""
    device = device_of(model)
    scores = model.read_final(ids.to(device), attention_mask=torch.ones_like(ids).to(device), loops=T,
                              candidates=pair.cands.to(device))[0, -1]
    return float(scores[pair.answer] - scores[pair.corrupted])


def clean_activations(model, pair: Pair, T: int, cells) -> dict[str, torch.Tensor]:
    """The clean run's activation [seq, d] at every cell's hook point."""
    saved: dict[str, torch.Tensor] = {}

    def save(x, hook):
        saved[hook.name] = x[0].detach().clone()

    names = sorted({site(c, t, i) for t, i, c in cells})
    device = device_of(model)
    ids = pair.clean_ids.to(device)
    with torch.no_grad(), model.hooks(fwd_hooks=[(n, save) for n in names]):
        model.read_final(ids, attention_mask=torch.ones_like(ids), loops=T, candidates=pair.cands.to(device))
    return saved


def prefix_cache(model) -> bool:
    """Whether suffix-only recomputation on a KV cache applies: a model with one cache slot per loop and layer
    (a retrofit; native models recompute)."""
    return "loop_kv_cache" in model.supports


@torch.no_grad()
def exact_cells(model, pair: Pair, T: int, cells, position: str, clean: dict, batch_size: int = 48,
                use_prefix: bool = True) -> np.ndarray:
    """LD_patched per cell [(loop, layer, component)] with the clean activation written at `position`'s tokens.

    Every cell is one replica of the corrupted prompt in a batch; on a retrofit only the tokens from the class's
    first position on are run, after a KV cache of the corrupted prefix (exact: causal attention)."""
    where = pair.positions[position]
    device = device_of(model)
    first = min(where) if use_prefix and prefix_cache(model) else 0
    rel = torch.tensor([p - first for p in where], device=device)
    at = torch.tensor(where, device=device)
    ids = pair.corrupt_ids.to(device)
    S = ids.shape[1]
    base_cache = None
    if first > 0:
        base_cache = model.new_cache(T)
        model(ids[:, :first], torch.ones(1, first, dtype=torch.long, device=device), loops=T, cache=base_cache)
    out = np.empty(len(cells))
    for start in range(0, len(cells), batch_size):
        chunk = cells[start:start + batch_size]
        n = len(chunk)
        hooks = [(site(c, t, i), _writer(k, rel, clean[site(c, t, i)][at])) for k, (t, i, c) in enumerate(chunk)]
        suffix = ids[:, first:].expand(n, -1)
        with model.hooks(fwd_hooks=hooks):
            if base_cache is not None:
                kv = copy.deepcopy(base_cache)
                kv.batch_repeat_interleave(n)
                logits = model(suffix, torch.ones(n, S, dtype=torch.long, device=device), loops=T, cache=kv).logits
                scores = logits[:, -1, pair.cands.to(device)]
            else:
                scores = model.read_final(suffix, attention_mask=torch.ones_like(suffix), loops=T,
                                          candidates=pair.cands.to(device))[:, -1]
        out[start:start + n] = (scores[:, pair.answer] - scores[:, pair.corrupted]).double().cpu().numpy()
    return out


def _writer(replica: int, rel: torch.Tensor, value: torch.Tensor):
    def hook(x, hook):
        x = x.clone()
        x[replica, rel] = value.to(x.dtype)
        return x
    return hook


def grid_cells(T: int, layers: list[int], components: list[str]) -> list[tuple[int, int, str]]:
    return [(t, i, c) for t in range(1, T + 1) for i in layers for c in components]


def pair_record(pair: Pair, ld_clean: float, ld_corrupted: float) -> dict:
    return dict(pair_id=pair.pair_id, row_id=pair.row["row_id"], depth=int(pair.row["depth"]),
                corruption=pair.corruption, step=int(pair.step), edited=pair.edited, clean_answer=pair.row["answer"],
                corrupted_answer=pair.corrupted_answer, ld_clean=ld_clean, ld_corrupted=ld_corrupted)


def run(model, tokenizer, rows: list[dict], corruptions=CORRUPTIONS, positions=POSITIONS, components=COMPONENTS,
        layers=None, loops: int | None = None, batch_size: int = 48, seed: int = 0,
        progress: bool = False) -> dict[str, pd.DataFrame]:
    """Returns the four tables of the module docstring.

    Args:
        corruptions: which twins to build ("entry", "start").
        positions, components: the grid's position classes and components (all by default).
        layers: block layers of the grid (absolute indices; default every block layer).
        loops: T for rows without a depth (default the model's own count); a row with a depth is read at it.
        batch_size: grid cells run together as replicas of one prompt.
        seed: the corrupted symbols.
    """
    require_pairs(rows)
    layers, components = block_layers(model, layers), check_components(components)
    positions = _check_positions(positions)
    pairs, skipped = corrupt_pairs(tokenizer, rows, [c for c in corruptions], seed)
    if not pairs:
        raise WorkbenchError(f"patching built no corrupted twin from {len(rows)} rows ({skipped} skipped)")
    fallback = loops or default_loops(model, rows)
    records, pair_rows = [], []
    bar = tqdm(total=len(pairs) * len(positions), disable=not progress, desc="patching")
    started = time.perf_counter()
    for pair in pairs:
        T = loops_of(model, pair, fallback)
        cells = grid_cells(T, layers, components)
        ld_clean, ld_corr = margins(model, pair.clean_ids, pair, T), margins(model, pair.corrupt_ids, pair, T)
        pair_rows.append(pair_record(pair, ld_clean, ld_corr))
        clean = clean_activations(model, pair, T, cells)
        for position in positions:
            bar.update(1)
            if not pair.positions[position]:
                continue
            lds = exact_cells(model, pair, T, cells, position, clean, batch_size)
            records += [dict(pair_id=pair.pair_id, row_id=pair.row["row_id"], depth=int(pair.row["depth"]),
                             corruption=pair.corruption, step=int(pair.step), loop=t, layer=i, position=position,
                             component=c, n_positions=len(pair.positions[position]), ld_patched=float(ld),
                             ld_clean=ld_clean, ld_corrupted=ld_corr)
                        for (t, i, c), ld in zip(cells, lds)]
    bar.close()
    frame = pd.DataFrame.from_records(records)
    frame.attrs["wall_s"] = time.perf_counter() - started
    last = model.b - 1
    return {"patching": frame, "patching__grid": grid(frame, seed),
            "patching__steps": steps_table(frame, last, seed), "patching__pairs": pd.DataFrame(pair_rows)}


def _check_positions(positions) -> list[str]:
    return check_choices(positions, POSITIONS, "patching position class")


# ----------------------------------------------------------------------------- the grid and its intervals
def ratio_of_means(frame: pd.DataFrame, keys: list[str], value: str = "ld_patched", seed: int = 0) -> pd.DataFrame:
    """Per group of `keys`: mean(value - LD_corrupted) / mean(LD_clean - LD_corrupted), with a 95% bootstrap over
    clean rows (every group resampled with the same draws), and n pairs."""
    if frame.empty:
        return pd.DataFrame(columns=[*keys, "recovered", "low", "high", "n"])
    rows = sorted(frame["row_id"].unique())
    index = {r: j for j, r in enumerate(rows)}
    draws = np.random.default_rng(seed).integers(0, len(rows), size=(N_BOOT, len(rows)))
    weights = np.zeros((N_BOOT, len(rows)))
    for b in range(N_BOOT):
        weights[b] = np.bincount(draws[b], minlength=len(rows))
    out = []
    for key, g in frame.groupby(keys, sort=True):
        num = np.zeros(len(rows))
        den = np.zeros(len(rows))
        cols = g["row_id"].map(index).to_numpy()
        np.add.at(num, cols, (g[value] - g["ld_corrupted"]).to_numpy())
        np.add.at(den, cols, (g["ld_clean"] - g["ld_corrupted"]).to_numpy())
        total = den.sum()
        estimate = num.sum() / total if total != 0 else np.nan
        with np.errstate(divide="ignore", invalid="ignore"):
            boot = (weights @ num) / (weights @ den)
        boot = boot[np.isfinite(boot)]
        low, high = (np.quantile(boot, [0.025, 0.975]) if boot.size else (np.nan, np.nan))
        out.append({**dict(zip(keys, key if isinstance(key, tuple) else (key,))), "recovered": float(estimate),
                    "low": float(low), "high": float(high), "n": int(len(g))})
    return pd.DataFrame.from_records(out)


def grid(frame: pd.DataFrame, seed: int = 0, value: str = "ld_patched") -> pd.DataFrame:
    return ratio_of_means(frame, ["corruption", "loop", "layer", "position", "component"], value, seed)


def steps_table(frame: pd.DataFrame, last_layer: int, seed: int = 0, value: str = "ld_patched") -> pd.DataFrame:
    """The entry corruption's read-position state (resid after the block's last layer) per (step, loop)."""
    part = frame[(frame["corruption"] == "entry") & (frame["position"] == "read") & (frame["component"] == "resid")
                 & (frame["layer"] == last_layer)] if not frame.empty else frame
    return ratio_of_means(part, ["step", "loop"], value, seed)


def summarize(tables: dict[str, pd.DataFrame]) -> dict:
    g, pairs = tables["patching__grid"], tables["patching__pairs"]
    top = {}
    for corruption, part in g[g["component"] != "resid"].groupby("corruption"):
        best = part.sort_values("recovered", ascending=False).head(5)
        top[corruption] = [{k: (v if isinstance(v, str) else round(float(v), 4)) for k, v in r.items()}
                           for r in best[["loop", "layer", "position", "component", "recovered", "n"]].to_dict("records")]
    return {"pairs": int(len(pairs)), "by_corruption": pairs["corruption"].value_counts().to_dict(),
            "first_recovering_loop": {str(k): v for k, v in first_recovering(tables["patching__steps"]).items()},
            "top_components": top, "headline": headline(tables).to_dict()}


@probe_options
class Options:
    """The patching grid's options (`run`'s keywords), checked before any probe of a battery runs."""

    corruptions: Names = CORRUPTIONS
    positions: Names = POSITIONS
    components: Names = COMPONENTS
    layers: Layers = None
    loops: int | None = None
    batch_size: Count = 48
    seed: int = 0
    progress: bool = False


SPEC = ProbeSpec(
    name="patching", parts=("grid", "pairs", "steps"), run=run, summarize=summarize,
    needs=("prompt", "symbols", CORRUPT_TWIN),
    options=Options,
)
