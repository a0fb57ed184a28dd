"""paths: is the answer iterated, or read at the end? The state leaving loop t, sent through the later loops or
straight into the readout.

On `patching`'s corrupted twins (one table entry or the start changed; `corrupt_pairs`), the clean run's
state h_t (`loop.{t}.hook_state`) is put into the corrupted run three ways, and the corrupted run is read at
every later loop u > t:

    loops        h_t at every position; loops t+1..u run on from it (the splice's state/all, at every loop)
    loops_read   h_t at the read position only; the rest of loop t's state stays corrupted (state/read)
    readout      no later loop sees it: loop u's state is replaced by clean h_t, so the readout at u reads
                 h_t directly

At loop u the margin is LD_u = logit(clean x_u) - logit(corrupted x_u), the two chains' symbols at loop u
(the chase chain read loop by loop); a (pair, u) where the two symbols coincide carries no signal and is
left out. A user's row with its own `corrupt` twin has no chain: only the last loop T is read, on its
answers. Recovered share: mean(LD_patched - LD_corrupted) / mean(LD_clean - LD_corrupted) per
(corruption, route, t, u), with a row-bootstrap interval.

Reading (fixed before any run), per source loop t < T at the last loop T: "iterated" when the loops route
recovers >= 0.5 and the readout route < 0.5 (the state's content needs the later loops to become the
answer); "read at the end" when the readout route recovers >= 0.5 (h_t already holds what the last loop
reads); else "neither".

Tables:
    paths          pair_id, row_id, depth, corruption, step, route, source, read, ld_patched, ld_clean,
                   ld_corrupted
    paths__routes  corruption, route, source, read, recovered, low, high, n
    paths__pairs   as patching__pairs
"""

from __future__ import annotations

import pandas as pd
import torch
from tqdm.auto import tqdm

from workbench.analysis.headlines.paths import headline, reading
from workbench.devices import device_of
from workbench.errors import WorkbenchError
from workbench.loop.hooks import hook_name
from workbench.probes.common import default_loops
from workbench.probes.options import Names, probe_options
from workbench.probes.pairs import CORRUPT_TWIN, corrupt_pairs, require_pairs
from workbench.probes.patching import (
    check_choices,
    loops_of,
    margins,
    pair_record,
    ratio_of_means,
)
from workbench.probes.spec import ProbeSpec

ROUTES = ("loops", "loops_read", "readout")


def _symbols(pair, T: int) -> list[tuple[int, int] | None]:
    """Per loop u = 1..T: (clean x_u, corrupted x_u) candidate indices, None where they coincide. A user's row
    with its own twin names no chain: only loop T has a target, its two answers."""
    if not pair.corrupted_chain or "chain" not in pair.row:
        return [None] * (T - 1) + [(pair.answer, pair.corrupted)]
    clean = [pair.row["symbols"].index(s) for s in pair.row["chain"]]
    corrupt = [pair.row["symbols"].index(s) for s in pair.corrupted_chain]
    return [(clean[u], corrupt[u]) if u < len(clean) and u < len(corrupt) and clean[u] != corrupt[u] else None
            for u in range(T)]


@torch.no_grad()
def _scores(model, ids, pair, T: int, hooks=()) -> torch.Tensor:
    """Candidate scores at the read position after every loop 1..T: [T, C]."""
    device = device_of(model)
    ids = ids.to(device)
    with model.hooks(fwd_hooks=list(hooks)):
        r = model.read(ids, attention_mask=torch.ones_like(ids), loops=T, candidates=pair.cands.to(device))
    return r.scores[0, :, -1].double().cpu()


def _states(model, ids, pair, T: int) -> dict[int, torch.Tensor]:
    saved = {}

    def save(x, hook):
        saved[int(hook.name.split(".")[1])] = x.detach().clone()

    _scores(model, ids, pair, T, [(hook_name("state", t), save) for t in range(1, T + 1)])
    return saved


