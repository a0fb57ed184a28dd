"""Halting: the compute-accuracy curve (RecurTrace Sec. 4, Fig. 1, App. F), and real early exit.

Needs a model with a halting head; otherwise `NotApplicable`. One forward per row batch to T
reads each row's final answer at every loop (any task, `read_final`) and every halting head's
continue probability p_t. The rows are split per depth (by `seed`) into calibration rows, where
each rule's threshold and the best fixed depth are chosen, and reported rows, where every number
in the tables is measured: a threshold is never chosen on the rows it is reported on.

Methods (a row's answer is graded at the loop where it stops; T is the budget):
    fixed_k      every row stops at k, k = 1..T; the best k on the calibration rows is `chosen`;
    oracle       the first loop whose answer is right (loop 1 when none is): the upper bound at least compute;
    head         the model's own head (the halting stage distils it from oracle labels): the first t >= t_min with
                 p_t < threshold (`workbench.loop.halting.halt_depth`);
    <name>       each head of `heads` ({name: halting-stage run directory on the same frozen model}), stopped by the
                 rule of its objective: oracle as `head`; act at the first t where the halting mass
                 sum_s (1 - p_s) >= threshold; pondernet where the CDF 1 - prod_s p_s >= threshold;
    confidence   the first t >= t_min whose answer confidence (`read_final`) >= threshold; it needs the
                 Coda at every loop, which mean loops does not count.

Floors: `t_min` is the floor of the methods above; each extra floor f of `floors` adds every threshold
method again as `<method>+floor<f>` (RecurTrace Table 2: the main comparison with T_min = 2, "ACT+floor";
Table 3's per-task heads run without one). Fixed depths and the oracle take no floor.

Choosing a threshold (`select`, on the calibration rows): "likelihood" (RecurTrace Sec. 3 and App. G: the
smallest mean depth that does not lose held-out likelihood) keeps the thresholds whose mean answer
log-likelihood at the stopping loop is within `LIKELIHOOD_TOL` nats of the method's best and takes the one
with the fewest mean loops; "accuracy" takes the best calibration accuracy, then fewer loops. The best fixed
depth is always the most accurate k on the calibration rows (then the smaller k): it is the comparison's
definition, not a tuned rule.

Tables:
    halting: method, threshold, t_min, mean_loops, accuracy, n, chosen, cal_accuracy, cal_loglik, cal_loops,
        select — reported rows only, with each point's calibration readings that chose it.
    halting__difficulty: method, threshold, group ("hard": wrong at loop 1, "easy": right), n, mean_loops,
        accuracy — each method at its chosen threshold, reported rows.
    halting__chosen: method, threshold, row_id, depth, loops, correct — each method at its chosen threshold,
        row by row on the reported rows (for paired tests between methods).
    halting__adaptive: policy, tau, t_min, budget, rows, row_loops, accuracy, agree, wall_s — the head at
        its chosen tau run through `LoopedLM.adaptive_read` (rows leave the batch), beside fixed depths
        (tau = 0) at the budget and at the best fixed k, in the same run; `agree` is the share of rows
        stopping where the one-pass reading says. Absent for stand-ins without `adaptive_read`.
    halting__rows: row_id, depth, split, head, loop, continue_prob, correct_answer.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import tomllib
import torch

from workbench.analysis.headlines.halting import headline
from workbench.devices import device_of
from workbench.errors import WorkbenchError
from workbench.loop.halting import HaltPolicy, halt_depth
from workbench.probes.common import (
    HALTING_HEAD,
    batches,
    check_loops,
    default_loops,
    read_final,
    require,
    row_candidates,
    shared_candidates,
    split_rows,
)
from workbench.probes.options import Count, Paths, probe_options
from workbench.probes.spec import ProbeSpec
from workbench.run_tensors import read_tensors
from workbench.runs import RECIPE, TRAINABLE, read_retrofit, verify_files
from workbench.tasks.reader import answer_batches, grade_answers, read_positions, reads_symbol

THRESHOLDS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
RULES = {"oracle": "threshold", "act": "mass", "pondernet": "cdf"}
SELECT = ("likelihood", "accuracy")
LIKELIHOOD_TOL = 0.01  # nats per row: "does not lose held-out likelihood", fixed before any run read it


def run(model, tokenizer, rows: list[dict], loops: int | None = None, thresholds=THRESHOLDS, t_min: int = 1,
        floors=(), select: str = "likelihood", heads: dict | None = None, calibration: float = 0.5, seed: int = 0,
        batch_size: int = 16, progress: bool = False) -> dict[str, pd.DataFrame]:
    """Returns {"halting", "halting__difficulty", "halting__chosen", "halting__rows"} and, for a LoopedLM,
    "halting__adaptive".

    Args:
        loops: T, the budget (default the rows' max depth, at least 2; `common.default_loops` when a row gives
            none).
        t_min: the floor of the threshold methods; floors: more floors, each adding `<method>+floor<f>` rows.
        select: how a threshold is chosen on the calibration rows ("likelihood" or "accuracy"; module doc).
        heads: {method name: run directory} of more halting-stage heads trained on the same frozen model.
        calibration: share of each depth's rows used to choose thresholds (never reported).
    Raises:
        NotApplicable: the model has no halting head.
        WorkbenchError: an unknown `select`, or a floor outside 1..T.
    """
    require(HALTING_HEAD, model, rows)
    if select not in SELECT:
        raise WorkbenchError(f"halting: select = {select!r} is not one of {', '.join(SELECT)}")
    T = check_loops(model, loops or default_loops(model, rows, at_least=2))
    floors = sorted({int(f) for f in floors} - {int(t_min)})
    if [f for f in [t_min, *floors] if not 1 <= f <= T]:
        raise WorkbenchError(f"halting: every floor (t_min = {t_min}, floors = {floors}) must lie in 1..{T}, the budget")
    extra = {name: load_head(model, path) for name, path in (heads or {}).items()}
    read = read_final(model, tokenizer, rows, T, batch_size, progress, {n: h for n, (h, _) in extra.items()})
    cal_rows, rep_rows = split_rows(rows, calibration, seed)
    where = {r["row_id"]: i for i, r in enumerate(rows)}
    cal, rep = [where[r["row_id"]] for r in cal_rows], [where[r["row_id"]] for r in rep_rows]
    rules = {"head": ("threshold", read.halt_probs["head"])}
    rules.update({n: (RULES[objective], read.halt_probs[n]) for n, (_, objective) in extra.items()})
    rules["confidence"] = ("confidence", read.confidence)
    records, picks = [], {}
    for k in range(1, T + 1):
        records.append(("fixed_k", np.nan, k, 1))
    records.append(("oracle", np.nan, None, 1))
    for floor in [t_min, *floors]:
        suffix = "" if floor == t_min else f"+floor{floor}"
        for method, (rule, values) in rules.items():
            records += [(method + suffix, float(th), (rule, values), floor) for th in thresholds]
    table = []
    for method, th, how, floor in records:
        depth = _depths(method, how, th, read.correct, T, floor)
        table.append({"method": method, "threshold": th, "t_min": floor, "mean_loops": float(depth[rep].mean()),
                      "accuracy": _acc(read.correct[rep], depth[rep]), "n": len(rep),
                      "cal_accuracy": _acc(read.correct[cal], depth[cal]) if cal else np.nan,
                      "cal_loglik": _loglik(read.logprob[cal], depth[cal]) if cal else np.nan,
                      "cal_loops": float(depth[cal].mean()) if cal else np.nan,
                      "select": "accuracy" if method == "fixed_k" else select, "_depth": depth})
    frame = pd.DataFrame(table)
    frame["chosen"] = False
    for method, g in frame.groupby("method", sort=False):
        best = choose(g, "accuracy" if method == "fixed_k" else select)
        frame.at[best, "chosen"] = True
        picks[method] = frame.loc[best]
    out = {"halting": frame.drop(columns=["_depth"]),
           "halting__difficulty": _difficulty(picks, read.correct, rep),
           "halting__chosen": _chosen(picks, rows, read.correct, rep),
           "halting__rows": _rows_table(rows, read, set(rep), T)}
    if "adaptive_read" in model.supports:
        out["halting__adaptive"] = _adaptive(model, tokenizer, [rows[i] for i in rep], picks, read, rep, T, batch_size)
    return out


def choose(points: pd.DataFrame, select: str):
    """The index of the chosen point among one method's thresholds, from their calibration readings.

    "accuracy": the best cal_accuracy, then the fewest cal_loops. "likelihood": among the points whose cal_loglik
    is within LIKELIHOOD_TOL of the best, the fewest cal_loops, then the higher cal_loglik. No calibration rows
    (all NaN): the first point.
    """
    acc, ll, loops = (points[c].fillna(-np.inf if c != "cal_loops" else 0.0) for c in
                      ("cal_accuracy", "cal_loglik", "cal_loops"))
    if select == "accuracy":
        return max(points.index, key=lambda i: (acc[i], -loops[i]))
    keep = [i for i in points.index if ll[i] >= ll.max() - LIKELIHOOD_TOL]
    return min(keep, key=lambda i: (loops[i], -ll[i]))


def load_head(model, run_dir) -> tuple[torch.nn.Module, str]:
    """Returns (a copy of the model's halting head holding a halting-stage run's weights, that run's objective).

    The run directory is read through its checks first, as `load_run` reads one: every file's SHA-256
    against provenance.json (`verify_files`; a delta file's parents resolved and checked) and the retrofit
    record's fields (`read_retrofit`).

    Raises:
        WorkbenchError: not a finished run directory, a file that differs from its recorded hash, an unreadable
            tensor file, or a run whose other trained tensors differ from the model's (another Stage 1 model).
    """
    run_dir = Path(run_dir)
    verify_files(run_dir)
    record, _ = read_retrofit(run_dir)
    tensors, _ = read_tensors(run_dir / TRAINABLE)   # a delta file's parents resolved and checked by digest
    own = dict(model.named_parameters())
    differ = [n for n, v in tensors.items() if not n.startswith("halting.")
              and (n not in own or not torch.equal(own[n].detach().float().cpu(), v.float()))]
    if differ:
        raise WorkbenchError(f"halting head '{run_dir}' was trained on another Stage 1 model ({differ[0]} differs); "
                             "heads are compared on one frozen model")
    head = copy.deepcopy(model.halting)
    head.load_state_dict({n.removeprefix("halting."): v for n, v in tensors.items() if n.startswith("halting.")})
    head.pooling = record["settings"].get("halting_pooling", head.pooling)  # a head may pool otherwise (mean / last)
    objective = tomllib.loads((run_dir / RECIPE).read_text()).get("halting", {}).get("objective", "oracle")
    return head.to(device_of(model)).eval(), objective


def _depths(method: str, how, th: float, correct: np.ndarray, T: int, t_min: int) -> np.ndarray:
    """Stopping loop per row [R] (1-based) of one method at one threshold."""
    if method == "fixed_k":
        return np.full(len(correct), how)
    if method == "oracle":
        return np.where(correct.any(1), correct.argmax(1) + 1, 1)
    rule, values = how
    if rule == "threshold":
        return halt_depth(torch.as_tensor(values), th, t_min).numpy()
    stop = {"mass": np.cumsum(1 - values, axis=1) >= th, "cdf": 1 - np.cumprod(values, axis=1) >= th,
            "confidence": values >= th}[rule]
    return _first(stop, t_min)


def _first(stop: np.ndarray, t_min: int) -> np.ndarray:
    """First loop (1-based) >= t_min where `stop` [R, T] holds, else T."""
    stop = stop.copy()
    stop[:, : max(0, t_min - 1)] = False
    stop[:, -1] = True
    return stop.argmax(1) + 1


def _acc(correct: np.ndarray, chosen: np.ndarray) -> float:
    return float(correct[np.arange(len(chosen)), np.asarray(chosen) - 1].mean()) if len(chosen) else float("nan")


def _loglik(logprob: np.ndarray, chosen: np.ndarray) -> float:
    """Mean answer log-likelihood at each row's stopping loop."""
    return float(logprob[np.arange(len(chosen)), np.asarray(chosen) - 1].mean()) if len(chosen) else float("nan")


def _difficulty(picks: dict, correct: np.ndarray, rep: list[int]) -> pd.DataFrame:
    """Mean loops and accuracy of hard (wrong at loop 1) and easy rows, each method at its chosen threshold."""
    records = []
    hard = ~correct[rep, 0]
    for method, row in picks.items():
        depth = row["_depth"][rep]
        for group, mask in (("hard", hard), ("easy", ~hard)):
            records.append({"method": method, "threshold": row["threshold"], "group": group, "n": int(mask.sum()),
                            "mean_loops": float(depth[mask].mean()) if mask.any() else np.nan,
                            "accuracy": _acc(correct[rep][mask], depth[mask]) if mask.any() else np.nan})
    return pd.DataFrame.from_records(records)


def _chosen(picks: dict, rows: list[dict], correct: np.ndarray, rep: list[int]) -> pd.DataFrame:
    """Each method at its chosen threshold, row by row on the reported rows (paired tests read this)."""
    records = [{"method": method, "threshold": row["threshold"], "row_id": rows[i]["row_id"],
                "depth": rows[i]["depth"], "loops": int(row["_depth"][i]),
                "correct": bool(correct[i, int(row["_depth"][i]) - 1])}
               for method, row in picks.items() for i in rep]
    return pd.DataFrame.from_records(records, columns=["method", "threshold", "row_id", "depth", "loops", "correct"])


def _rows_table(rows: list[dict], read, reported: set[int], T: int) -> pd.DataFrame:
    records = [(r["row_id"], r["depth"], "reported" if i in reported else "calibration", head, t + 1,
                float(probs[i, t]), bool(read.correct[i, t]))
               for head, probs in read.halt_probs.items() for i, r in enumerate(rows) for t in range(T)]
    return pd.DataFrame.from_records(records, columns=["row_id", "depth", "split", "head", "loop", "continue_prob",
                                                       "correct_answer"])


@torch.no_grad()
def _adaptive(model, tokenizer, rows: list[dict], picks: dict, read, rep: list[int], T: int,
              batch_size: int) -> pd.DataFrame:
    """The chosen head policy through real early exit, beside fixed depths run the same way, timed in one run."""
    tau, floor = float(picks["head"]["threshold"]), int(picks["head"]["t_min"])
    best_k = int(picks["fixed_k"]["mean_loops"])
    expected = picks["head"]["_depth"][rep]
    policies = {"head": HaltPolicy(tau, min(floor, T), T), f"fixed_{T}": HaltPolicy(0.0, 1, T),
                f"fixed_{best_k}": HaltPolicy(0.0, 1, best_k)}
    device = device_of(model)
    if reads_symbol(rows[0]):
        chunks = [(idx, e, {"candidates": shared_candidates(row_candidates(tokenizer, [rows[i] for i in idx])
                                                            .to(device))})
                  for idx, e in batches(tokenizer, rows, batch_size, device)]
    else:
        chunks = [(idx, b, {"positions": read_positions(b)})
                  for idx, b in answer_batches(model, tokenizer, rows, 1, batch_size)]
    records = []
    for name, policy in policies.items():
        used, right, row_loops = np.zeros(len(rows), dtype=int), np.zeros(len(rows), dtype=bool), 0
        start = time.perf_counter()
        for idx, b, kw in chunks:
            out = model.adaptive_read(b["input_ids"], b["attention_mask"], policy=policy, **kw)
            used[idx], row_loops = out.loops_used.cpu().numpy(), row_loops + out.row_loops
            if "candidates" in kw:
                answer = torch.tensor([rows[i]["symbols"].index(rows[i]["answer"]) for i in idx])
                right[idx] = (out.scores[:, -1].argmax(-1).cpu() == answer).numpy()
            else:
                right[idx] = grade_answers(tokenizer, out.scores.unsqueeze(1), b)[1][:, 0].cpu().numpy()
        wall = time.perf_counter() - start
        agree = float((used == expected).mean()) if name == "head" else float((used == policy.max_loops).mean())
        records.append({"policy": name, "tau": policy.tau, "t_min": policy.min_loops, "budget": policy.max_loops,
                        "rows": len(rows), "row_loops": row_loops, "accuracy": float(right.mean()), "agree": agree,
                        "wall_s": wall})
    return pd.DataFrame.from_records(records)


def summarize(tables: dict[str, pd.DataFrame]) -> dict:
    """Headline numbers: each method at its chosen threshold (mean loops, accuracy), hard vs easy depth, early exit."""
    f = tables["halting"]
    chosen = f[f["chosen"]] if "chosen" in f else f.iloc[0:0]
    out = {r.method: {"threshold": None if pd.isna(r.threshold) else float(r.threshold),
                      "mean_loops": round(float(r.mean_loops), 4), "accuracy": round(float(r.accuracy), 4)}
           for r in chosen.itertuples()}
    if "halting__difficulty" in tables:
        d = tables["halting__difficulty"]
        out["depth_by_difficulty"] = {f"{r.method}/{r.group}": None if pd.isna(r.mean_loops) else
                                      round(float(r.mean_loops), 4) for r in d.itertuples()}
    if "halting__adaptive" in tables:
        out["adaptive"] = tables["halting__adaptive"].round(4).to_dict(orient="records")
    return {"chosen": out, "headline": headline(tables).to_dict()}


@probe_options
class Options:
    """The halting probe's options (`run`'s keywords), checked before any probe of a battery runs."""

    loops: int | None = None
    thresholds: Sequence[float] = THRESHOLDS
    t_min: int = 1
    floors: Sequence[int] = ()
    select: str = "likelihood"
    heads: Paths = None
    calibration: float = 0.5
    seed: int = 0
    batch_size: Count = 16
    progress: bool = False


SPEC = ProbeSpec(
    name="halting", parts=("adaptive", "chosen", "difficulty", "rows"), run=run, summarize=summarize,
    needs=("prompt", "answer", "symbols", HALTING_HEAD),
    options=Options,
)
