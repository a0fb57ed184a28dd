"""exit_rules: does a post-hoc exit rule read off the passes match a learned halting head?

From one forward per row batch to T (`workbench.probes.passes`): each pass's answer over the
task's candidates, its softmax p_t, the state h_t at the read position and, when the model has
them, every halting head's continue probability. The rows are split per depth into calibration
and reported rows exactly as the halting probe splits them (`split_rows(rows, calibration,
seed)`), so with the same rows, fraction and seed both probes use the same split. Each rule
stops a row at the first pass t >= t_min where its statistic crosses the threshold, else at T:

    stable       argmax unchanged for the last k passes (threshold k = 1, 2, ...)
    kl           KL(p_t ‖ p_{t-1}) <= threshold                     (t >= 2)
    entropy_drop H(p_t) / log C <= threshold: the normalised entropy has dropped below it
    step         ||h_t - h_{t-1}|| / ||h_{t-1}|| <= threshold        (t >= 2)
    step_second  |r_t - r_{t-1}| <= threshold, r the relative step: the second difference (t >= 3)
    max_prob     max p_t >= threshold

A native family with exits of its own (`own_exits`; Huginn's zero-shot exits `zero_shot_kl`,
`zero_shot_latent-diff`, ..., `workbench.models.native.raven_exits`) adds each at its default threshold, read
on the same rows.

Each rule is swept over its grid (`grids`; by default the statistic's 5th to 95th percentiles on
the calibration rows, k = 1..T-1 for `stable`); fixed depths k = 1..T, the oracle (the first
right pass) and the learned heads (the model's own, "head", and `heads`, as the halting probe
reads them) are on the same axes. Per method the threshold with the best calibration accuracy
(then fewer loops) is `chosen`. Against each learned head at its chosen threshold (the best
fixed depth when there is none), every rule's threshold whose calibration mean loops is the
closest to the reference's is `matched` (and `within` when it lies within `match_within` loops of
it); the rule within with the best calibration accuracy is compared with the reference on the
reported rows by an exact McNemar test (no test when no rule gets within).

Tables:
    exit_rules: method, threshold, t_min, mean_loops, accuracy, n, chosen, cal_mean_loops, cal_accuracy,
        agree_last — reported-row numbers (the halting probe's compute-accuracy axes); agree_last is the share of
        reported rows whose answer at the exit step is the last step's (T's), right or wrong (a table written
        before it reads without it)
    exit_rules__matched: reference, method, threshold, cal_mean_loops, cal_accuracy, mean_loops, accuracy, within,
        best
    exit_rules__test: reference, rule, rule_threshold, ref_threshold, n, rule_mean_loops, ref_mean_loops,
        rule_accuracy, ref_accuracy, rule_only, ref_only, p_mcnemar
    exit_rules__rows: row_id, depth, split, loop, predicted, correct, max_prob, entropy, kl_prev, step,
        step_second, stable
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from workbench.analysis.headlines.exit_rules import ABOVE, RULES, headline, stop_depth
from workbench.analysis.stats import paired_counts
from workbench.devices import device_of
from workbench.errors import WorkbenchError
from workbench.models.native.contract import NativeLoopedLM
from workbench.probes.common import ONE_TOKEN, batches, check_loops, default_loops, require_symbols, split_rows
from workbench.probes.halting import RULES as HEAD_RULES
from workbench.probes.halting import THRESHOLDS as HEAD_THRESHOLDS
from workbench.probes.halting import _depths as head_depths
from workbench.probes.halting import load_head
from workbench.probes.options import Count, Names, Paths, probe_options
from workbench.probes.passes import read_passes
from workbench.probes.spec import ProbeSpec


def run(model, tokenizer, rows: list[dict], loops: int | None = None, rules=RULES, grids: dict | None = None,
        t_min: int = 1, heads: dict | None = None, calibration: float = 0.5, match_within: float = 0.5,
        seed: int = 0, batch_size: int = 16, progress: bool = False) -> dict[str, pd.DataFrame]:
    """Returns the four tables of the module docstring.

    Args:
        loops: T, the budget (default the rows' max depth, at least 2; `common.default_loops` when a row gives
            none).
        rules: the rules to sweep (see the module docstring).
        grids: {rule: thresholds} replacing a rule's default grid.
        heads: {name: Stage 2 run directory} of more halting heads on the same frozen model.
        calibration: share of each depth's rows that choose thresholds (never reported).
        match_within: a rule is matched to a reference only when its closest calibration mean loops lie within
            this many loops of the reference's.
    """
    require_symbols(rows)
    unknown = [r for r in [*rules, *(grids or {})] if r not in RULES]
    if unknown:
        raise WorkbenchError(f"exit rule '{unknown[0]}' is unknown; accepted: {', '.join(RULES)}")
    T = check_loops(model, loops or default_loops(model, rows, at_least=2))
    extra = {name: load_head(model, path) for name, path in (heads or {}).items()}
    passes = read_passes(model, tokenizer, rows, T, batch_size, progress, heads={n: h for n, (h, _) in extra.items()},
                         desc="exit_rules")
    answer = np.array([r["symbols"].index(r["answer"]) for r in rows])
    stats = statistics(passes.scores, passes.states, answer)
    cal_rows, _ = split_rows(rows, calibration, seed)
    cal_ids = {r["row_id"] for r in cal_rows}
    cal = np.array([r["row_id"] in cal_ids for r in rows])
    learned = {}
    if "head" in passes.halt_probs:   # the model's own: a retrofit's head, or a native family's learned exit
        learned["head"] = (model.halt_rule, passes.halt_probs["head"])
    learned.update({n: (HEAD_RULES[objective], passes.halt_probs[n]) for n, (_, objective) in extra.items()})
    depths = sweep_depths(stats, T, t_min, list(rules), grids or {}, cal)
    for method, (rule, values) in learned.items():
        depths[method] = {float(th): head_depths(method, (rule, values), th, stats["correct"], T, t_min)
                          for th in HEAD_THRESHOLDS}
    depths.update(own_exit_depths(model, tokenizer, rows, T, batch_size))
    depths["fixed_k"] = {float(k): np.full(len(rows), k) for k in range(1, T + 1)}
    correct = stats["correct"]
    depths["oracle"] = {np.nan: np.where(correct.any(1), correct.argmax(1) + 1, 1)}
    table = curve_table(depths, correct, cal, t_min, stats["predicted"])
    references = list(learned) or ["fixed_k"]
    if match_within < 0:
        raise WorkbenchError(f"exit_rules match_within must be >= 0, got {match_within}")
    matched, tests = match_and_test(table, depths, correct, cal, list(rules), references, match_within)
    return {"exit_rules": table, "exit_rules__matched": matched, "exit_rules__test": tests,
            "exit_rules__rows": rows_table(rows, stats, cal, T)}


def own_exit_depths(model, tokenizer, rows: list[dict], T: int, batch_size: int) -> dict:
    """{method: {threshold: stop step per row}} of a native family's own exit criteria (`own_exits`: Huginn's
    zero-shot exits at the reference's default thresholds), else {}."""
    if not isinstance(model, NativeLoopedLM) or not model.own_exits:
        return {}
    depth = {method: np.zeros(len(rows), dtype=int) for method in model.own_exits}
    for idx, enc in batches(tokenizer, rows, batch_size, device_of(model)):
        steps = model.own_exit_steps(enc["input_ids"], enc["attention_mask"], loops=T)
        for method in depth:
            depth[method][idx] = steps[method].cpu().numpy()
    return {method: {float(model.own_exits[method]): depth[method]} for method in depth}


