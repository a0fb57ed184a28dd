"""Surgery: valid splits, re-entry and memory at their paper initialisations, parameter accounting,
the RetrofitConfig a model declares and is rebuilt from."""

import json
import math
from pathlib import Path

import pytest
import torch

from tests.conftest import perturb
from workbench.errors import WorkbenchError
from workbench.loop.config import Block, LoraSettings, RetrofitConfig
from workbench.loop.halting import HaltingHead, halt_depth, oracle_labels
from workbench.loop.memory import alibi_slopes
from workbench.loop.reentry import AdditiveInjection, SplitBridge
from workbench.loop.surgery import attach_lora, parameter_report, retrofit

KEEPER = Path(__file__).resolve().parents[1] / "training" / "keepers" / "smollm2-chase"


@pytest.mark.parametrize("block", [(-1, 3), (3, 3), (4, 2), (0, 7), (2, 9)])
def test_invalid_blocks_are_errors(tiny, block):
    with pytest.raises(WorkbenchError, match=rf"block {block[0]}:{block[1]} is invalid .* need 0 <= a < b <= 6"):
        retrofit(tiny[0], RetrofitConfig(Block(*block)))


@pytest.mark.parametrize("text", ["x:3", "5", "1-3", "2:", ":4", "1:2:3"])
def test_a_block_is_read_from_a_string_only_by_parse(text):
    with pytest.raises(WorkbenchError, match=f"block '{text}' is not of the form A:B"):
        Block.parse(text)
    with pytest.raises(WorkbenchError, match="give a Block"):   # the string is read at the edges, not by the config
        RetrofitConfig(block="2:4")


def test_retrofit_takes_one_call_shape(tiny):
    with pytest.raises(WorkbenchError, match="not a RetrofitConfig"):
        retrofit(tiny[0], Block(1, 3))
    with pytest.raises(TypeError):
        retrofit(tiny[0], RetrofitConfig(Block(1, 3)), memory=True)


def test_block_edges_are_valid(tiny):
    assert retrofit(tiny[0], RetrofitConfig(Block(0, 6))).n_layers == 6
    assert Block.parse("10:16") == Block(10, 16) == (10, 16) and str(Block(10, 16)) == "10:16"


def test_the_model_declares_its_retrofit_config(tiny):
    config = RetrofitConfig(block=Block.parse("1:4"), reentry="inject", memory=True, max_loops=5, halting=True)
    looped = retrofit(tiny[0], config)
    assert looped.retrofit_config == config and config.block == (1, 4)
    assert (looped.a, looped.b, looped.max_loops, looped.memory_window) == (1, 4, 5, 3)
    assert looped.memory is not None and looped.halting is not None
    attach_lora(looped, r=4, alpha=8)
    assert looped.retrofit_config == RetrofitConfig(**{**config.__dict__, "lora": LoraSettings(r=4, alpha=8)})


def test_retrofit_config_round_trips_through_json(tiny):
    config = RetrofitConfig(block=Block(2, 5), memory=True, lora=LoraSettings(r=4, targets=["q_proj", "v_proj"]))
    d = json.loads(json.dumps(config.to_dict()))
    assert d["block"] == [2, 5] and d["lora"] == {"r": 4, "alpha": 32, "dropout": 0.0, "targets": ["q_proj", "v_proj"]}
    assert RetrofitConfig.from_dict(d) == config
    assert "lora" not in RetrofitConfig(block=Block(2, 5)).to_dict()
    rebuilt = retrofit(tiny[0], RetrofitConfig.from_dict(d))
    assert rebuilt.retrofit_config == config and rebuilt.retrofit_config.to_dict() == d
    assert sum("lora_" in n for n, _ in rebuilt.named_parameters()) == 2 * 2 * 3  # A, B x 2 targets x 3 layers


def test_the_keepers_recorded_settings_are_a_retrofit_config():
    settings = json.loads((KEEPER / "retrofit.json").read_text())["settings"]
    config = RetrofitConfig.from_dict(settings)
    assert config.block == (12, 24) and config.lora is not None and config.lora.r == 16
    assert config.to_dict() == settings


