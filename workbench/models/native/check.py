"""The exactness check of a native adapter against transformers' own forward (`workbench identity --model DIR`).

The reference is an independent copy of transformers' model (loaded again from the directory, or the tiny
model rebuilt from its seed), run with transformers' own forward and the same position ids; the adapter
runs its hooked passes with no hook attached. Both read the identity prompts as one left-padded batch.
"""

from __future__ import annotations

import torch

from workbench.errors import WorkbenchError
from workbench.loop.identity import IDENTITY_PROMPTS
from workbench.loop.positions import position_ids
from workbench.models.native import OWN_FAMILIES, load_looped, native_family


def exactness(spec: str) -> dict:
    """Returns {"model", "family", "native_passes", "prompts", "per_pass", "max_abs_diff"}: max |Δlogit| of the
    adapter against transformers' forward run with its pass count set to t, for t = 1..max_loops (`per_pass`),
    and the worst of them. A family written here has no transformers forward to compare with: refused."""
    own = OWN_FAMILIES.get(native_family(spec))
    if own is not None:
        raise WorkbenchError(f"'{spec}' is a {own.model_type} model, a family the workbench writes itself (transformers "
                             "ships no model to compare with); its exactness is against the reference code's "
                             f"committed numbers (tests/fixtures/, a directory per family: {own.fixture})")
    looped, tok = load_looped(spec)
    reference, _ = load_looped(spec)              # a second, independent load: its base is transformers' model alone
    ref = reference.base
    enc = tok(list(IDENTITY_PROMPTS), return_tensors="pt", padding=True)
    ids, mask = enc["input_ids"], enc["attention_mask"]
    pos = position_ids(mask)
    count = "loop_num_passes" if looped.family == "inkling2_loop" else "H_cycles"
    native = getattr(ref.config.get_text_config(), count)
    per_pass = {}
    text_config = ref.config.get_text_config()
    with torch.no_grad():
        for t in range(1, looped.max_loops + 1):
            setattr(text_config, count, t)
            theirs = ref(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False).logits
            ours = looped(ids, attention_mask=mask, loops=t).logits
            per_pass[t] = float((ours.float() - theirs.float()).abs().max())
    setattr(text_config, count, native)
    return {"model": spec, "family": looped.family, "native_passes": native, "prompts": len(IDENTITY_PROMPTS),
            "per_pass": per_pass, "max_abs_diff": max(per_pass.values())}
