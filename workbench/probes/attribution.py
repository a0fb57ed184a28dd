"""attribution: the gradient approximation of the patching grid (attribution patching, AtP), and where it can be trusted.

On the same corrupted twins as `patching` (`workbench.probes.pairs.corrupt_pairs`), one clean forward
caches every cell's activation and one corrupted forward and backward give the gradient of the logit
difference LD = logit(clean answer) - logit(corrupted answer) with respect to each loop's use of each site
separately (a zero tensor added at every hook point, so loop t's use of a shared layer has its own
gradient). A cell's first-order estimate of patching clean into corrupted is

    sum over the class's positions p of (a_clean[p] - a_corrupted[p]) . dLD/da[p]      (Kramar et al. 2024, AtP)

and its recovered share is read exactly as the exact grid's (ratio of means over pairs). The estimate is
exact for a site whose effect on LD is linear; it errs where the path saturates (a softmax or a norm far
from where it was linearised) or where contributions cancel. AtP*'s two fixes are not applied here: the
query-key recomputation concerns attention-pattern sites, which this grid does not patch; GradDrop is not
implemented. So the probe measures its own error: on the first `check_pairs` pairs it also runs the exact
grid and reports the agreement of the two maps, cell by cell, with a fixed rule for trusting the cheap one.

Trust rule (issue 58, fixed before any table was read; `workbench.analysis.headlines.attribution.agreement_of`):
per corruption and component, the cells that clear the noise floor are those whose exact interval across the
check pairs excludes 0 and whose |exact share| is at least 0.1 of the table's largest. Fewer than 8 such cells
read "not comparable" (more pairs in the exact grid would make it comparable). On them, the map is "trusted" when
Spearman's rho (average ranks) is >= 0.8 and its one-sided permutation p over 9,999 permutations of the gradient
values (a generator seeded 0) is <= 0.01; a map constant on them has no ranking; otherwise "cannot be trusted".
The sign agreement and the top-10 overlap are shown as information.

Tables:
    attribution              the patching table's columns, ld_patched holding LD_corrupted + the estimate
    attribution__grid        corruption, loop, layer, position, component, recovered, low, high, n (all pairs)
    attribution__check       corruption, loop, layer, position, component, exact, exact_low, exact_high, exact_n
                             (the exact grid on the check pairs: share, 95% interval, pairs), gradient
    attribution__agreement   corruption, component ("all" or one), cells, pairs, cleared, spearman, p, sign_share,
                             top10, top_k (information), verdict, reason, trusted
    attribution__cost        pairs, cells, exact_s, gradient_s, ratio: both maps on the check pairs, timed here
"""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from workbench.analysis.headlines.attribution import TOP, TRUSTED, agreement_of, headline
from workbench.analysis.headlines.depth_matrix import rounded
from workbench.devices import device_of
from workbench.errors import WorkbenchError
from workbench.probes.common import default_loops
from workbench.probes.options import probe_options
from workbench.probes.pairs import CORRUPT_TWIN, CORRUPTIONS, POSITIONS, corrupt_pairs, require_pairs
from workbench.probes.patching import (
    COMPONENTS,
    _check_positions,
    block_layers,
    check_components,
    clean_activations,
    exact_cells,
    grid,
    grid_cells,
    loops_of,
    margins,
    pair_record,
    site,
)
from workbench.probes.patching import Options as PatchingOptions
from workbench.probes.spec import ProbeSpec


def all_grad(model):
    """A context in which every pass of the model is differentiable (HRM runs some L cycles without grad,
    as transformers does; `all_cycles_with_grad`); nothing for models that always are."""
    return model.all_cycles_with_grad()


def gradient_cells(model, pair, T: int, cells, positions, clean: dict) -> dict[str, np.ndarray]:
    """{position class: the AtP estimate of LD_patched - LD_corrupted per cell}, from one forward and backward."""
    device = device_of(model)
    names = sorted({site(c, t, i) for t, i, c in cells})
    leaves: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def handle(x, hook):
        z = torch.zeros_like(x, requires_grad=True)
        leaves[hook.name] = (z, x.detach())
        return x + z

    ids = pair.corrupt_ids.to(device)
    with torch.enable_grad(), all_grad(model), model.hooks(fwd_hooks=[(n, handle) for n in names]):
        scores = model.read_final(ids, attention_mask=torch.ones_like(ids), loops=T,
                                  candidates=pair.cands.to(device))[0, -1]
        ld = scores[pair.answer] - scores[pair.corrupted]
        order = [n for n in names if n in leaves]
        grads = torch.autograd.grad(ld, [leaves[n][0] for n in order], allow_unused=True)
    per_position = {}
    for n, g in zip(order, grads):
        delta = clean[n] - leaves[n][1][0]
        per_position[n] = torch.zeros(delta.shape[0]) if g is None else (delta * g[0]).sum(-1).double().cpu()
    out = {}
    for position in positions:
        where = pair.positions[position]
        if where:
            out[position] = np.array([float(per_position[site(c, t, i)][where].sum()) for t, i, c in cells])
    return out


