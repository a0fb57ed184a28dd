"""lens_agreement: do the logit, coda and tuned lenses agree at every pass, and which one is causal where they don't?

From one forward per row batch to T (`workbench.probes.passes`), at the read position of every
pass t = 1..T, three lenses read the state h_t over the task's candidates:

    logit  the final norm and the unembedding on h_t directly, skipping the Coda (the logit_lens
           probe's raw lens; Lu et al. 2507.02199's "logit lens" on Huginn);
    coda   the model's own path: Coda, final norm, unembedding (`loop.{t}.hook_readout`);
    tuned  a per-pass affine map of h_t fitted (ridge, `workbench.probes.logit_lens.fit_tuned`) to the
           Coda readout vector of pass T on rows disjoint from the evaluated ones (`fit_fraction`).

Per (row, pass, lens): the top-1 symbol, whether it equals the model's final output (the coda's
top-1 at T) and the row's label x_t (f^t(x_0), the chain continued past the depth), and
KL(final ‖ lens) over the candidates; per (row, pass) whether each pair of lenses agrees.

At t = T the coda lens is the model's own output: on the first `check_rows` rows the probe
compares its coda logits at T (over the whole vocabulary) with a plain `model(...)` forward to
T and raises `WorkbenchError` when they differ by more than `tolerance` (relative to the
largest logit), so a wrong hook, position or unembedding cannot pass silently.

Causal column: for up to `max_causal` cells (row A, pass t <= T - horizon) where two lenses'
top-1 differ, A's h_t replaces the read position's state of another evaluated row B with the
same symbols at pass t (`loop.{t}.hook_state`, the splice probe's read-position span), and B
runs on. At pass t + j (j = 0..horizon) B's read is compared with what each lens's reading
predicts there: f_B^j(reading) for function-table rows (B's rule applied to the spliced symbol,
the splice probe's lawful class), the reading itself at j = 0 for other rows. A lens "carries"
the cell when its prediction is B's read; cells where two lenses with different readings predict
the same symbol are marked `coincide` and left out of the shares. Cells where the logit and coda
lenses disagree (`disagree` "logit-coda") are spliced first, then cells where only the tuned
lens differs ("tuned"), each in an order drawn by `seed`.

Tables:
    lens_agreement: row_id, depth, loop, lens, top1, label, final, agree_final, agree_label, kl_final, past_depth
        (label, agree_label and past_depth None where a user's row gives no chain or depth, `workbench.tasks.user`)
    lens_agreement__pairs: row_id, depth, loop, pair, agree
    lens_agreement__summary: loop, lens, measure, value, low, high, n, method — means over rows with 95%
        intervals (Wilson for agreements, row bootstrap for KL); `lens` is a pair name for agree_pair
    lens_agreement__causal: row_a, row_b, depth, loop, j, disagree, logit, coda, tuned, predicted, expect_logit,
        expect_coda, expect_tuned, carried_logit, carried_coda, carried_tuned, coincide
    lens_agreement__identity: rows, max_abs_diff, max_abs_logit, tolerance, holds
"""

from __future__ import annotations

from itertools import combinations

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from workbench.analysis.headlines.lens_agreement import LENSES, headline
from workbench.analysis.stats import bootstrap_mean, wilson
from workbench.devices import device_of
from workbench.errors import WorkbenchError
from workbench.loop.hooks import hook_name
from workbench.loop.positions import last_real_token
from workbench.probes.common import (
    ONE_TOKEN,
    batches,
    check_loops,
    default_loops,
    iterate_from,
    require_symbols,
    row_candidates,
    shared_candidates,
    split_rows,
)
from workbench.probes.logit_lens import fit_tuned
from workbench.probes.options import Count, probe_options
from workbench.probes.passes import read_passes
from workbench.probes.spec import ProbeSpec
from workbench.tasks.reader import encode_prompts

PAIRS = tuple(f"{a}-{b}" for a, b in combinations(LENSES, 2))


