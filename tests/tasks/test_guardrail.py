"""Capability guardrail: a frozen 64-row battery, scored at loop 1, with a paired test and a hard stop."""

import re

import pytest

from tests.executors import ReadoutExecutor
from workbench.analysis.stats import mcnemar
from workbench.errors import WorkbenchError
from workbench.tasks.guardrail import (
    GuardrailCounts,
    guardrail_compare,
    guardrail_counts,
    guardrail_rows,
    passes,
)
from workbench.tasks.manifest import rows_sha256
from workbench.tasks.reader import candidate_ids

# Pinned: editing the battery is a new version, never a silent change.
BATTERY_SHA256 = "5bd972946503c9f8ba3e82b23114ba003a4cb62df4bfe46390abfa861da6a61a"


def last_problem(text: str) -> int:
    a, op, b = re.search(r"(\d) ([+-]) (\d) = $", text).groups()
    return int(a) + int(b) if op == "+" else int(a) - int(b)


class Arithmetic(ReadoutExecutor):
    """Answers the battery's last problem, except on `wrong` (by problem text), where it answers 0 or 1."""

    def __init__(self, tokenizer, wrong=()):
        self.loops_seen = []

        def answer(text, t):
            r = last_problem(text)
            return str(int(r == 0)) if text.splitlines()[-1] in wrong else str(r)
        super().__init__(tokenizer, answer, parse=lambda text: text)

    def read(self, input_ids, attention_mask=None, loops=1, **kw):
        self.loops_seen.append(loops)
        return super().read(input_ids, attention_mask, loops, **kw)


def test_battery_is_64_fixed_rows_with_correct_single_digit_answers(tok):
    rows = guardrail_rows()
    assert len(rows) == 64 and rows == guardrail_rows()
    assert rows_sha256(rows) == BATTERY_SHA256
    assert len({r["prompt"] for r in rows}) == 64 and len({r["row_id"] for r in rows}) == 64
    assert sum("+" in r["start"] for r in rows) == 32
    for row in rows:
        assert str(last_problem(row["prompt"])) == row["answer"] == row["chain"][0]
        assert row["prompt"].count(row["start"] + " =") == 1, "a row must not repeat a worked example"
    candidate_ids(tok, rows[0]["symbols"], prefix="")  # every digit is one SmolLM2 token
    assert tok.encode("= 7", add_special_tokens=False)[-1] == candidate_ids(tok, ["7"], prefix="")[0]


def test_counts_go_through_the_reader_at_loop_1(tok):
    model = Arithmetic(tok)
    counts = guardrail_counts(model, tok)
    assert (counts.correct, counts.total) == (64, 64) and all(counts.per_row.values())
    assert set(model.loops_seen) == {1}
    wrong = [r["prompt"].splitlines()[-1] for r in guardrail_rows()[:5]]
    damaged = guardrail_counts(Arithmetic(tok, wrong), tok)
    assert damaged.correct == 59 and sum(not ok for ok in damaged.per_row.values()) == 5


def _counts(correct_flags, digest="x"):
    per_row = {f"r{i}": bool(c) for i, c in enumerate(correct_flags)}
    return GuardrailCounts(sum(per_row.values()), len(per_row), per_row, digest)


def test_compare_counts_helped_hurt_and_the_exact_paired_p():
    before = _counts([1] * 60 + [0] * 4)
    after = _counts([1] * 57 + [0] * 3 + [1] * 1 + [0] * 3)  # 3 rows lost, 1 gained: 58/64
    cmp = guardrail_compare(before, after)
    assert (cmp.before, cmp.after, cmp.total, cmp.helped, cmp.hurt) == (60, 58, 64, 1, 3)
    assert cmp.p_value == mcnemar(1, 3) == pytest.approx(0.625)
    assert cmp.drop_points == pytest.approx(3.125)