def _put(value: torch.Tensor, read_only: bool):
    def hook(x, hook):
        if not read_only:
            return value.to(x.dtype)
        x = x.clone()
        x[:, -1] = value[:, -1].to(x.dtype)
        return x
    return hook


def run(model, tokenizer, rows: list[dict], corruptions=("entry", "start"), routes=ROUTES, loops: int | None = None,
        seed: int = 0, progress: bool = False) -> dict[str, pd.DataFrame]:
    """Returns the three tables of the module docstring.

    Args:
        corruptions: which twins to build ("entry", "start"); routes: of ROUTES.
        loops: T for rows without a depth (default the model's own count); a row with a depth is read at it.
        seed: the corrupted symbols (the same twins as patching's with the same seed).
    """
    require_pairs(rows)
    routes = check_choices(routes, ROUTES, "paths route")
    pairs, skipped = corrupt_pairs(tokenizer, rows, list(corruptions), seed)
    if not pairs:
        raise WorkbenchError(f"paths built no corrupted twin from {len(rows)} rows ({skipped} skipped)")
    fallback = loops or default_loops(model, rows)
    records, pair_rows = [], []
    for pair in tqdm(pairs, disable=not progress, desc="paths"):
        T = loops_of(model, pair, fallback)
        if T < 2:
            continue
        pair_rows.append(pair_record(pair, margins(model, pair.clean_ids, pair, T),
                                     margins(model, pair.corrupt_ids, pair, T)))
        targets = _symbols(pair, T)
        clean_scores, corrupt_scores = _scores(model, pair.clean_ids, pair, T), _scores(model, pair.corrupt_ids, pair, T)
        states = _states(model, pair.clean_ids, pair, T)
        base = dict(pair_id=pair.pair_id, row_id=pair.row["row_id"], depth=int(pair.row["depth"]),
                    corruption=pair.corruption, step=int(pair.step))

        def margin(scores, u):
            a, b = targets[u - 1]
            return float(scores[u - 1, a] - scores[u - 1, b])

        for t in range(1, T):
            later = [u for u in range(t + 1, T + 1) if targets[u - 1] is not None]
            if not later:
                continue
            for route in routes:
                if route in ("loops", "loops_read"):
                    s = _scores(model, pair.corrupt_ids, pair, T,
                                [(hook_name("state", t), _put(states[t], route == "loops_read"))])
                    got = {u: margin(s, u) for u in later}
                else:
                    got = {}
                    for u in later:
                        s = _scores(model, pair.corrupt_ids, pair, u, [(hook_name("state", u), _put(states[t], False))])
                        got[u] = margin(s, u)
                records += [dict(base, route=route, source=t, read=u, ld_patched=got[u],
                                 ld_clean=margin(clean_scores, u), ld_corrupted=margin(corrupt_scores, u))
                            for u in later]
    frame = pd.DataFrame.from_records(records, columns=["pair_id", "row_id", "depth", "corruption", "step", "route",
                                                        "source", "read", "ld_patched", "ld_clean", "ld_corrupted"])
    table = ratio_of_means(frame, ["corruption", "route", "source", "read"], seed=seed)
    return {"paths": frame, "paths__routes": table, "paths__pairs": pd.DataFrame(pair_rows)}


def summarize(tables: dict[str, pd.DataFrame]) -> dict:
    return {"pairs": int(len(tables["paths__pairs"])),
            "reading": {f"{c}/t={t}": v for (c, t), v in reading(tables["paths__routes"]).items()},
            "headline": headline(tables).to_dict()}


@probe_options
class Options:
    """The paths probe's options (`run`'s keywords), checked before any probe of a battery runs."""

    corruptions: Names = ("entry", "start")
    routes: Names = ROUTES
    loops: int | None = None
    seed: int = 0
    progress: bool = False


SPEC = ProbeSpec(
    name="paths", parts=("pairs", "routes"), run=run, summarize=summarize,
    needs=("prompt", "symbols", CORRUPT_TWIN),
    options=Options,
)
