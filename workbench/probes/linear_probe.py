"""Linear probes: is x_{t-1}, x_t or x_{t+1} linearly decodable from loop t's state before the Coda reads it?

Features are the loop-t state h_t at the read position (`site` "state") and, optionally, the
residual after chosen block layers of loop t (`site` "block.<i>"), gathered in one forward per
row batch. For every (loop, site, target) a scikit-learn logistic regression (standardised
features) is fitted on one half of the rows (split by row, per depth, `seed`) and scored on
the other; the null is the same fit on label-permuted training rows, scored on the untouched
test rows: its 95th percentile over `n_perm` permutations. Only active loops (t <= d) are used;
x_{t+1} past d is the chain continued (f^{t+1}(x0)).

Table:
    linear_probe: loop, site, target ("x_prev" | "x_t" | "x_next"), accuracy, null_p95, n_train,
        n_test, chance (the test share of the most frequent training label)
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Literal

import numpy as np
import pandas as pd
import torch
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from threadpoolctl import threadpool_limits
from tqdm.auto import tqdm

from workbench.analysis.headlines.linear_probe import headline
from workbench.devices import device_of
from workbench.errors import WorkbenchError
from workbench.loop.hooks import hook_name
from workbench.loop.positions import last_real_token
from workbench.probes.common import FUNCTION_TABLE, batches, check_loops, iterate, require_chase, split_rows
from workbench.probes.options import Count, Names, probe_options
from workbench.probes.spec import ProbeSpec

TARGETS = {"x_prev": -1, "x_t": 0, "x_next": 1}


def run(model, tokenizer, rows: list[dict], layers=(), targets=tuple(TARGETS), test_fraction: float = 0.5,
        n_perm: int = 20, C: float = 1.0, batch_size: int = 16, seed: int = 0,
        progress: bool = False) -> pd.DataFrame:
    """Returns the linear_probe table (see the module docstring).

    Args:
        layers: block layers (absolute indices) whose residual is probed besides the state; the
            string "mid" means the block's middle layer.
        targets: any of "x_prev", "x_t", "x_next".
        n_perm: label permutations for the null.
        C: inverse regularisation strength of the logistic regression.
    """
    require_chase(rows)
    layers = _layers(model, layers)
    bad = [t for t in targets if t not in TARGETS]
    if bad:
        raise WorkbenchError(f"linear_probe target '{bad[0]}' is unknown; accepted: {', '.join(TARGETS)}")
    T = check_loops(model, max(r["depth"] for r in rows))
    features = collect_features(model, tokenizer, rows, layers, T, batch_size, progress)
    test_ids = {r["row_id"] for r in split_rows(rows, test_fraction, seed)[0]}
    is_test = np.array([r["row_id"] in test_ids for r in rows])
    records = []
    for (site, loop), X in features.items():
        active = np.array([r["depth"] >= loop for r in rows])
        for target in targets:
            y = np.array([iterate(r, loop + TARGETS[target]) for r in rows])
            train, test = active & ~is_test, active & is_test
            records.append(dict(loop=loop, site=site, target=target,
                                **probe(X[train], y[train], X[test], y[test], n_perm, C, seed)))
    return pd.DataFrame.from_records(records)


def _layers(model, layers) -> list[int]:
    if isinstance(layers, str):
        layers = [layers]
    out = [model.a + (model.b - model.a) // 2 if i == "mid" else int(i) for i in layers]
    bad = [i for i in out if not model.a <= i < model.b]
    if bad:
        raise WorkbenchError(f"linear_probe layer {bad[0]} is not a block layer; accepted: {model.a}..{model.b - 1} or 'mid'")
    return out


@torch.no_grad()
def collect_features(model, tokenizer, rows, layers, T, batch_size, progress) -> dict[tuple[str, int], np.ndarray]:
    """Returns {(site, loop): features [R, D]} at each row's read position."""
    device = device_of(model)
    out: dict[tuple[str, int], np.ndarray] = {}
    for idx, enc in tqdm(list(batches(tokenizer, rows, batch_size, device)), disable=not progress,
                         desc="linear_probe"):
        mask = enc["attention_mask"]
        read_pos = last_real_token(mask)
        batch = torch.arange(len(idx), device=device)
        grabbed: dict[tuple[str, int], torch.Tensor] = {}

        def grab(site, t):
            def hook(x, hook):
                grabbed[(site, t)] = x[batch, read_pos].float().cpu()
            return hook

        hooks = [(hook_name("state", t), grab("state", t)) for t in range(1, T + 1)]
        hooks += [(hook_name("block_resid", t, i), grab(f"block.{i}", t)) for t in range(1, T + 1) for i in layers]
        with model.hooks(fwd_hooks=hooks):
            model(enc["input_ids"], attention_mask=mask, loops=T)  # the Coda runs once: states are all we need
        for key, value in grabbed.items():
            if key not in out:
                out[key] = np.zeros((len(rows), value.shape[-1]), dtype=np.float32)
            out[key][idx] = value.numpy()
    return dict(sorted(out.items(), key=lambda kv: (kv[0][1], kv[0][0] != "state", kv[0][0])))


def probe(X_train, y_train, X_test, y_test, n_perm: int, C: float, seed: int) -> dict:
    """Returns accuracy, null_p95, n_train, n_test, chance of one logistic-regression probe."""
    n_train, n_test = len(y_train), len(y_test)
    base = dict(n_train=n_train, n_test=n_test)
    if n_test == 0 or len(set(y_train)) < 2:
        return dict(accuracy=np.nan, null_p95=np.nan, chance=np.nan, **base)
    labels, counts = np.unique(y_train, return_counts=True)
    chance = float(np.mean(y_test == labels[counts.argmax()]))
    rng = np.random.default_rng(seed)
    with threadpool_limits(1):  # many small fits: extra BLAS threads only spin-wait
        accuracy = _fit_score(X_train, y_train, X_test, y_test, C)
        null = [_fit_score(X_train, rng.permutation(y_train), X_test, y_test, C) for _ in range(n_perm)]
    return dict(accuracy=accuracy, null_p95=float(np.percentile(null, 95)) if null else np.nan, chance=chance, **base)


def _fit_score(X_train, y_train, X_test, y_test, C: float) -> float:
    clf = make_pipeline(StandardScaler(), LogisticRegression(C=C, max_iter=300))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf.fit(X_train, y_train)
    return float(clf.score(X_test, y_test))


def summarize(tables: dict[str, pd.DataFrame]) -> dict:
    """Headline numbers: accuracy and null per (site, target, loop)."""
    out: dict[str, dict] = {}
    for r in tables["linear_probe"].itertuples():
        out.setdefault(f"{r.site}/{r.target}", {})[str(int(r.loop))] = {
            "accuracy": None if np.isnan(r.accuracy) else round(float(r.accuracy), 4),
            "null_p95": None if np.isnan(r.null_p95) else round(float(r.null_p95), 4)}
    return {"probes": out, "headline": headline(tables).to_dict()}


@probe_options
class Options:
    """The linear probe's options (`run`'s keywords), checked before any probe of a battery runs."""

    layers: Sequence[int | Literal["mid"]] = ()
    targets: Names = tuple(TARGETS)
    test_fraction: float = 0.5
    n_perm: int = 20
    C: float = 1.0
    batch_size: Count = 16
    seed: int = 0
    progress: bool = False


SPEC = ProbeSpec(
    name="linear_probe", run=run, summarize=summarize,
    needs=("prompt", "depth", "table", "start", FUNCTION_TABLE),
    options=Options,
)