def test_hard_stop_matches_the_paper():
    # 60/64 -> 58/64 stopped the fresh arm (one row beyond the 3-point boundary); 59/64 passed.
    before = _counts([1] * 60 + [0] * 4)
    assert not passes(before, _counts([1] * 58 + [0] * 6))
    assert passes(before, _counts([1] * 59 + [0] * 5))
    assert passes(before, _counts([1] * 61 + [0] * 3))
    assert guardrail_compare(before, _counts([1] * 58 + [0] * 6)).p_value == pytest.approx(0.5)
    assert passes(before, _counts([1] * 58 + [0] * 6), max_drop=5.0)


def test_compare_refuses_different_batteries():
    with pytest.raises(WorkbenchError, match="different batteries"):
        guardrail_compare(_counts([1, 0]), _counts([1, 0], digest="y"))


# ----------------------------------------------------------------------------- the reading cache
def test_a_reading_is_read_back_only_for_the_same_computation(tiny, tmp_path, monkeypatch):
    """A kept reading is planted to say 64/64: the same computation reads it back; a changed tensor, batch size,
    adapter switch, configuration or tokenizer is a new key, and a hooked or training model, one of several ranks or
    a switched-off cache is never keyed, so each of those reads the model again (the tiny model's own count, not the
    planted 64)."""
    import json

    import torch

    from workbench.loop.config import Block, LoraSettings, RetrofitConfig
    from workbench.loop.identity import adapters_disabled
    from workbench.loop.surgery import retrofit
    from workbench.tasks import reading_cache

    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path))
    base, tok = tiny
    looped = retrofit(base, RetrofitConfig(Block(2, 4), max_loops=2, lora=LoraSettings(r=2, alpha=4))).eval()
    first = guardrail_counts(looped, tok)
    assert first.correct < 64
    kept = list((tmp_path / "readings" / "guardrail").glob("*.json"))
    assert len(kept) == 1 and json.loads(kept[0].read_text()) == {"per_row": first.per_row}
    kept[0].write_text(json.dumps({"per_row": {row: True for row in first.per_row}}))
    assert guardrail_counts(looped, tok).correct == 64                      # read back, not computed

    def computed(**kw) -> bool:
        return guardrail_counts(looped, tok, **kw).correct != 64

    assert computed(batch_size=7)
    with adapters_disabled(looped):
        assert computed()
    rows = guardrail_rows()

    class OtherWords:   # a tokenizer whose ids differ
        def encode(self, text):
            return [i + 1 for i in tok.encode(text)]

    assert reading_cache.reading_key(looped, OtherWords(), rows) != reading_cache.reading_key(looped, tok, rows)
    key = reading_cache.reading_key(looped, tok, rows)
    with monkeypatch.context() as config:   # the same tensors under another configuration compute something else
        config.setattr(looped.config, "rms_norm_eps", looped.config.rms_norm_eps * 2)
        assert reading_cache.reading_key(looped, tok, rows) != key
    with monkeypatch.context() as config:
        config.setattr(looped.config, "_name_or_path", "/elsewhere")   # the same model read from another folder
        assert reading_cache.reading_key(looped, tok, rows) == key
    hook = looped.base.model.norm.register_forward_hook(lambda mod, args, out: out)
    try:
        assert reading_cache.reading_key(looped, tok, rows) is None and computed()
    finally:
        hook.remove()
    looped.train()
    assert reading_cache.reading_key(looped, tok, rows) is None and computed()
    looped.eval()
    monkeypatch.setenv("WORKBENCH_READING_CACHE", "0")
    assert reading_cache.reading_key(looped, tok, rows) is None and computed()
    monkeypatch.delenv("WORKBENCH_READING_CACHE")
    with monkeypatch.context() as ranks:   # one of two ranks: a sharded read is collective, so every rank computes
        ranks.setattr(torch.distributed, "is_initialized", lambda: True)
        ranks.setattr(torch.distributed, "get_world_size", lambda *group: 2)
        assert reading_cache.reading_key(looped, tok, rows) is None and computed()
    with torch.no_grad():
        next(looped.parameters()).add_(1e-3)
    assert computed()
    assert len(list((tmp_path / "readings" / "guardrail").glob("*.json"))) == 4   # the first, batch 7, LoRA off, +1e-3
