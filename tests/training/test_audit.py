"""The gradient-path audit: per-loop gradient RMS by parameter group, and a finite-difference check."""

from __future__ import annotations

import pytest

from workbench.loop.config import Block, RetrofitConfig
from workbench.loop.surgery import retrofit
from workbench.tasks.chase import chase_row
from workbench.train.audit import gradient_audit


@pytest.fixture
def audit(tiny):
    model, tok = tiny
    looped = retrofit(model, RetrofitConfig(Block(2, 4)))
    for p in looped.parameters():
        p.requires_grad_(False)
    for p in [*looped.reentry.parameters(), *looped.layers[2].parameters()]:
        p.requires_grad_(True)
    rows = [chase_row(4, d, i, 5, tokenizer=tok, split="train") for i, d in enumerate([1, 2, 3, 3])]
    flags = [p.requires_grad for p in looped.parameters()]
    df = gradient_audit(looped, rows, tokenizer=tok)
    assert flags == [p.requires_grad for p in looped.parameters()]  # the audit leaves the model as it was
    return df


def value(df, loop, group, metric="grad_rms"):
    sel = df[(df.check == "loop_grad") & (df.loop == loop) & (df.group == group) & (df.metric == metric)]
    assert len(sel) == 1
    return float(sel.value.iloc[0])


def test_per_loop_gradients_reach_the_paths_the_recurrence_uses(audit):
    assert set(audit.group[audit.check == "loop_grad"]) == {
        "reentry.prelude_norm", "reentry.prelude_proj", "reentry.state_proj", "reentry.gate", "block", "coda"}
    assert sorted(set(audit.loop[audit.check == "loop_grad"])) == [1, 2, 3]
    for t in (1, 2, 3):
        assert value(audit, t, "block") > 0 and value(audit, t, "coda") > 0
    # loop 1 is the identity route: nothing of the re-entry is on its path
    assert value(audit, 1, "reentry.prelude_proj") == 0.0
    assert value(audit, 1, "reentry.prelude_proj", "zero_fraction") == 1
    for t in (2, 3):  # later loops reach W_p and W_s; the gate's gradient is structurally 0 at init
        assert value(audit, t, "reentry.prelude_proj") > 0 and value(audit, t, "reentry.state_proj") > 0
        assert value(audit, t, "reentry.prelude_proj", "zero_fraction") < 0.01
        assert value(audit, t, "reentry.gate") == 0.0


def test_finite_difference_agrees_with_autograd(audit):
    fd = audit[audit.check == "finite_difference"].set_index("metric").value
    assert abs(fd["autograd"]) > 1e-6
    # The floor is the base's eager attention, which takes its softmax in fp32 even in an fp64 copy
    # (~1e-4 here); a broken path disagrees at order 1.
    assert fd["rel_error"] < 1e-3
    assert fd["finite_difference"] == pytest.approx(fd["autograd"], rel=1e-3)