def run(model, tokenizer, rows: list[dict], loops: int | None = None, fit_fraction: float = 0.5,
        ridge: float = 0.1, max_causal: int = 48, horizon: int = 1, check_rows: int = 8,
        tolerance: float = 1e-4, batch_size: int = 8, seed: int = 0,
        progress: bool = False) -> dict[str, pd.DataFrame]:
    """Returns the five tables of the module docstring.

    Args:
        loops: T, the passes read (default the rows' max depth; `common.default_loops` when a row gives none).
        fit_fraction: share of each depth's rows that fit the tuned lens (never evaluated).
        ridge: the tuned lens's ridge strength (relative, as the logit_lens probe's).
        max_causal: most disagreeing cells spliced (picked by `seed`); 0 skips the causal column.
        horizon: passes B runs after the splice (j = 0..horizon).
        check_rows: rows on which the t = T identity is checked against a plain forward.
        tolerance: the identity's bound on max |Δlogit| / max |logit|.
    Raises:
        WorkbenchError: the coda lens at t = T is not the model's output (beyond `tolerance`).
    """
    require_symbols(rows)
    T = check_loops(model, loops or default_loops(model, rows))
    if horizon < 0 or max_causal < 0 or check_rows < 1:
        raise WorkbenchError(f"lens_agreement needs horizon >= 0, max_causal >= 0 and check_rows >= 1, got "
                             f"{horizon}, {max_causal}, {check_rows}")
    fit_rows, eval_rows = split_rows(rows, fit_fraction, seed)
    passes = read_passes(model, tokenizer, rows, T, batch_size, progress, readout=True, desc="lens_agreement")
    identity = check_identity(model, tokenizer, rows[:check_rows], passes.readouts[:check_rows], T, tolerance)
    where = {r["row_id"]: i for i, r in enumerate(rows)}
    fit_idx, ev = [where[r["row_id"]] for r in fit_rows], [where[r["row_id"]] for r in eval_rows]
    maps = fit_tuned(passes.states[fit_idx], passes.readouts[fit_idx, T - 1], np.full(len(fit_idx), T), ridge)
    logits = lens_logits(model, tokenizer, eval_rows, passes.states[ev], passes.readouts[ev], maps)
    main, pairs = agreement_tables(eval_rows, logits)
    causal = causal_table(model, tokenizer, eval_rows, passes.states[ev], main, T, horizon, max_causal, batch_size,
                          seed, progress)
    return {"lens_agreement": main, "lens_agreement__pairs": pairs,
            "lens_agreement__summary": summary_table(main, pairs, seed),
            "lens_agreement__causal": causal, "lens_agreement__identity": identity}


def _head_logits(model, vectors: torch.Tensor, ids: torch.Tensor | None = None) -> torch.Tensor:
    """Unembedding of `vectors` [..., D] in float64 (over `ids` or the whole vocabulary)."""
    head = model.base.lm_head
    W = (head.weight if ids is None else head.weight[ids]).double()
    out = vectors.to(W.device).double() @ W.T
    if getattr(head, "bias", None) is not None:
        out = out + (head.bias if ids is None else head.bias[ids]).double()
    return out.cpu()


@torch.no_grad()
def check_identity(model, tokenizer, rows: list[dict], readouts: np.ndarray, T: int, tolerance: float) -> pd.DataFrame:
    """The coda lens at t = T against a plain forward to T over the whole vocabulary; raises when they differ."""
    device = device_of(model)
    worst, scale = 0.0, 0.0
    for idx, enc in batches(tokenizer, rows, len(rows), device):
        out = model(enc["input_ids"], attention_mask=enc["attention_mask"], loops=T)
        logits = out.logits if hasattr(out, "logits") else out
        pos = last_real_token(enc["attention_mask"])
        own = logits[torch.arange(len(idx), device=logits.device), pos].double().cpu()          # [B, V]
        lens = _head_logits(model, torch.as_tensor(readouts[idx, T - 1]))                        # [B, V]
        worst = max(worst, float((own - lens).abs().max()))
        scale = max(scale, float(own.abs().max()))
    rel = worst / max(scale, 1e-12)
    if not rel <= tolerance:
        raise WorkbenchError(f"lens_agreement: the coda lens at t = T = {T} is not the model's output: max |Δlogit| = "
                             f"{worst:.3g} against a largest logit of {scale:.3g} (relative {rel:.2g} > tolerance "
                             f"{tolerance:g}) on {len(rows)} rows; the lens reads the wrong hook, position or head")
    return pd.DataFrame([{"rows": len(rows), "max_abs_diff": worst, "max_abs_logit": scale, "tolerance": tolerance,
                          "holds": True}])