def statistics(scores: np.ndarray, states: np.ndarray, answer: np.ndarray) -> dict[str, np.ndarray]:
    """Per-pass statistics [R, T] from candidate scores [R, T, C], states [R, T, D] and answer indices [R]."""
    z = scores - scores.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    p = np.exp(logp)
    R, T, C = scores.shape
    predicted = scores.argmax(-1)
    entropy = -(p * logp).sum(-1) / np.log(C) if C > 1 else np.zeros((R, T))
    kl = np.full((R, T), np.nan)
    kl[:, 1:] = (p[:, 1:] * (logp[:, 1:] - logp[:, :-1])).sum(-1).clip(min=0)
    norm = np.linalg.norm(states, axis=-1)
    step = np.full((R, T), np.nan)
    step[:, 1:] = np.linalg.norm(states[:, 1:] - states[:, :-1], axis=-1) / np.maximum(norm[:, :-1], 1e-30)
    second = np.full((R, T), np.nan)
    second[:, 2:] = np.abs(step[:, 2:] - step[:, 1:-1])
    stable = np.zeros((R, T), dtype=int)               # passes the argmax has been unchanged for, ending at t
    for t in range(1, T):
        stable[:, t] = np.where(predicted[:, t] == predicted[:, t - 1], stable[:, t - 1] + 1, 0)
    return {"predicted": predicted, "correct": predicted == answer[:, None], "max_prob": p.max(-1),
            "entropy": entropy, "kl": kl, "step": step, "step_second": second, "stable": stable}


