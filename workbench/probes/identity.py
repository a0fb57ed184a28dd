"""Loop-1 identity: max |Δlogit| between loop 1 of a retrofit and a plain forward of a base model.

Rows (`variant`):
    checkpoint_self     the probed model at loop 1 against a plain HF forward of its own weights
                        (trained block included): the architecture's identity route, always 0.0;
    checkpoint_vs_base  the probed model at loop 1, adapter as loaded, against the untouched base
                        (`base` given): 0.0 for an untrained retrofit, the size of the change
                        training made otherwise;
    adapter_off_vs_base the same with the LoRA adapter disabled (only when the model has one):
                        must be 0.0, the "detachable adapter" guarantee;
    fresh               `workbench.loop.identity.identity_report` on a freshly loaded base at the
                        probed model's block: every re-entry design, memory off/on, with and
                        without LoRA (expected 0.0).
`adapter` says what the block's adapter was for that row: "trained", "untrained" (B = 0),
"disabled" or "none". The prompts are the identity prompt set plus the first `n_rows` rows'
prompts; later loops run in the same call (`loops`) and must not disturb loop 1.

When loop 1 differs from the base (a trained adapter), the capability guardrail
(`workbench.tasks.guardrail`, 64 arithmetic rows at loop 1) is read on the base and on the
checkpoint, row by row.

Tables:
    identity: variant, reentry, memory, lora, adapter, max_abs_diff
    identity__guardrail: row_id, base_correct, checkpoint_correct (only when loop 1 changed)
"""

from __future__ import annotations

import pandas as pd

from workbench.analysis.headlines.identity import headline
from workbench.devices import device_of
from workbench.loop.config import Block, RetrofitConfig
from workbench.loop.identity import (
    IDENTITY_PROMPTS,
    adapter_state,
    adapters_disabled,
    base_logits,
    identity_report,
    max_abs_diff,
)
from workbench.loop.surgery import retrofit
from workbench.models import load_base
from workbench.probes.options import Count, probe_options
from workbench.probes.spec import ProbeSpec
from workbench.tasks.guardrail import guardrail_counts

COLUMNS = ["variant", "reentry", "memory", "lora", "adapter", "max_abs_diff"]


def run(model, tokenizer, rows: list[dict], base: str | None = None, loops: int = 3, n_rows: int = 4,
        lora: bool = True, fresh: bool = True, guardrail: bool = True,
        batch_size: int = 16) -> dict[str, pd.DataFrame]:
    """Returns {"identity": the identity table, "identity__guardrail": per guardrail row} (see the module docstring).

    Args:
        base: the base model spec (`workbench.models.load_base`) for the vs-base and fresh rows;
            the battery passes the checkpoint's own.
        loops: loops run in the same call as loop 1.
        n_rows: row prompts added to the identity prompt set.
        lora: include the fresh LoRA variants.
        fresh: include the fresh-retrofit variants (needs `base`).
        guardrail: read the arithmetic guardrail on base and checkpoint when loop 1 changed.
        batch_size: guardrail batch size.
    """
    prompts = list(IDENTITY_PROMPTS) + [r["prompt"] for r in rows[:n_rows]]
    device = device_of(model)
    enc = tokenizer(prompts, return_tensors="pt", padding=True).to(device)
    ids, mask = enc["input_ids"], enc["attention_mask"]
    config = model.retrofit_config
    adapter = adapter_state(model)
    own = dict(reentry=config.reentry, memory=config.memory, lora=config.lora is not None)
    records = [dict(variant="checkpoint_self", **own, adapter=adapter,
                    max_abs_diff=max_abs_diff(model, ids, mask, base_logits(model.base, ids, mask), loops))]
    out = {}
    if base is not None:
        reference_model, _ = load_base(base, dtype=next(model.parameters()).dtype,
                                       attn_implementation=model.config._attn_implementation)
        reference_model.to(device)
        reference = base_logits(reference_model, ids, mask)
        records.append(dict(variant="checkpoint_vs_base", **own, adapter=adapter,
                            max_abs_diff=max_abs_diff(model, ids, mask, reference, loops)))
        if adapter != "none":
            with adapters_disabled(model):
                records.append(dict(variant="adapter_off_vs_base", **own, adapter="disabled",
                                    max_abs_diff=max_abs_diff(model, ids, mask, reference, loops)))
        if guardrail and records[1]["max_abs_diff"] != 0.0:
            out["identity__guardrail"] = guardrail_table(model, reference_model, tokenizer, batch_size)
        if fresh:
            records += [dict(variant="fresh", **r, adapter="untrained" if r["lora"] else "none")
                        for r in identity_report(reference_model, tokenizer, Block(model.a, model.b), loops=loops,
                                                 prompts=prompts, lora=lora)]
    out["identity"] = pd.DataFrame.from_records(records, columns=COLUMNS)
    return {"identity": out["identity"], **{k: v for k, v in out.items() if k != "identity"}}


def guardrail_table(model, reference_model, tokenizer, batch_size: int = 16) -> pd.DataFrame:
    """The guardrail read at loop 1 on the untouched base (a fresh retrofit of it) and on `model`, per row."""
    fresh = retrofit(reference_model, RetrofitConfig(Block(model.a, model.b), max_loops=1)).eval()
    on_base = guardrail_counts(fresh, tokenizer, batch_size=batch_size)
    on_model = guardrail_counts(model, tokenizer, batch_size=batch_size)
    return pd.DataFrame({"row_id": list(on_base.per_row), "base_correct": list(on_base.per_row.values()),
                         "checkpoint_correct": [on_model.per_row[r] for r in on_base.per_row]})


def summarize(tables: dict[str, pd.DataFrame]) -> dict:
    """Headline numbers: the worst |Δlogit| per variant, the guardrail counts, and the headline."""
    f = tables["identity"]
    out = {v: float(g["max_abs_diff"].max()) for v, g in f.groupby("variant", sort=False)}
    if "identity__guardrail" in tables:
        g = tables["identity__guardrail"]
        out["guardrail"] = {"base": int(g["base_correct"].sum()), "checkpoint": int(g["checkpoint_correct"].sum()),
                            "total": len(g)}
    return {**out, "headline": headline(tables).to_dict()}


@probe_options
class Options:
    """The identity probe's options (`run`'s keywords), checked before any probe of a battery runs."""

    base: str | None = None
    loops: int = 3
    n_rows: Count = 4
    lora: bool = True
    fresh: bool = True
    guardrail: bool = True
    batch_size: Count = 16


SPEC = ProbeSpec(
    name="identity", parts=("guardrail",), run=run, summarize=summarize,
    needs=("prompt",),
    requires=("base_identity",),
    options=Options,
)