@torch.no_grad()
def lens_logits(model, tokenizer, rows: list[dict], states: np.ndarray, readouts: np.ndarray,
                maps: dict) -> dict[str, np.ndarray]:
    """Returns {lens: candidate logits [E, T, C]} (NaN where the tuned lens has no map)."""
    norm = model.final_norm  # the norm the head reads after, whatever the family calls it
    p = next(norm.parameters())
    E, T, _ = states.shape
    tuned = np.full_like(states, np.nan)
    for t, (mx, W, my) in maps.items():
        tuned[:, t - 1] = (states[:, t - 1] - mx) @ W + my
    normed = norm(torch.as_tensor(states, dtype=p.dtype, device=p.device)).double().cpu()
    vectors = {"logit": normed, "coda": torch.as_tensor(readouts), "tuned": torch.as_tensor(tuned)}
    cands = row_candidates(tokenizer, rows)
    out = {}
    for lens, V in vectors.items():
        out[lens] = np.stack([_head_logits(model, V[e], cands[e]).numpy() for e in range(E)])
    return out


def _log_softmax(x: np.ndarray) -> np.ndarray:
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def label_of(row: dict, t: int) -> str | None:
    """x_t of a row: f^t(x_0) for function-table rows (past the depth too), chain[t-1] for t <= d otherwise;
    a row without a chain (`workbench.tasks.user`) has its answer as the label at t = d, and none when its depth
    is not given."""
    if "table" in row:
        return iterate_from(row, row["start"], t)
    if row.get("chain") is None:
        return row["answer"] if t == row["depth"] else None
    chain = row.get("chain") or []
    return chain[t - 1] if t <= len(chain) else None