def run(model, tokenizer, rows: list[dict], corruptions=CORRUPTIONS, positions=POSITIONS, components=COMPONENTS,
        layers=None, loops: int | None = None, check_pairs: int = 4, batch_size: int = 48, seed: int = 0,
        progress: bool = False) -> dict[str, pd.DataFrame]:
    """Returns the five tables of the module docstring.

    Args:
        corruptions, positions, components, layers, loops, batch_size, seed: as `patching`.
        check_pairs: pairs (taken in turn from each corruption) on which the exact grid also runs, for the
            agreement and the cost; 0 skips the check (no agreement is then claimed).
    """
    require_pairs(rows)
    layers, components = block_layers(model, layers), check_components(components)
    positions = _check_positions(positions)
    if not isinstance(check_pairs, int) or check_pairs < 0:
        raise WorkbenchError(f"attribution check_pairs must be a non-negative integer, got {check_pairs!r}")
    pairs, skipped = corrupt_pairs(tokenizer, rows, list(corruptions), seed)
    if not pairs:
        raise WorkbenchError(f"attribution built no corrupted twin from {len(rows)} rows ({skipped} skipped)")
    checked = _check_set([(p.pair_id, p.corruption) for p in pairs], check_pairs)
    fallback = loops or default_loops(model, rows)
    records, exact_records, pair_rows = [], [], []
    exact_s = gradient_s = 0.0
    for pair in tqdm(pairs, disable=not progress, desc="attribution"):
        T = loops_of(model, pair, fallback)
        cells = grid_cells(T, layers, components)
        t0 = time.perf_counter()
        ld_clean, ld_corr = margins(model, pair.clean_ids, pair, T), margins(model, pair.corrupt_ids, pair, T)
        with torch.no_grad():
            clean = clean_activations(model, pair, T, cells)
        shared = time.perf_counter() - t0
        t1 = time.perf_counter()
        estimates = gradient_cells(model, pair, T, cells, positions, clean)
        took = time.perf_counter() - t1
        pair_rows.append(pair_record(pair, ld_clean, ld_corr))
        base = dict(pair_id=pair.pair_id, row_id=pair.row["row_id"], depth=int(pair.row["depth"]),
                    corruption=pair.corruption, step=int(pair.step), ld_clean=ld_clean, ld_corrupted=ld_corr)
        for position, est in estimates.items():
            records += [dict(base, loop=t, layer=i, position=position, component=c,
                             n_positions=len(pair.positions[position]), ld_patched=ld_corr + float(e))
                        for (t, i, c), e in zip(cells, est)]
        if pair.pair_id in checked:
            gradient_s += shared + took
            t2 = time.perf_counter()
            for position in estimates:
                lds = exact_cells(model, pair, T, cells, position, clean, batch_size)
                exact_records += [dict(base, loop=t, layer=i, position=position, component=c,
                                       n_positions=len(pair.positions[position]), ld_patched=float(ld))
                                  for (t, i, c), ld in zip(cells, lds)]
            exact_s += shared + time.perf_counter() - t2
    frame = pd.DataFrame.from_records(records)
    check = _check_table(frame[frame["pair_id"].isin(checked)], pd.DataFrame.from_records(exact_records), seed)
    n_cells = int(len(check))
    cost = pd.DataFrame([{"pairs": len(checked), "cells": n_cells, "exact_s": exact_s, "gradient_s": gradient_s,
                          "ratio": exact_s / gradient_s if gradient_s else np.nan}])
    return {"attribution": frame, "attribution__grid": grid(frame, seed), "attribution__check": check,
            "attribution__agreement": agreement(check), "attribution__cost": cost,
            "attribution__pairs": pd.DataFrame(pair_rows)}


def _check_set(pairs: list[tuple[int, str]], n: int) -> set[int]:
    """The ids of the first n (pair_id, corruption) pairs taken in turn from each corruption."""
    by_kind: dict[str, list[int]] = {}
    for pair_id, corruption in pairs:
        by_kind.setdefault(corruption, []).append(pair_id)
    chosen, kinds = [], list(by_kind.values())
    while len(chosen) < n and any(kinds):
        for ids in kinds:
            if ids and len(chosen) < n:
                chosen.append(ids.pop(0))
    return set(chosen)


KEYS = ["corruption", "loop", "layer", "position", "component"]
EXACT = {"recovered": "exact", "low": "exact_low", "high": "exact_high", "n": "exact_n"}