STATISTIC = {"stable": "stable", "kl": "kl", "entropy_drop": "entropy", "step": "step", "step_second": "step_second",
             "max_prob": "max_prob"}


def default_grid(rule: str, values: np.ndarray, cal: np.ndarray, T: int) -> list[float]:
    """k = 1..T-1 for `stable`; else the 5th..95th percentiles (step 5) of the statistic on the calibration rows."""
    if rule == "stable":
        return [float(k) for k in range(1, T)]
    v = values[cal].astype(float)
    v = v[~np.isnan(v)]
    if not len(v):
        return []
    return sorted({float(q) for q in np.percentile(v, np.arange(5, 100, 5))})


def sweep_depths(stats: dict, T: int, t_min: int, rules: list[str], grids: dict, cal: np.ndarray) -> dict:
    """{rule: {threshold: stopping pass per row [R]}}."""
    out = {}
    for rule in rules:
        values = stats[STATISTIC[rule]]
        grid = [float(x) for x in grids[rule]] if rule in grids else default_grid(rule, values, cal, T)
        out[rule] = {th: stop_depth(values, th, rule in ABOVE, t_min) for th in grid}
    return out


def _acc(correct: np.ndarray, depth: np.ndarray) -> float:
    return float(correct[np.arange(len(depth)), depth - 1].mean()) if len(depth) else float("nan")


def agree_last(predicted: np.ndarray, depth: np.ndarray) -> float:
    """Share of rows whose answer at their exit step (`depth` [R], 1-based) is their answer at the last step T, from
    the answers per step [R, T]."""
    if not len(depth):
        return float("nan")
    return float((predicted[np.arange(len(depth)), depth - 1] == predicted[:, -1]).mean())


def curve_table(depths: dict, correct: np.ndarray, cal: np.ndarray, t_min: int,
                predicted: np.ndarray) -> pd.DataFrame:
    """Reported-row mean loops, accuracy and agreement with the last step's answer per (method, threshold),
    calibration numbers beside them, `chosen`; `predicted` the answer index per row and step [R, T]."""
    rep = ~cal
    records = []
    for method, by_th in depths.items():
        for th, d in by_th.items():
            records.append({"method": method, "threshold": th, "t_min": t_min, "mean_loops": float(d[rep].mean()),
                            "accuracy": _acc(correct[rep], d[rep]), "n": int(rep.sum()),
                            "cal_mean_loops": float(d[cal].mean()), "cal_accuracy": _acc(correct[cal], d[cal]),
                            "agree_last": agree_last(predicted[rep], d[rep])})
    frame = pd.DataFrame.from_records(records)
    frame["chosen"] = False
    for _, g in frame.groupby("method", sort=False):
        best = max(g.index, key=lambda i: (g.at[i, "cal_accuracy"], -g.at[i, "cal_mean_loops"]))
        frame.at[best, "chosen"] = True
    return frame[["method", "threshold", "t_min", "mean_loops", "accuracy", "n", "chosen", "cal_mean_loops",
                  "cal_accuracy", "agree_last"]]


def _depth_of(depths: dict, method: str, threshold) -> np.ndarray:
    if method == "oracle" or pd.isna(threshold):
        return next(iter(depths[method].values()))
    return depths[method][float(threshold)]