def agreement_tables(rows: list[dict], logits: dict[str, np.ndarray]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per row, pass and lens, per row, pass and lens pair) from candidate logits {lens: [E, T, C]}."""
    T = logits["coda"].shape[1]
    final_logp = _log_softmax(logits["coda"][:, T - 1])                                        # [E, C]
    records, pairs = [], []
    for e, row in enumerate(rows):
        final = row["symbols"][int(final_logp[e].argmax())]
        for t in range(1, T + 1):
            label = label_of(row, t)
            tops = {}
            for lens in LENSES:
                x = logits[lens][e, t - 1]
                if np.isnan(x).any():
                    continue
                top = row["symbols"][int(x.argmax())]
                tops[lens] = top
                kl = float((np.exp(final_logp[e]) * (final_logp[e] - _log_softmax(x))).sum())
                records.append((row["row_id"], row["depth"], t, lens, top, label, final, top == final,
                                None if label is None else top == label, max(kl, 0.0),
                                t > row["depth"] if row["depth"] >= 1 else None))   # None: depth not given
            for a, b in combinations(LENSES, 2):
                if a in tops and b in tops:
                    pairs.append((row["row_id"], row["depth"], t, f"{a}-{b}", tops[a] == tops[b]))
    main = pd.DataFrame.from_records(records, columns=["row_id", "depth", "loop", "lens", "top1", "label", "final",
                                                       "agree_final", "agree_label", "kl_final", "past_depth"])
    return main, pd.DataFrame.from_records(pairs, columns=["row_id", "depth", "loop", "pair", "agree"])


def summary_table(main: pd.DataFrame, pairs: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """Per pass and lens (or pair): the mean of each measure over rows with its 95% interval."""
    records = []

    def add(loop, lens, measure, values, proportion: bool):
        values = values.dropna().astype(float).to_numpy()
        n = len(values)
        if n == 0:
            return
        if proportion:
            low, high = wilson(int(values.sum()), n)
            method = "Wilson"
        else:
            iv = bootstrap_mean(values, n_boot=2000, seed=seed)
            low, high, method = iv.low, iv.high, "row bootstrap"
        records.append((int(loop), lens, measure, float(values.mean()), float(low), float(high), n, method))

    for (loop, lens), g in main.groupby(["loop", "lens"]):
        add(loop, lens, "agree_final", g["agree_final"], True)
        add(loop, lens, "agree_label", g["agree_label"], True)
        add(loop, lens, "kl_final", g["kl_final"], False)
    for (loop, pair), g in pairs.groupby(["loop", "pair"]):
        add(loop, pair, "agree_pair", g["agree"], True)
    return pd.DataFrame.from_records(records, columns=["loop", "lens", "measure", "value", "low", "high", "n", "method"])


CAUSAL_COLUMNS = ["row_a", "row_b", "depth", "loop", "j", "disagree", *LENSES, "predicted", *[f"expect_{x}" for x in LENSES],
                  *[f"carried_{x}" for x in LENSES], "coincide"]


@torch.no_grad()
def causal_table(model, tokenizer, rows: list[dict], states: np.ndarray, main: pd.DataFrame, T: int, horizon: int,
                 max_causal: int, batch_size: int, seed: int, progress: bool) -> pd.DataFrame:
    """Splices A's h_t into B's read position at pass t for cells where lenses disagree (module docstring)."""
    if max_causal == 0 or T - horizon < 1:
        return pd.DataFrame(columns=CAUSAL_COLUMNS)
    wide = main.set_index(["row_id", "loop", "lens"])["top1"].unstack("lens")
    wide = wide[[c for c in LENSES if c in wide.columns]]
    disagree = wide[wide.nunique(axis=1) > 1].reset_index()
    disagree = disagree[disagree["loop"] <= T - horizon]
    if disagree.empty:
        return pd.DataFrame(columns=CAUSAL_COLUMNS)
    rng = np.random.default_rng(seed)
    split = (disagree["logit"] != disagree["coda"]).to_numpy() if {"logit", "coda"} <= set(disagree.columns) \
        else np.zeros(len(disagree), dtype=bool)
    first = [int(i) for i in rng.permutation(np.flatnonzero(split))]        # logit vs coda first: the question
    rest = [int(i) for i in rng.permutation(np.flatnonzero(~split))]        # then cells where only tuned differs
    cells = disagree.iloc[sorted((first + rest)[:max_causal])]
    where = {r["row_id"]: i for i, r in enumerate(rows)}
    groups: dict[tuple, list[int]] = {}
    for i, r in enumerate(rows):
        groups.setdefault(tuple(r["symbols"]), []).append(i)
    order = {k: [int(i) for i in rng.permutation(v)] for k, v in groups.items()}
    recipient = {}
    for members in order.values():
        for k, i in enumerate(members):
            if len(members) > 1:
                recipient[i] = members[(k + 1) % len(members)]
    todo = [(where[c.row_id], recipient[where[c.row_id]], int(c.loop), {x: getattr(c, x, None) for x in LENSES})
            for c in cells.itertuples() if where[c.row_id] in recipient]
    device = device_of(model)
    records = []
    by_loop: dict[int, list] = {}
    for item in todo:
        by_loop.setdefault(item[2], []).append(item)
    chunks = [(t, items[k:k + batch_size]) for t, items in sorted(by_loop.items())
              for k in range(0, len(items), batch_size)]
    for t, chunk in tqdm(chunks, disable=not progress, desc="lens_agreement splice"):
        rows_b = [rows[b] for _, b, _, _ in chunk]
        enc = encode_prompts(tokenizer, [r["prompt"] for r in rows_b]).to(device)
        pos = last_real_token(enc["attention_mask"])
        batch = torch.arange(len(chunk), device=pos.device)
        spliced = torch.as_tensor(np.stack([states[a, t - 1] for a, _, _, _ in chunk]))

        def substitute(x, hook):
            out = x.clone()
            out[batch, pos] = spliced.to(device=x.device, dtype=x.dtype)
            return out

        cands = shared_candidates(row_candidates(tokenizer, rows_b).to(device))
        with model.hooks(fwd_hooks=[(hook_name("state", t), substitute)]):
            r = model.read(enc["input_ids"], attention_mask=enc["attention_mask"], loops=t + horizon, candidates=cands)
        pred = r.scores[:, :, -1].argmax(-1).cpu().numpy()                                   # [P, t + horizon]
        for p, (a, b, _, readings) in enumerate(chunk):
            row_b = rows[b]
            for j in range(horizon + 1):
                if j > 0 and "table" not in row_b:
                    break
                expect = {x: (None if readings[x] is None or pd.isna(readings[x])
                              else iterate_from(row_b, readings[x], j)) for x in LENSES}
                predicted = row_b["symbols"][int(pred[p, t + j - 1])]
                # the splice cannot tell two lenses apart when their different readings predict the same symbol
                by_reading = {readings[x]: expect[x] for x in LENSES if expect[x] is not None}
                coincide = len(set(by_reading.values())) < len(by_reading)
                kind = "logit-coda" if expect["logit"] is not None and readings["logit"] != readings["coda"] else "tuned"
                records.append((rows[a]["row_id"], row_b["row_id"], rows[a]["depth"], t, j, kind,
                                *[readings[x] if readings[x] is not None and not pd.isna(readings[x]) else None
                                  for x in LENSES], predicted, *[expect[x] for x in LENSES],
                                *[expect[x] is not None and expect[x] == predicted for x in LENSES], coincide))
    return pd.DataFrame.from_records(records, columns=CAUSAL_COLUMNS)


def carried_shares(causal: pd.DataFrame, j: int, disagree: str | None = None) -> dict[str, tuple[int, int]]:
    """{lens: (cells it carries, cells)} at splice offset j (only cells of kind `disagree` if given),
    coincidences left out."""
    kept = causal[(causal["j"] == j) & ~causal["coincide"].astype(bool)]
    if disagree is not None:
        kept = kept[kept["disagree"] == disagree]
    return {x: (int(kept[f"carried_{x}"].sum()), int(kept[x].notna().sum())) for x in LENSES}


def summarize(tables: dict[str, pd.DataFrame]) -> dict:
    """Numbers for summary.json: agreement per pass and lens, pairwise agreement, the causal shares, the identity."""
    s = tables["lens_agreement__summary"]
    out = {}
    for measure, g in s.groupby("measure"):
        out[measure] = {lens: {str(int(r.loop)): round(float(r.value), 4) for r in h.itertuples()}
                        for lens, h in g.groupby("lens")}
    causal = tables.get("lens_agreement__causal")
    if causal is not None and len(causal):
        out["carried"] = {f"j={j}": {x: {"carried": k, "cells": n} for x, (k, n) in carried_shares(causal, j).items()}
                          for j in sorted(causal["j"].unique())}
        out["carried_logit_coda"] = {f"j={j}": {x: {"carried": k, "cells": n} for x, (k, n)
                                                in carried_shares(causal, j, "logit-coda").items()}
                                     for j in sorted(causal["j"].unique())}
    ident = tables.get("lens_agreement__identity")
    if ident is not None and len(ident):
        out["identity_max_abs_diff"] = float(ident["max_abs_diff"].iloc[0])
    return {**out, "rows": int(tables["lens_agreement"]["row_id"].nunique()), "headline": headline(tables).to_dict()}


@probe_options
class Options:
    """The lens agreement probe's options (`run`'s keywords), checked before any probe of a battery runs."""

    loops: int | None = None
    fit_fraction: float = 0.5
    ridge: float = 0.1
    max_causal: int = 48
    horizon: int = 1
    check_rows: int = 8
    tolerance: float = 1e-4
    batch_size: Count = 8
    seed: int = 0
    progress: bool = False


SPEC = ProbeSpec(
    name="lens_agreement", parts=("causal", "identity", "pairs", "summary"), run=run, summarize=summarize,
    needs=("prompt", "answer", "symbols", ONE_TOKEN),
    options=Options,
)