def _check_table(gradient: pd.DataFrame, exact: pd.DataFrame, seed: int) -> pd.DataFrame:
    if exact.empty:
        return pd.DataFrame(columns=[*KEYS, *EXACT.values(), "gradient"])
    e = grid(exact, seed).rename(columns=EXACT)
    g = grid(gradient, seed)[[*KEYS, "recovered"]].rename(columns={"recovered": "gradient"})
    return e.merge(g, on=KEYS, how="inner")


def stored_check(tables: dict[str, pd.DataFrame], seed: int = 0) -> pd.DataFrame:
    """Returns a results directory's attribution__check with the exact grid's interval on every cell.

    A run since issue 58 stores it. An earlier one stored only the exact share; its interval is rebuilt from the
    per-pair exact values that the same run's `patching` table holds for the check pairs (same pairs, same
    `exact_cells`), which must give the stored share bit for bit; nothing is re-run.

    Args:
        tables: the directory's tables (`workbench.analysis.results.load_results`), with `patching` for an old run.
        seed: the run's seed (the grid's bootstrap draws).
    """
    check = tables["attribution__check"]
    if "exact_low" in check.columns or check.empty:
        return check
    if "patching" not in tables:
        raise WorkbenchError("attribution__check predates the exact interval (issue 58) and no patching table of "
                             "the same run holds the check pairs' exact values")
    pairs = tables["attribution__pairs"]
    checked = _check_set(list(zip(pairs["pair_id"], pairs["corruption"])), int(tables["attribution__cost"]["pairs"].iloc[0]))
    exact = tables["patching"][tables["patching"]["pair_id"].isin(checked)]
    same = ["pair_id", "row_id", "corruption", "ld_clean", "ld_corrupted"]
    if len(exact[same].drop_duplicates().merge(pairs[same])) != len(checked):
        raise WorkbenchError("the patching table's pairs are not attribution's check pairs")
    rebuilt = check.drop(columns="exact").merge(grid(exact, seed).rename(columns=EXACT), on=KEYS, how="left")
    if not np.array_equal(rebuilt["exact"].to_numpy(), check["exact"].to_numpy(), equal_nan=True):
        raise WorkbenchError("the patching table's check pairs do not give attribution__check's exact shares")
    return rebuilt[[*KEYS, *EXACT.values(), "gradient"]]


def top_overlap(exact: pd.Series, gradient: pd.Series, k: int = TOP) -> int:
    """How many of the exact map's k largest cells (by |share|) are among the gradient map's k largest."""
    k = min(k, len(exact))
    return len(set(exact.abs().nlargest(k).index) & set(gradient.abs().nlargest(k).index))


AGREEMENT = ["corruption", "component", "cells", "pairs", "cleared", "spearman", "p", "sign_share", "top10", "top_k",
             "verdict", "reason", "trusted"]


def agreement(check: pd.DataFrame) -> pd.DataFrame:
    """Per corruption and component ("all" pools the components): the trust rule's reading (`agreement_of`), with
    the top-10 overlap beside it as information."""
    records = []
    for corruption, part in check.groupby("corruption", sort=False):
        for component in ["all", *sorted(part["component"].unique())]:
            cells = part if component == "all" else part[part["component"] == component]
            cells = cells.dropna(subset=["exact", "gradient"]).reset_index(drop=True)
            a = agreement_of(cells["exact"], cells["exact_low"], cells["exact_high"], cells["gradient"])
            records.append(dict(corruption=corruption, component=component, cells=a.cells,
                                pairs=int(cells["exact_n"].max()) if len(cells) else 0, cleared=a.cleared,
                                spearman=a.spearman, p=a.p, sign_share=a.sign_share,
                                top10=top_overlap(cells["exact"], cells["gradient"]), top_k=min(TOP, len(cells)),
                                verdict=a.verdict, reason=a.reason, trusted=a.verdict == TRUSTED))
    return pd.DataFrame.from_records(records, columns=AGREEMENT)


def summarize(tables: dict[str, pd.DataFrame]) -> dict:
    a, c = tables["attribution__agreement"], tables["attribution__cost"].iloc[0]
    return {"pairs": int(len(tables["attribution__pairs"])),
            "agreement": [{k: (rounded(v) if isinstance(v, float) else v) for k, v in r.items()}   # NaN: null
                          for r in a.to_dict("records")],
            "cost": {k: (round(float(v), 3) if isinstance(v, float) else int(v)) for k, v in c.items()},
            "headline": headline(tables).to_dict()}


@probe_options
class Options(PatchingOptions):
    """The attribution grid's options: the patching grid's, and the pairs the exact grid checks it on."""

    check_pairs: int = 4


SPEC = ProbeSpec(
    name="attribution", parts=("agreement", "check", "cost", "grid", "pairs"), run=run, summarize=summarize,
    needs=("prompt", "symbols", CORRUPT_TWIN),
    options=Options,
)
