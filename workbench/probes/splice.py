"""Counterfactual splice: put row B's loop-k0 tensor into row A and see whose chain A's later loops follow.

Rows A and B of the same depth and the same token length (so the substitution is shape-safe
and left padding, positions and masks coincide) are paired within their group, each row A
once and B once. B runs to loop k0 with a caching hook; A runs to k0 + horizon with a hook
that substitutes B's tensor at one site of loop k0 (A's own Prelude is still re-injected):

    site "state"          loop.{k0}.hook_state                 h_k0, the block output
    site "block_resid"    loop.{k0}.block.{layer}.hook_resid_post   one block layer's residual
    site "reentry_input"  loop.{k0}.hook_input                 u_k0, the block input after re-entry

`span` "all" substitutes every position, "read" only the read position, leaving A's context
in place. An all-position substitution anywhere in loop k0 leaves loop k0's output equal to
B's (the rest of the loop sees only B's tensors; Loop Memory Attention aside), so the "all"
span runs only at the sites in `all_sites` (the state, by default). At loop k0 + j A's read symbol
is classified, in this priority, as
*source_orbit* (x^B_{k0+j}: B's chain carried on), *lawful* (f_A^j(x^B_{k0}): A's rule
applied to the spliced symbol), *shortcut* (x^A_{k0+j}: A's own chain, the splice ignored)
or *other*. Entries where two of the three class symbols coincide are kept but marked
`coincide` and left out of the verdict (j = 0 always coincides: source = lawful).

Tables:
    splice: pair_id, row_a, row_b, depth, site, span, k0, j, loop, predicted, source_symbol,
        lawful_symbol, shortcut_symbol, cls, coincide
    splice__verdict: site, span, k0, verdict, source_orbit, lawful, shortcut, other, n — fractions
        over 1 <= j <= 3 without coincidences; verdict "source_orbit" (>= 0.75), "lawful"
        (>= 0.75), "shortcut" (>= 0.50), else "mixed" ("undetermined" with n = 0).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from workbench.analysis.headlines.splice import CLASSES, VERDICT_HORIZON, headline, verdict
from workbench.devices import device_of
from workbench.errors import WorkbenchError
from workbench.loop.hooks import hook_name
from workbench.loop.positions import last_real_token
from workbench.probes.common import (
    FUNCTION_TABLE,
    check_loops,
    iterate,
    iterate_from,
    require_chase,
    row_candidates,
    shared_candidates,
    token_lengths,
)
from workbench.probes.options import Count, Names, probe_options
from workbench.probes.spec import ProbeSpec
from workbench.tasks.reader import encode_prompts

SITES = ("state", "block_resid", "reentry_input")
SPANS = ("all", "read")


def splice_hook(site: str, k0: int, layer: int) -> str:
    """The hook point a splice at `site` of loop k0 substitutes (`workbench.loop.hooks`)."""
    if site == "block_resid":
        return hook_name("block_resid", k0, layer)
    return hook_name({"state": "state", "reentry_input": "input"}[site], k0)


def make_pairs(tokenizer, rows: list[dict], seed: int = 0) -> list[tuple[int, int]]:
    """Returns (index A, index B) pairs: rows of equal depth, token length and symbols, each row A once and B once."""
    groups: dict[tuple, list[int]] = defaultdict(list)
    for i, (r, n) in enumerate(zip(rows, token_lengths(tokenizer, rows))):
        groups[(r["depth"], n, tuple(r["symbols"]))].append(i)
    rng = np.random.default_rng(seed)
    pairs = []
    for key in sorted(groups):
        members = [int(i) for i in rng.permutation(groups[key])]
        if len(members) >= 2:
            pairs += [(members[i], members[(i + 1) % len(members)]) for i in range(len(members))]
    return pairs


def classify(predicted: str, source: str, lawful: str, shortcut: str) -> str:
    """Returns the splice class of a read symbol, in the priority source_orbit, lawful, shortcut, other."""
    for cls, symbol in zip(CLASSES, (source, lawful, shortcut)):
        if predicted == symbol:
            return cls
    return "other"


def run(model, tokenizer, rows: list[dict], k0s=(1, 2), horizon: int = 3, sites=SITES, spans=SPANS,
        all_sites=("state",), layer: int | None = None, batch_size: int = 8, seed: int = 0,
        progress: bool = False) -> dict[str, pd.DataFrame]:
    """Returns {"splice": one row per (pair, site, span, k0, j), "splice__verdict": per (site, span, k0)}.

    Args:
        k0s: loops at which to splice.
        horizon: loops after k0 to run and classify (j = 0..horizon).
        sites, spans, all_sites: see the module docstring.
        layer: the block layer of the "block_resid" site (absolute index); default the block's middle.
        seed: pairs rows within their group.
    """
    require_chase(rows)
    layer = _check_options(model, [*sites, *all_sites], spans, layer, k0s, horizon)
    combos = [(site, span) for site in sites for span in spans if span != "all" or site in all_sites]
    if not combos:
        raise WorkbenchError(f"splice has nothing to run: span 'all' only runs at all_sites {list(all_sites)}")
    pairs = make_pairs(tokenizer, rows, seed)
    if not pairs:
        raise WorkbenchError("the splice probe found no two rows with the same depth and token length")
    records = []
    chunks = [pairs[i:i + batch_size] for i in range(0, len(pairs), batch_size)]
    for n, chunk in enumerate(tqdm(chunks, disable=not progress, desc="splice")):
        records += _splice_chunk(model, tokenizer, rows, chunk, k0s, horizon, combos, layer, n * batch_size)
    frame = pd.DataFrame.from_records(records)
    return {"splice": frame, "splice__verdict": verdict_table(frame)}


def _check_options(model, sites, spans, layer, k0s, horizon) -> int:
    for s in sites:
        if s not in SITES:
            raise WorkbenchError(f"splice site '{s}' is unknown; accepted: {', '.join(SITES)}")
    for s in spans:
        if s not in SPANS:
            raise WorkbenchError(f"splice span '{s}' is unknown; accepted: {', '.join(SPANS)}")
    if layer is None:
        layer = model.a + (model.b - model.a) // 2
    if not model.a <= layer < model.b:
        raise WorkbenchError(f"splice layer {layer} is not a block layer; accepted: {model.a}..{model.b - 1}")
    if horizon < 1 or any(k < 1 for k in k0s):
        raise WorkbenchError(f"splice needs k0 >= 1 and horizon >= 1, got k0s {list(k0s)}, horizon {horizon}")
    check_loops(model, max(k0s) + horizon)
    return layer


@torch.no_grad()
def _splice_chunk(model, tokenizer, rows, chunk, k0s, horizon, combos, layer, first_id) -> list[dict]:
    device = device_of(model)
    rows_a, rows_b = [rows[a] for a, _ in chunk], [rows[b] for _, b in chunk]
    enc_a = encode_prompts(tokenizer, [r["prompt"] for r in rows_a]).to(device)
    enc_b = encode_prompts(tokenizer, [r["prompt"] for r in rows_b]).to(device)
    if not torch.equal(enc_a["attention_mask"], enc_b["attention_mask"]):
        raise WorkbenchError("spliced rows must have equal token lengths; the pairing is broken")
    cands = shared_candidates(row_candidates(tokenizer, rows_a).to(device))
    mask = enc_a["attention_mask"]
    read_pos = last_real_token(mask)  # as LoopedLM reads
    records = []
    for k0 in k0s:
        names = {site: splice_hook(site, k0, layer) for site, _ in combos}
        cache: dict[str, torch.Tensor] = {}

        def save(x, hook):
            cache[hook.name] = x.detach().clone()

        with model.hooks(fwd_hooks=[(n, save) for n in set(names.values())]):
            model.read(enc_b["input_ids"], attention_mask=mask, loops=k0, candidates=cands)
        for site, span in combos:
            hook = _substitute(cache[names[site]], span, read_pos)
            with model.hooks(fwd_hooks=[(names[site], hook)]):
                r = model.read(enc_a["input_ids"], attention_mask=mask, loops=k0 + horizon, candidates=cands)
            pred = r.scores[:, :, -1, :].argmax(-1).cpu().numpy()  # [P, T]
            for p, (a, b) in enumerate(chunk):
                records += _classify_pair(first_id + p, rows[a], rows[b], site, span, k0, horizon, pred[p])
    return records


def _substitute(cached: torch.Tensor, span: str, read_pos: torch.Tensor):
    def hook(x, hook):
        if span == "all":
            return cached.to(x.dtype)
        out = x.clone()
        batch = torch.arange(x.shape[0], device=x.device)
        out[batch, read_pos] = cached[batch, read_pos].to(x.dtype)
        return out
    return hook


def _classify_pair(pair_id, row_a, row_b, site, span, k0, horizon, pred) -> list[dict]:
    spliced = iterate(row_b, k0)
    out = []
    for j in range(horizon + 1):
        loop = k0 + j
        predicted = row_a["symbols"][int(pred[loop - 1])]
        source, lawful, shortcut = iterate(row_b, loop), iterate_from(row_a, spliced, j), iterate(row_a, loop)
        out.append(dict(pair_id=pair_id, row_a=row_a["row_id"], row_b=row_b["row_id"], depth=row_a["depth"],
                        site=site, span=span, k0=k0, j=j, loop=loop, predicted=predicted, source_symbol=source,
                        lawful_symbol=lawful, shortcut_symbol=shortcut,
                        cls=classify(predicted, source, lawful, shortcut),
                        coincide=len({source, lawful, shortcut}) < 3))
    return out


def verdict_table(frame: pd.DataFrame, horizon: int = VERDICT_HORIZON) -> pd.DataFrame:
    """Per (site, span, k0): class fractions over 1 <= j <= horizon without coincidences, and the verdict."""
    records = []
    for (site, span, k0), g in frame.groupby(["site", "span", "k0"], sort=False):
        kept = g[(g["j"] >= 1) & (g["j"] <= horizon) & ~g["coincide"]]
        n = len(kept)
        shares = {c: float((kept["cls"] == c).mean()) if n else float("nan") for c in CLASSES}
        records.append(dict(site=site, span=span, k0=int(k0), verdict=verdict(shares, n), **shares, n=n))
    return pd.DataFrame.from_records(records)


def summarize(tables: dict[str, pd.DataFrame]) -> dict:
    """Headline numbers: the verdict and class fractions per (site, span, k0), and the pair count."""
    v = tables["splice__verdict"]
    out = {f"{r.site}/{r.span}/k0={r.k0}": {"verdict": r.verdict, "n": int(r.n),
                                               **{c: (None if np.isnan(getattr(r, c)) else round(float(getattr(r, c)), 4))
                                                  for c in CLASSES}}
           for r in v.itertuples()}
    return {"pairs": int(tables["splice"]["pair_id"].nunique()), "verdicts": out,
            "headline": headline(tables).to_dict()}


@probe_options
class Options:
    """The splice probe's options (`run`'s keywords), checked before any probe of a battery runs."""

    k0s: Sequence[int] = (1, 2)
    horizon: int = 3
    sites: Names = SITES
    spans: Names = SPANS
    all_sites: Names = ("state",)
    layer: int | None = None
    batch_size: Count = 8
    seed: int = 0
    progress: bool = False


SPEC = ProbeSpec(
    name="splice", parts=("verdict",), run=run, summarize=summarize,
    needs=("prompt", "symbols", "depth", "table", "start", FUNCTION_TABLE),
    options=Options,
)