@pytest.mark.parametrize("bad, message", [
    ({"block": [1, 3], "loops": 4}, "unknown key 'loops'; accepted: block, reentry, memory, max_loops"),
    ({"reentry": "bridge"}, "no 'block'"),
    ({"block": [1, 3], "lora": {"r": 4, "rank": 4}}, "unknown lora key 'rank'; accepted: r, alpha, dropout, targets"),
    ({"block": [1, 3], "max_loops": 0}, r"max_loops=0 must be an integer in 1\.\.64"),
    ({"block": "1-3"}, r"block '1-3' is not a pair of layer indices \[a, b\]"),
    ({"block": [1, 3.0]}, "not a pair of layer indices"),
])
def test_retrofit_config_errors_name_what_is_accepted(bad, message):
    with pytest.raises(WorkbenchError, match=message):
        RetrofitConfig.from_dict(bad)


def test_unknown_reentry_is_an_error(tiny):
    with pytest.raises(WorkbenchError, match="bridge, inject"):
        retrofit(tiny[0], RetrofitConfig(Block(1, 3), reentry="concat"))


def test_split_bridge_is_an_identity_that_carries_gradient():
    bridge = SplitBridge(16)
    p, h = torch.randn(2, 5, 16), torch.randn(2, 5, 16)
    out = bridge(p, h)
    assert torch.equal(out, h) or (out - h).abs().max() < 1e-6
    out.pow(2).sum().backward()
    assert bridge.prelude_proj.weight.grad.abs().max() > 0  # W_p learns from step 0
    assert bridge.state_proj.weight.grad.abs().max() > 0
    assert bridge.gate.grad.abs().item() < 1e-5  # translated == h at init: structurally ~zero


def test_additive_injection_alpha_is_live():
    inj = AdditiveInjection(16)
    p, h = torch.randn(2, 5, 16), torch.randn(2, 5, 16)
    out = inj(p, h)
    assert torch.equal(out, h)
    out.sum().backward()
    assert inj.alpha.grad.abs() > 0


def test_loop_codes_leave_loop_1_exact_start_as_no_codes_and_are_live(tiny, batch):
    """LoopCodes: loop 1 never sees a code; zero codes change no loop; each code run takes gradient at once."""
    base, _ = tiny
    ids, mask = batch["input_ids"], batch["attention_mask"]
    plain = retrofit(base, RetrofitConfig(Block(1, 3), max_loops=4))
    coded = retrofit(base, RetrofitConfig(Block(1, 3), max_loops=4, loop_codes=True))
    perturb(plain.reentry)                                       # loops 2+ differ from loop 1
    coded.reentry.load_state_dict(plain.reentry.state_dict())
    assert coded.loop_codes.codes.shape == (3, 64) and not coded.loop_codes.codes.any()
    for t in (1, 2, 3):                                          # zero codes: the retrofit unchanged at every loop
        assert torch.equal(coded(ids, mask, loops=t).logits, plain(ids, mask, loops=t).logits)
    coded.loop_codes.codes.requires_grad_(True)
    out = coded(ids, mask, loops=3).logits
    out[:, -1].logsumexp(-1).sum().backward()
    grad = coded.loop_codes.codes.grad.abs().sum(-1)
    assert grad[0] > 0 and grad[1] > 0 and grad[2] == 0          # loops 2 and 3 ran, loop 4 did not
    with torch.no_grad():
        coded.loop_codes.codes.normal_()
        # loop 1 is the plain retrofit's (the base: test_identity) whatever the codes learn
        assert torch.equal(coded(ids, mask, loops=1).logits, plain(ids, mask, loops=1).logits)
        assert not torch.equal(coded(ids, mask, loops=2).logits, plain(ids, mask, loops=2).logits)
    assert parameter_report(coded)["added"]["loop_codes"] == 3 * 64
    assert "loop_codes" not in parameter_report(plain)["added"]
    assert RetrofitConfig.from_dict(coded.retrofit_config.to_dict()) == coded.retrofit_config
    assert "loop_codes" not in plain.retrofit_config.to_dict()   # committed records without codes are unchanged


