"""The one-pass forced read: every loop read in one forward, equal to separate runs."""

import pytest
import torch

from tests.conftest import perturb
from workbench.errors import WorkbenchError
from workbench.loop.config import Block, RetrofitConfig
from workbench.loop.surgery import retrofit


@pytest.mark.parametrize("design,memory", [("bridge", False), ("inject", True)])
def test_one_pass_equals_separate_runs_at_each_depth(tiny, batch, design, memory):
    looped = retrofit(tiny[0], RetrofitConfig(Block(1, 4), reentry=design, memory=memory))
    perturb(looped.reentry)
    if memory:
        perturb(looped.memory)
    ids, mask = batch.input_ids, batch.attention_mask
    cand = torch.tensor([11, 503, 3000, 42000])
    one = looped.read(ids, mask, loops=5, candidates=cand, return_states=True)
    assert one.scores.shape == (3, 5, 1, 4) and one.states.shape == (3, 5, 1, 64)
    for t in range(1, 6):
        alone = looped.read(ids, mask, loops=t, candidates=cand, return_states=True)
        assert torch.equal(one.scores[:, t - 1], alone.scores[:, -1])  # exact: later loops leak nothing back
        assert torch.equal(one.states[:, t - 1], alone.states[:, -1])
        # and the same numbers as the full forward's logits at that depth (different matmul shapes)
        logits = looped(ids, mask, loops=t).logits[:, -1, cand]
        assert torch.allclose(one.scores[:, t - 1, 0], logits, atol=1e-5, rtol=0)
    assert not torch.allclose(one.scores[:, 0], one.scores[:, 1])  # the loops do differ


def test_default_position_is_last_real_token(tiny):
    base, tok = tiny
    looped = retrofit(base, RetrofitConfig(Block(1, 4)))
    left = tok(["a b c", "a"], return_tensors="pt", padding=True)
    assert looped.read(left.input_ids, left.attention_mask).positions.squeeze(-1).tolist() == [2, 2]
    tok.padding_side = "right"
    right = tok(["a b c", "a"], return_tensors="pt", padding=True)
    assert looped.read(right.input_ids, right.attention_mask).positions.squeeze(-1).tolist() == [2, 0]


def test_per_row_candidates_and_positions(tiny, batch):
    looped = retrofit(tiny[0], RetrofitConfig(Block(1, 4)))
    ids, mask = batch.input_ids, batch.attention_mask
    full = looped.read(ids, mask, loops=2, positions=torch.tensor([[5, 9]] * 3))
    per_row = torch.tensor([[1, 2], [3, 4], [5, 6]])
    some = looped.read(ids, mask, loops=2, positions=torch.tensor([[5, 9]] * 3), candidates=per_row)
    assert some.scores.shape == (3, 2, 2, 2)
    expected = torch.stack([full.scores[i][..., per_row[i]] for i in range(3)])
    assert torch.allclose(some.scores, expected, atol=1e-5)


def test_readout_memory_grows_with_candidates_not_vocab(tiny, batch):
    looped = retrofit(tiny[0], RetrofitConfig(Block(1, 4)))
    ids, mask = batch.input_ids, batch.attention_mask
    small = looped.read(ids, mask, loops=4, candidates=torch.arange(8))
    vocab = looped.read(ids, mask, loops=4)
    assert small.scores.numel() == 3 * 4 * 1 * 8
    assert vocab.scores.numel() == 3 * 4 * 1 * looped.base.lm_head.weight.shape[0]
    two = looped.read(ids, mask, loops=4, candidates=torch.arange(8), positions=torch.tensor([[1, 2]] * 3))
    assert two.scores.numel() == 2 * small.scores.numel()


@pytest.mark.parametrize("loops", [0, 17, -1, 2.5])
def test_loops_out_of_range_is_an_error(tiny, batch, loops):
    looped = retrofit(tiny[0], RetrofitConfig(Block(1, 4), max_loops=16))
    with pytest.raises(WorkbenchError, match="outside 1..16"):
        looped.read(batch.input_ids, batch.attention_mask, loops=loops)


def test_bad_positions_and_candidates(tiny, batch):
    looped = retrofit(tiny[0], RetrofitConfig(Block(1, 4)))
    with pytest.raises(WorkbenchError, match="positions"):
        looped.read(batch.input_ids, batch.attention_mask, positions=torch.tensor([[999]] * 3))
    with pytest.raises(WorkbenchError, match="candidate"):
        looped.read(batch.input_ids, batch.attention_mask, candidates=torch.tensor([10**7]))


def test_forward_rejects_unknown_keywords(tiny, batch):
    looped = retrofit(tiny[0], RetrofitConfig(Block(1, 4)))
    with pytest.raises(TypeError):
        looped(batch.input_ids, batch.attention_mask, loops=2, max_loop=3)