def match_and_test(table: pd.DataFrame, depths: dict, correct: np.ndarray, cal: np.ndarray, rules: list[str],
                   references: list[str], within: float = 0.5) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Each rule at the calibration mean loops of each reference (`within`: whether it gets within that many
    loops of it); the best rule among those within, against the reference (exact McNemar)."""
    rep = ~cal
    matched, tests = [], []
    for ref in references:
        r = table[(table["method"] == ref) & table["chosen"]].iloc[0]
        target = float(r["cal_mean_loops"])
        picks = []
        for rule in rules:
            g = table[table["method"] == rule]
            if g.empty:
                continue
            i = min(g.index, key=lambda k: (abs(g.at[k, "cal_mean_loops"] - target), -g.at[k, "cal_accuracy"]))
            picks.append(g.loc[i])
        close = [k for k, p in enumerate(picks) if abs(p["cal_mean_loops"] - target) <= within + 1e-9]
        best = max(close, key=lambda k: (picks[k]["cal_accuracy"], -abs(picks[k]["cal_mean_loops"] - target))) \
            if close else None
        for k, p in enumerate(picks):
            matched.append({"reference": ref, "method": p["method"], "threshold": float(p["threshold"]),
                            "cal_mean_loops": float(p["cal_mean_loops"]), "cal_accuracy": float(p["cal_accuracy"]),
                            "mean_loops": float(p["mean_loops"]), "accuracy": float(p["accuracy"]),
                            "within": k in close, "best": k == best})
        if best is None:
            continue
        p = picks[best]
        d_rule, d_ref = _depth_of(depths, p["method"], p["threshold"]), _depth_of(depths, ref, r["threshold"])
        ok_rule = correct[np.arange(len(d_rule)), d_rule - 1][rep]
        ok_ref = correct[np.arange(len(d_ref)), d_ref - 1][rep]
        counts = paired_counts(ok_ref, ok_rule)  # B = the rule: helped = rows only the rule gets right
        rule_only, ref_only = counts.helped, counts.hurt
        tests.append({"reference": ref, "rule": p["method"], "rule_threshold": float(p["threshold"]),
                      "ref_threshold": float(r["threshold"]), "n": int(rep.sum()),
                      "rule_mean_loops": float(d_rule[rep].mean()), "ref_mean_loops": float(d_ref[rep].mean()),
                      "rule_accuracy": float(ok_rule.mean()), "ref_accuracy": float(ok_ref.mean()),
                      "rule_only": rule_only, "ref_only": ref_only, "p_mcnemar": counts.p_mcnemar})
    return pd.DataFrame.from_records(matched), pd.DataFrame.from_records(tests)


def rows_table(rows: list[dict], stats: dict, cal: np.ndarray, T: int) -> pd.DataFrame:
    records = [(r["row_id"], r["depth"], "calibration" if cal[i] else "reported", t + 1,
                r["symbols"][int(stats["predicted"][i, t])], bool(stats["correct"][i, t]),
                float(stats["max_prob"][i, t]), float(stats["entropy"][i, t]), float(stats["kl"][i, t]),
                float(stats["step"][i, t]), float(stats["step_second"][i, t]), int(stats["stable"][i, t]))
               for i, r in enumerate(rows) for t in range(T)]
    return pd.DataFrame.from_records(records, columns=["row_id", "depth", "split", "loop", "predicted", "correct",
                                                       "max_prob", "entropy", "kl_prev", "step", "step_second",
                                                       "stable"])


def summarize(tables: dict[str, pd.DataFrame]) -> dict:
    """Numbers for summary.json: each method at its chosen threshold, the matched rules and the paired tests."""
    f = tables["exit_rules"]
    chosen = {r.method: {"threshold": None if pd.isna(r.threshold) else float(r.threshold),
                         "mean_loops": round(float(r.mean_loops), 4), "accuracy": round(float(r.accuracy), 4),
                         # a table written before agree_last reads as it did, without it
                         **({"agree_last": round(float(r.agree_last), 4)} if "agree_last" in f else {})}
              for r in f[f["chosen"]].itertuples()}
    tests = tables.get("exit_rules__test")
    out = {"chosen": chosen, "tests": [] if tests is None else tests.round(4).to_dict(orient="records")}
    return {**out, "headline": headline(tables).to_dict()}


@probe_options
class Options:
    """The exit rules probe's options (`run`'s keywords), checked before any probe of a battery runs."""

    loops: int | None = None
    rules: Names = RULES
    grids: dict | None = None
    t_min: int = 1
    heads: Paths = None
    calibration: float = 0.5
    match_within: float = 0.5
    seed: int = 0
    batch_size: Count = 16
    progress: bool = False


SPEC = ProbeSpec(
    name="exit_rules", parts=("matched", "rows", "test"), run=run, summarize=summarize,
    needs=("prompt", "answer", "symbols", ONE_TOKEN),
    options=Options,
)
