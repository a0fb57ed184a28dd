"""Loop-1 identity: max |Δlogit| between loop 1 of a retrofit and a plain forward of a base model.

Rows (`variant`):
    checkpoint_self     the probed model at loop 1 against a plain HF forward of its own weights
                        (trained block included): the architecture's identity route, always 0.0;
    checkpoint_vs_base  the probed model at loop 1 against the untouched base (`base` given): 0.0
                        for an untrained retrofit, the size of the change training made otherwise;
    fresh               `workbench.identity.identity_report` on a freshly loaded base at the
                        probed model's block: every re-entry design, memory off/on, with and
                        without LoRA (expected 0.0).
The prompts are the identity prompt set plus the first `n_rows` rows' prompts; later loops
run in the same call (`loops`) and must not disturb loop 1.

Table:
    identity: variant, reentry, memory, lora, max_abs_diff
"""

from __future__ import annotations

import pandas as pd

from workbench.identity import IDENTITY_PROMPTS, base_logits, identity_report, max_abs_diff
from workbench.probes.common import device_of


def run(model, tokenizer, rows: list[dict], base: str | None = None, loops: int = 3, n_rows: int = 4,
        lora: bool = True, fresh: bool = True) -> pd.DataFrame:
    """Returns the identity table (see the module docstring).

    Args:
        base: the base model spec (`workbench.models.load_base`) for the vs-base and fresh rows;
            the battery passes the checkpoint's own.
        loops: loops run in the same call as loop 1.
        n_rows: row prompts added to the identity prompt set.
        lora: include the fresh LoRA variants.
        fresh: include the fresh-retrofit variants (needs `base`).
    """
    prompts = list(IDENTITY_PROMPTS) + [r["prompt"] for r in rows[:n_rows]]
    device = device_of(model)
    enc = tokenizer(prompts, return_tensors="pt", padding=True).to(device)
    ids, mask = enc["input_ids"], enc["attention_mask"]
    settings = getattr(model, "settings", {})
    own = dict(reentry=settings.get("reentry"), memory=bool(settings.get("memory")), lora="lora" in settings)
    records = [dict(variant="checkpoint_self", **own,
                    max_abs_diff=max_abs_diff(model, ids, mask, base_logits(model.base, ids, mask), loops))]
    if base is not None:
        from workbench.models import load_base

        reference_model, _ = load_base(base, dtype=next(model.parameters()).dtype,
                                       attn_implementation=model.config._attn_implementation)
        reference_model.to(device)
        reference = base_logits(reference_model, ids, mask)
        records.append(dict(variant="checkpoint_vs_base", **own,
                            max_abs_diff=max_abs_diff(model, ids, mask, reference, loops)))
        if fresh:
            records += [dict(variant="fresh", **r) for r in identity_report(
                reference_model, tokenizer, (model.a, model.b), loops=loops, prompts=prompts, lora=lora)]
    return pd.DataFrame.from_records(records, columns=["variant", "reentry", "memory", "lora", "max_abs_diff"])


def summarize(tables: dict[str, pd.DataFrame]) -> dict:
    """Headline numbers: the worst |Δlogit| per variant."""
    f = tables["identity"]
    return {v: float(g["max_abs_diff"].max()) for v, g in f.groupby("variant")}
