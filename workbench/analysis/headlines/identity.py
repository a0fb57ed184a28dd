"""The identity probe's headline: loop 1 against its own weights, the base, fresh retrofits, and the guardrail.

Read from the probe's tables alone (`workbench.probes.identity` writes them), so a results directory is read again
without the model.
"""

from __future__ import annotations

import pandas as pd

from workbench.analysis.headlines import Headline, Number, fmt, judge, measured, pair, proportion
from workbench.analysis.stats import paired_counts
from workbench.defaults import MAX_DROP_POINTS

LABELS = {
    "trained": ("loop 1 vs base, trained adapter enabled", "differs: training changed loop 1"),
    "untrained": ("loop 1 vs base, untrained retrofit (adapter B = 0)", "0.0"),
    "none": ("loop 1 vs base (no adapter)", "0.0 unless the block was trained"),
}


def headline(tables: dict[str, pd.DataFrame]) -> Headline:
    """Loop 1 against its own weights, against the base with the adapter on and off, fresh retrofits, guardrail."""
    f = tables["identity"]
    worst = {v: float(g["max_abs_diff"].max()) for v, g in f.groupby("variant", sort=False)}
    if "adapter" in f:
        adapter = f["adapter"].iloc[0]
    else:  # tables written before the adapter column: a LoRA checkpoint whose loop 1 changed was trained
        lora = bool(f["lora"].iloc[0])
        adapter = "none" if not lora else "trained" if worst.get("checkpoint_vs_base", 0.0) != 0.0 else "untrained"
    numbers, words, failed = [], [], []
    if "checkpoint_self" in worst:
        numbers.append(judge(measured("self", "loop 1 vs its own weights (plain forward)", worst["checkpoint_self"],
                                      expect="0.0"), worst["checkpoint_self"] == 0.0))
        if worst["checkpoint_self"] != 0.0:
            failed.append(f"loop 1 against its own weights is {fmt(worst['checkpoint_self'])}, not 0.0")
    if "checkpoint_vs_base" in worst:
        label, expect = LABELS.get(adapter, LABELS["none"])
        diff = worst["checkpoint_vs_base"]
        numbers.append(measured("vs_base", label, diff, expect=expect))
        if adapter == "trained":
            words.append(f"with the trained adapter enabled loop 1 differs from the base by up to {fmt(diff)} "
                         f"in logits, as training the block is expected to do")
        elif diff == 0.0:
            words.append("an untrained retrofit: loop 1 equals the untouched base exactly (0.0)"
                         if adapter == "untrained" else "loop 1 equals the untouched base exactly (0.0)")
        elif adapter == "untrained":
            failed.append(f"the untrained retrofit's loop 1 differs from the base by {fmt(diff)}")
        else:
            words.append(f"loop 1 differs from the base by up to {fmt(diff)} (no adapter: the block itself changed)")
    if "adapter_off_vs_base" in worst:
        off = worst["adapter_off_vs_base"]
        numbers.append(judge(measured("adapter_off", "loop 1 vs base, adapter disabled", off,
                                      expect="0.0: the adapter is detachable"), off == 0.0))
        if off == 0.0:
            words.append("with the adapter disabled it equals the base exactly (0.0: the adapter is detachable)")
        else:
            failed.append(f"with the adapter disabled loop 1 differs from the base by {fmt(off)}, not 0.0")
    if "fresh" in worst:
        fresh = f[f["variant"] == "fresh"]
        numbers.append(judge(measured("fresh", f"fresh retrofits at this block ({len(fresh)} designs)",
                                      worst["fresh"], expect="0.0"), worst["fresh"] == 0.0))
        if worst["fresh"] == 0.0:
            words.append(f"{len(fresh)} fresh retrofits at this block read 0.0")
        else:
            failed.append(f"a fresh retrofit reads {fmt(worst['fresh'])}, not 0.0")
    if "identity__guardrail" in tables:
        numbers += _guardrail(tables["identity__guardrail"], words)
    sentence = "; ".join(words) if words else "loop 1 was compared with its own weights only"
    if worst.get("checkpoint_self") == 0.0:
        sentence = "Loop 1 reproduces its own weights exactly (0.0); " + sentence
    if failed:
        sentence = "IDENTITY FAILS: " + "; ".join(failed) + ". " + sentence
    return Headline("identity", numbers, sentence[0].upper() + sentence[1:] + ".")


def _guardrail(g: pd.DataFrame, words: list[str]) -> list[Number]:
    g = g.set_index("row_id")
    before = proportion("guardrail_base", "guardrail at loop 1: the base", g["base_correct"],
                        expect="the embedded default: 49/64")
    after = proportion("guardrail_checkpoint", "guardrail at loop 1: checkpoint, adapter enabled",
                       g["checkpoint_correct"], expect="at most 3 points below the base")
    change = pair(before, after)
    p = change.p_mcnemar
    counts = paired_counts(g["base_correct"], g["checkpoint_correct"])
    diff = Number("guardrail_change", f"guardrail change, checkpoint − base (McNemar p = {p:.2g})", change.diff,
                  len(g), change.low, change.high, "paired bootstrap", "difference",
                  "≥ −0.03 (the paper's stop: a drop over 3 points)")
    k0, k1 = int(g["base_correct"].sum()), int(g["checkpoint_correct"].sum())
    drop = 100.0 * (k0 - k1) / len(g)
    verdict = (f": a drop of {drop:.0f} points, past the paper's {MAX_DROP_POINTS:.0f}-point stop"
               if drop > MAX_DROP_POINTS else f": within the paper's {MAX_DROP_POINTS:.0f}-point stop")
    words.append(f"the arithmetic guardrail at loop 1 reads {k1}/{len(g)} = {after.text()} on the checkpoint "
                 f"against {k0}/{len(g)} = {before.text()} on the base (change {diff.text()}; {counts.helped} rows gained, "
                 f"{counts.hurt} lost, McNemar p = {p:.2g})"
                 + verdict)
    return [before, after, diff]
