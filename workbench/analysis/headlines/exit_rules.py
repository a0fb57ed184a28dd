"""The exit-rules probe's headline: the best post-hoc exit rule against the learned head (or the best fixed depth) at
matched mean loops.

The rules and their stopping depth are defined here: the probe sweeps them and the headline reads the sweep.

Read from the probe's tables alone (`workbench.probes.exit_rules` writes them), so a results directory is read again
without the model.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from workbench.analysis.headlines import Headline, measured, proportion

RULES = ("stable", "kl", "entropy_drop", "step", "step_second", "max_prob")
ABOVE = ("stable", "max_prob")   # rules that stop when the statistic is at least the threshold; the others at most


def stop_depth(values: np.ndarray, threshold: float, above: bool, t_min: int) -> np.ndarray:
    """First pass (1-based) >= t_min where values [R, T] cross `threshold` (>= if `above`, else <=), else T.
    NaN (a statistic a pass does not have) never stops."""
    with np.errstate(invalid="ignore"):
        stop = values >= threshold if above else values <= threshold
    stop = np.where(np.isnan(values.astype(float)), False, stop)
    stop[:, : max(0, t_min - 1)] = False
    stop[:, -1] = True
    return stop.argmax(1) + 1


def headline(tables: dict[str, pd.DataFrame]) -> Headline:
    """The best rule at the reference's matched mean loops against the reference (a learned head, else the best
    fixed depth) on the reported rows: accuracies (Wilson), loops, the exact McNemar p."""
    tests = tables.get("exit_rules__test")
    rows = tables.get("exit_rules__rows")
    numbers, words = [], []
    f = tables["exit_rules"]
    for t in ([] if tests is None else tests.itertuples()):
        numbers += [measured(f"{t.reference}_accuracy", f"accuracy, {t.reference} at its chosen threshold",
                             round(float(t.ref_accuracy), 4), "proportion", n=int(t.n)),
                    measured(f"{t.reference}_rule_accuracy", f"accuracy, {t.rule} matched to {t.reference}'s loops",
                             round(float(t.rule_accuracy), 4), "proportion", n=int(t.n),
                             expect="≥ the learned head if a post-hoc readout suffices"),
                    measured(f"{t.reference}_rule_loops", f"mean loops, {t.rule} matched to {t.reference}",
                             round(float(t.rule_mean_loops), 2)),
                    measured(f"{t.reference}_loops", f"mean loops, {t.reference}", round(float(t.ref_mean_loops), 2)),
                    measured(f"{t.reference}_p", f"exact McNemar p, {t.rule} vs {t.reference}",
                             round(float(t.p_mcnemar), 4))]
        words.append(f"{t.rule} (threshold {t.rule_threshold:.3g}) matched to {t.reference}'s loops reads "
                     f"{t.rule_accuracy:.2f} after {t.rule_mean_loops:.2f} loops against {t.reference}'s "
                     f"{t.ref_accuracy:.2f} after {t.ref_mean_loops:.2f} ({t.rule_only} rows only the rule gets right, "
                     f"{t.ref_only} only {t.reference}; exact McNemar p = {t.p_mcnemar:.2g}, n = {t.n})")
    m = tables.get("exit_rules__matched")
    if m is not None and len(m) and "within" in m:
        tested = set() if tests is None or tests.empty else set(tests["reference"])
        for ref in [r for r in dict.fromkeys(m["reference"]) if r not in tested]:
            words.append(f"no rule's calibration mean loops get within the match window of {ref}'s (closest: "
                         + ", ".join(f"{r.method} {r.cal_mean_loops:.2f}" for r in m[m["reference"] == ref].itertuples())
                         + ")")
    oracle = f[f["method"] == "oracle"]
    if rows is not None and len(oracle):
        o = oracle.iloc[0]
        numbers.append(measured("oracle_accuracy", "accuracy, the oracle (first right pass)",
                                round(float(o["accuracy"]), 4), "proportion", n=int(o["n"])))
    best = f[f["chosen"] & f["method"].isin(RULES)]
    if len(best):
        b = best.loc[best["cal_accuracy"].idxmax()]
        if rows is not None:
            rep = rows[rows["split"] == "reported"]
            d = _rule_depths(rep, b)
            if d is not None:
                numbers.append(proportion("best_rule_accuracy", f"accuracy, {b['method']} at its own chosen threshold",
                                          d))
        words.append(f"at its own chosen threshold the best rule on calibration rows, {b['method']}, reads "
                     f"{b['accuracy']:.2f} after {b['mean_loops']:.2f} loops")
    sentence = ("; ".join(words) + " (thresholds chosen on calibration rows, read on the others).") if words \
        else "No exit rule result."
    return Headline("exit_rules", numbers, sentence[0].upper() + sentence[1:])


def _rule_depths(rep: pd.DataFrame, pick) -> pd.Series | None:
    """Per reported row, whether `pick`'s rule at its threshold is right (from exit_rules__rows), for a Wilson interval."""
    column = {"stable": "stable", "kl": "kl_prev", "entropy_drop": "entropy", "step": "step",
              "step_second": "step_second", "max_prob": "max_prob"}.get(pick["method"])
    if column is None or rep.empty:
        return None
    wide = rep.pivot(index="row_id", columns="loop", values=column).sort_index()
    ok = rep.pivot(index="row_id", columns="loop", values="correct").sort_index()
    t_min = int(pick["t_min"])
    d = stop_depth(wide.to_numpy(float), float(pick["threshold"]), pick["method"] in ABOVE, t_min)
    return pd.Series(ok.to_numpy()[np.arange(len(d)), d - 1].astype(float), index=ok.index)