def test_memory_initialisation_matches_recurtrace(tiny):
    looped = retrofit(tiny[0], RetrofitConfig(Block(1, 4), reentry="inject", memory=True))
    mem = looped.memory["2"]
    assert mem.n_heads == 4 and mem.head_dim * 4 == 32  # width d/2 for d = 64
    assert torch.allclose(mem.slopes, alibi_slopes(4)) and mem.slopes.tolist()[0] == 0.25
    assert mem.gamma.item() == 1.0
    q = torch.randn(1, 3, 64)
    gate = torch.sigmoid(mem.gate_mlp(torch.cat([q, q], dim=-1)))
    assert torch.allclose(gate, torch.full_like(gate, 1 / (1 + math.exp(3))))  # ~0.047


def test_parameter_report_counts(tiny):
    base, _ = tiny
    n_base = sum(p.numel() for p in base.parameters())  # tied embedding counted once
    looped = retrofit(base, RetrofitConfig(Block(1, 4), reentry="bridge"))
    rep = parameter_report(looped)
    d = 64
    bridge = 2 * d + d * d + (d * d + d) + 1  # LayerNorm, W_p, W_s with bias, gate (Sec. 3.5)
    assert rep["added"]["reentry"] == bridge
    assert rep["total"] == n_base + bridge
    block = sum(p.numel() for i in range(1, 4) for p in base.model.layers[i].parameters())
    assert rep["trainable"]["block"] == block
    attach_lora(looped, r=4)
    rep = parameter_report(looped)
    assert rep["trainable"]["block"] == 0 and rep["trainable"]["base"] == 0
    assert rep["trainable"]["lora"] == rep["added"]["lora"] > 0
    assert rep["trainable"]["reentry"] == bridge


@pytest.mark.parametrize("pooling", ["mean", "last"])
def test_halting_pools_over_real_tokens_only(pooling):
    """Padding, on either side, must not move the pooled state: mean over real tokens, or the last real one."""
    head = HaltingHead(8, pooling)
    h = torch.randn(3, 5, 8)
    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1], [1, 1, 1, 0, 0]])
    pooled = head.pool(h, mask)
    real = [h[0], h[1, 2:], h[2, :3]]
    expected = torch.stack([r.mean(0) if pooling == "mean" else r[-1] for r in real])
    assert torch.allclose(pooled, expected, atol=1e-6)
    assert not torch.allclose(pooled[2], head.pool(h[2:], None)[0])  # counting the pads would differ


def test_oracle_labels_and_halt_depth():
    losses = torch.tensor([[2.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0], [3.0, 2.995, 1.0, 0.5]])
    labels = oracle_labels(losses, margin=0.01)
    assert labels.tolist() == [[1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 0]]
    probs = torch.tensor([[0.9, 0.2, 0.1], [0.9, 0.9, 0.9], [0.1, 0.9, 0.1]])
    assert halt_depth(probs, 0.5).tolist() == [2, 3, 1]
    assert halt_depth(probs, 0.5, t_min=2).tolist() == [2, 3, 3]


def test_memory_entries_computed_once_equal_the_stacked_window(tiny):
    """LoopedLM keeps each loop's keys and values in the window (`keys_values` once per write); reading them back
    through `attend` gives the update that `forward` computes from the stacked raw outputs."""
    looped = retrofit(tiny[0], RetrofitConfig(Block(1, 4), reentry="inject", memory=True))
    mem = looped.memory["2"]
    torch.manual_seed(0)
    with torch.no_grad():
        for p in mem.parameters():
            p.add_(0.1 * torch.randn_like(p))  # away from the init, so the gate and slopes matter
    outs = [torch.randn(2, 5, 64) for _ in range(3)]
    dist = torch.tensor([3, 2, 1])
    whole = mem(outs[-1], torch.stack(outs, dim=2), dist)
    entries = [mem.keys_values(x) for x in outs]
    keys, values = (torch.stack(x, dim=2) for x in zip(*entries))
    cached = mem.attend(outs[-1], keys, values, torch.stack(outs, dim=2).mean(dim=2), dist)
    torch.testing.assert_close(cached, whole, rtol=1e-5, atol=1e-6)
    assert whole.abs().max() > 1e-3  # not a trivially zero update
