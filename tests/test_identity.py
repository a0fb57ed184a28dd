"""Loop 1 reproduces the untouched base model exactly (max |Δlogit| = 0.0 in fp32)."""

import pytest
import torch

from tests.conftest import PROMPTS, TINY
from workbench.loop.config import Block, RetrofitConfig
from workbench.loop.identity import base_logits, identity_report, max_abs_diff
from workbench.loop.surgery import attach_lora, retrofit
from workbench.models import load_base


@pytest.mark.parametrize("spec", TINY)
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_loop1_identity_every_design(spec, attn):
    base, tok = load_base(spec, attn_implementation=attn)
    rows = identity_report(base, tok, Block(1, 4), loops=3)
    assert len(rows) == 8  # 2 designs x memory on/off x LoRA on/off
    assert {(r["reentry"], r["memory"], r["lora"]) for r in rows} == {
        (d, m, lora) for d in ("bridge", "inject") for m in (False, True) for lora in (False, True)
    }
    assert all(r["max_abs_diff"] == 0.0 for r in rows), rows


def test_identity_detects_a_changed_block(tiny):
    """The check can fail: a non-zero LoRA B on the block breaks identity."""
    base, tok = tiny
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    ref = base_logits(base, enc.input_ids, enc.attention_mask)
    looped = attach_lora(retrofit(base, RetrofitConfig(Block(1, 4))), init_lora_weights=False)
    for name, p in base.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.5)
    assert max_abs_diff(looped, enc.input_ids, enc.attention_mask, ref, loops=1) > 1e-3


def test_left_padded_batch_matches_unpadded_rows(tiny, batch):
    base, tok = tiny
    looped = retrofit(base, RetrofitConfig(Block(2, 5), reentry="bridge"))
    with torch.no_grad():
        padded = looped(batch.input_ids, batch.attention_mask, loops=1).logits
        for i, prompt in enumerate(PROMPTS):
            single = tok(prompt, return_tensors="pt")
            alone = base(**single).logits[0]
            n = single.input_ids.shape[1]
            row = padded[i, -n:]
            # Same row, different batch shapes: BLAS blocking may differ in the last bits.
            assert torch.allclose(row, alone, atol=1e-4, rtol=0), (row - alone).abs().max()


def test_shares_base_weights_not_copies(tiny):
    base, _ = tiny
    looped = retrofit(base, RetrofitConfig(Block(1, 4)))
    assert looped.base is base
    assert looped.layers[2].mlp.up_proj.weight.data_ptr() == base.model.layers[2].mlp.up_proj.weight.data_ptr()
    base_ptrs = {p.data_ptr() for p in base.parameters()}
    added = [p for n, p in looped.named_parameters() if not n.startswith("base.")]
    assert added and not any(p.data_ptr() in base_ptrs for p in added)


# The embedded SmolLM2-135M at block 10:16, eager, all 8 fresh retrofits 0.0 at loop 1: the README's own identity
# line, run as written in tests/test_readme.py::test_the_quick_cli_lines_run_as_written, reads each of its 8 rows.


@pytest.mark.slow
def test_smollm2_identity_sdpa():
    base, tok = load_base("smollm2-135m-instruct", attn_implementation="sdpa")
    rows = identity_report(base, tok, Block(10, 16), loops=2, lora=False)
    assert [r["max_abs_diff"] for r in rows] == [0.0] * 4
