"""The trainer's parts, each called on its own without a TOML file: the step table, the guardrail, the gradient sum
over ranks, the parent check, the checkpoint restore, the movement measured at the optimizer step, and the state a
Trainer declares before setup."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from tests.training.conftest import TINY_RECIPE
from workbench import runs
from workbench.errors import WorkbenchError
from workbench.loop.config import Block, RetrofitConfig
from workbench.tasks.guardrail import GuardrailCounts
from workbench.train import kinds
from workbench.train.engine import make_engine
from workbench.train.guardrail import guardrail_provenance, judge_guardrail, read_guardrail
from workbench.train.optim import group_rms, make_optimizer, step_with_movement
from workbench.train.parent import check_parent
from workbench.train.recipe import OptimTable, Recipe
from workbench.train.resume import TrainState, keep_metrics_through, restore_newest
from workbench.train.sharding import any_rank, reduce_grads
from workbench.train.trainer import Trainer


def test_the_recipe_accepts_exactly_the_registered_stage_kinds():
    """One record per kind (`workbench.train.kinds`), each with its step and optimizer: the recipe accepts the
    registered names and refuses any other in one line naming them."""
    names = kinds.names()
    assert set(names) == {"chain", "sampled", "park", "halting", "direct", "scratchpad"}
    for name in names:
        record = kinds.stage_kind(name)
        assert record.name == name and callable(record.step) and kinds.optimizer_named(record.optimizer.name)
    assert Recipe.from_dict({**TINY_RECIPE, "stages": [{"kind": "scratchpad", "depths": [1]}]}).kinds == {"scratchpad"}
    with pytest.raises(WorkbenchError, match=f"'stages.0.kind' = 'chian' is not accepted; accepted: {', '.join(names)}$"):
        Recipe.from_dict({**TINY_RECIPE, "stages": [{"kind": "chian", "depths": [1]}]})


# ----------------------------------------------------------------------------- the guardrail
def _counts(right: list[bool]) -> GuardrailCounts:
    return GuardrailCounts(sum(right), len(right), {f"r{i}": v for i, v in enumerate(right)}, "battery")


def _mcnemar(helped: int, hurt: int) -> float:
    """The exact two-sided McNemar p by hand: min(1, 2 * P(X <= min(b, c))), X ~ Bin(b + c, 1/2)."""
    n = helped + hurt
    return min(1.0, 2 * sum(math.comb(n, k) for k in range(min(helped, hurt) + 1)) / 2 ** n) if n else 1.0


def test_the_guardrail_stops_a_run_past_max_drop_and_records_why(tmp_path):
    base = _counts([True] * 8 + [False] * 2)
    passed, record = judge_guardrail(base, _counts([True] * 8 + [False] * 2), max_drop=3.0, step=5)
    assert passed and record["drop_points"] == 0.0 and record["step"] == 5
    assert record["p_value"] == 1.0   # no discordant row
    passed, record = judge_guardrail(base, _counts([False] + [True] * 7 + [False] * 2), max_drop=3.0, step=6)
    assert not passed and record == {"kind": "guardrail", "step": 6, "correct": 7, "total": 10, "base": 8,
                                     "drop_points": 10.0, "helped": 0, "hurt": 1, "p_value": _mcnemar(0, 1),
                                     "max_drop": 3.0, "passed": False}
    # 5 rows lost, 1 gained: the exact two-sided p = 2 * P(X <= 1), X ~ Bin(6, 1/2) = 2 * 7/64
    passed, worse = judge_guardrail(base, _counts([False] * 5 + [True] * 3 + [True, False]), max_drop=3.0, step=7)
    assert not passed and (worse["correct"], worse["helped"], worse["hurt"]) == (4, 1, 5)
    assert worse["drop_points"] == 40.0 and worse["p_value"] == pytest.approx(_mcnemar(1, 5), abs=1e-12)
    assert _mcnemar(1, 5) == 14 / 64
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(json.dumps(record) + "\n" + json.dumps({"kind": "eval", "step": 6}) + "\n")
    assert guardrail_provenance(base, metrics, 3.0) == {"battery_sha256": "battery", "base": 8, "total": 10,
                                                        "max_drop": 3.0, "final": 7, "readings": [[6, 7]]}
    assert guardrail_provenance(None, metrics, 3.0) is None


def _battery_by_hand(model, tok) -> dict[str, bool]:
    """Each battery row alone through the base's own forward: is the answer the argmax of the ten digits' logits
    at the prompt's last token (no workbench reader, no padding)?"""
    from workbench.tasks.guardrail import guardrail_rows

    right = {}
    with torch.no_grad():
        for row in guardrail_rows():
            ids = tok(row["prompt"], return_tensors="pt")["input_ids"]
            digits = [tok.encode(row["answer_prefix"] + d, add_special_tokens=False) for d in row["symbols"]]
            assert all(len(d) == 1 for d in digits)
            logits = model(ids).logits[0, -1, [d[0] for d in digits]]
            right[row["row_id"]] = row["symbols"][int(logits.argmax())] == row["answer"]
    return right


def test_reading_the_guardrail_keeps_the_model_in_training_mode(tiny):
    from workbench.loop.surgery import retrofit

    want = _battery_by_hand(tiny[0].eval(), tiny[1])   # loop 1 of a retrofit is its base
    looped = retrofit(tiny[0], RetrofitConfig(Block(2, 4))).train()
    counts = read_guardrail(looped, tiny[1])
    assert looped.training and counts.total == 64
    assert counts.per_row == want and counts.correct == sum(want.values()) == 8   # the random tiny base: 8 of 64


# ----------------------------------------------------------------------------- gradients over ranks
class TwoRanks:
    """An accelerator of two ranks that computed the same shard: reduce(sum) doubles."""

    num_processes = 2

    def reduce(self, tensor, reduction):
        assert reduction == "sum"
        return tensor * 2


def test_reduce_grads_sums_over_ranks_and_keeps_an_untouched_tensor_none():
    a, b = torch.nn.Parameter(torch.ones(2, 3)), torch.nn.Parameter(torch.ones(4))
    a.grad = torch.arange(6.0).view(2, 3)
    total = reduce_grads(TwoRanks(), [a, b], torch.tensor(1.5), "cpu")
    assert float(total) == 3.0 and torch.equal(a.grad, 2 * torch.arange(6.0).view(2, 3)) and b.grad is None
    assert any_rank(TwoRanks(), False, "cpu") is False and any_rank(TwoRanks(), True, "cpu") is True

    class OneRank:
        num_processes = 1

    a.grad = torch.ones(2, 3)
    assert float(reduce_grads(OneRank(), [a], torch.tensor(1.5), "cpu")) == 1.5 and torch.equal(a.grad, torch.ones(2, 3))


# ----------------------------------------------------------------------------- the parent (init_from)
def test_check_parent_accepts_its_own_retrofit_and_refuses_another(finished_run):
    record = json.loads((finished_run / runs.RETROFIT).read_text())
    config = RetrofitConfig.from_dict(record["settings"])
    groups, base = record["trained_groups"], record["base"]["sha256"]
    parent = check_parent(str(finished_run), Path("/nonexistent"), base, config, groups, halting_only=False)
    assert parent.dir == finished_run and parent.groups == groups
    (entry,) = parent.lineage["parents"]
    assert entry["name"] == "tiny" and entry["halting_head_added"] is False
    with pytest.raises(WorkbenchError, match="was trained on base"):
        check_parent(str(finished_run), Path("."), "0" * 64, config, groups, halting_only=False)
    with pytest.raises(WorkbenchError, match=r"another retrofit \(max_loops differ\)"):
        check_parent(str(finished_run), Path("."), base, RetrofitConfig.from_dict({**record["settings"],
                                                                                   "max_loops": 5}),
                     groups, halting_only=False)
    with pytest.raises(WorkbenchError, match="this recipe trains"):
        check_parent(str(finished_run), Path("."), base, config, groups[:1], halting_only=False)
    with pytest.raises(WorkbenchError, match="is not a directory"):
        check_parent("no-such-run", Path("."), base, config, groups, halting_only=False)


def test_a_halting_only_child_may_add_a_head_to_its_parent(finished_run):
    record = json.loads((finished_run / runs.RETROFIT).read_text())
    with_head = RetrofitConfig.from_dict({**record["settings"], "halting": True})
    groups = [*record["trained_groups"], "halting"]
    parent = check_parent(str(finished_run), Path("."), record["base"]["sha256"], with_head, groups,
                          halting_only=True)
    assert parent.groups == record["trained_groups"] and parent.lineage["parents"][0]["halting_head_added"]
    with pytest.raises(WorkbenchError, match="another retrofit"):
        check_parent(str(finished_run), Path("."), record["base"]["sha256"], with_head, groups, halting_only=False)


# ----------------------------------------------------------------------------- checkpoints
def test_restore_takes_the_newest_checkpoint_that_loads(tmp_path):
    for step in (2, 4, 6):
        (tmp_path / runs.CHECKPOINTS / f"step_{step}").mkdir(parents=True)

    def load(ckpt: Path) -> dict:
        if ckpt.name == "step_6":
            raise OSError("cut short")
        return {"step": int(ckpt.name[5:]), "elapsed_s": 1.0}

    step, state, failures = restore_newest(tmp_path, load)
    assert (step, state) == (4, {"elapsed_s": 1.0}) and failures == ["step_6: OSError: cut short"]
    with pytest.raises(WorkbenchError, match="no checkpoint of .* loads"):
        restore_newest(tmp_path, lambda ckpt: load(tmp_path / "step_6"))
    assert restore_newest(tmp_path / "empty", load) == (0, {}, [])


def test_metrics_are_cut_back_to_the_restored_step(tmp_path):
    lines = [json.dumps({"kind": "train", "step": s}) for s in (1, 2, 3)]
    (tmp_path / runs.METRICS).write_text("\n".join(lines) + '\n{"kind": "tra')   # the last line cut by a kill
    keep_metrics_through(tmp_path, 2)
    assert (tmp_path / runs.METRICS).read_text() == lines[0] + "\n" + lines[1] + "\n"
    keep_metrics_through(tmp_path, 0)
    assert (tmp_path / runs.METRICS).read_text() == ""



def test_the_train_state_writes_what_checkpoints_always_held_and_reads_older_ones():
    """state.json keeps its keys: the halting stage's digest only once it was set up; a checkpoint written before
    `last_passing_step` existed resumes with it unset."""
    state = TrainState()
    assert state.to_dict() == {"live_projections": None, "live_gate": None, "elapsed_s": 0.0, "optimizer": None,
                               "last_passing_step": None}
    state.optimizer, state.frozen_sha256 = "halting", "ab" * 32
    assert state.to_dict()["stage2_frozen_sha256"] == "ab" * 32
    assert TrainState.from_dict({**state.to_dict(), "step": 4}) == state
    old = TrainState.from_dict({"live_projections": 2, "live_gate": None, "elapsed_s": 1.5, "optimizer": "main"})
    assert old == TrainState(live_projections=2, elapsed_s=1.5, optimizer="main")
    state.update({"optimizer": "main"})   # a key the stored state lacks keeps its value
    assert (state.optimizer, state.frozen_sha256) == ("main", "ab" * 32)

# ----------------------------------------------------------------------------- movement
@pytest.mark.parametrize("name", ["adamw", "sgd"])
def test_the_movement_is_measured_at_the_step_bit_for_bit(tiny, name):
    """Stepping one tensor at a time gives the same weights as one step over all of them, and the same RMS of
    the change as comparing a copy of every tensor taken before the step."""
    from workbench.loop.surgery import retrofit

    cfg = OptimTable(name=name, lr=1e-2, prelude_lr_mult=10.0 if name == "adamw" else 1.0, weight_decay=0.1)
    models = [retrofit(tiny[0], RetrofitConfig(Block(2, 4))),
              retrofit(__import__("copy").deepcopy(tiny[0]), RetrofitConfig(Block(2, 4)))]
    for m in models[1:]:
        m.load_state_dict(models[0].state_dict())
    opts = [make_optimizer(m, ["block", "reentry"], cfg)[0] for m in models]
    for step in range(3):
        for m, opt in zip(models, opts):
            opt.zero_grad(set_to_none=True)
            torch.manual_seed(step)
            for i, p in enumerate(q for g in opt.param_groups for q in g["params"]):
                if i != 1:   # one tensor without gradient: it stays where it is
                    p.grad = torch.randn_like(p)
        before = {id(p): p.detach().clone() for g in opts[0].param_groups for p in g["params"]}
        opts[0].step()
        copied = group_rms(opts[0], lambda p: p.detach() - before[id(p)])
        measured = step_with_movement(opts[1])
        assert measured == copied and measured["block"] > 0
        assert all(torch.equal(a, b) for a, b in zip(models[0].state_dict().values(), models[1].state_dict().values()))
        assert [p.grad is None for g in opts[1].param_groups for p in g["params"]] == \
            [p.grad is None for g in opts[0].param_groups for p in g["params"]]   # gradients handed back


def test_a_foreach_optimizer_is_refused():
    p = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.AdamW([{"params": [p], "name": "x"}], foreach=True)
    with pytest.raises(WorkbenchError, match="per-tensor optimizer"):
        step_with_movement(opt)



# ----------------------------------------------------------------------------- the engines
def test_each_engine_records_itself_and_refuses_what_it_cannot_step():
    """The trainer asks its engine, never which engine it holds: the record, the optimizer check, the readings."""
    assert make_engine("none", 1).record() == {"engine": "none"} and make_engine("ddp", 2).record() == {"engine": "ddp"}
    fsdp2 = make_engine("fsdp2", 2)
    assert fsdp2.record() == {"engine": "fsdp2"} and not fsdp2.reads_on_every_rank   # not sharded before setup
    zero2 = make_engine("zero2", 2)
    assert zero2.record()["world_size"] == 2 and zero2.record()["stage"] == 2
    zero2.check_optimizer("adamw")
    with pytest.raises(WorkbenchError, match="optim.name = 'sgd' under the zero2 preset"):
        zero2.check_optimizer("sgd")
    make_engine("ddp", 2).check_optimizer("sgd")


def test_the_local_engine_sums_over_ranks_clips_and_steps_as_before():
    """One process: backward, the gradient RMS read before clipping, the pre-clip norm, the measured movement."""
    p = torch.nn.Parameter(torch.tensor([3.0, 4.0]))
    opt = torch.optim.SGD([{"params": [p], "name": "x"}], lr=0.5, foreach=False)
    engine = make_engine("none", 1)

    class One:
        num_processes = 1

    total, squares = engine.backward(opt, (p * p).sum() / 2, [p], One(), "cpu")
    assert float(total) == 12.5 and squares is None and p.grad.tolist() == [3.0, 4.0]
    update = engine.update(opt, [p], [["p"]], squares, clip=1.0)
    assert update.grad_norm == 5.0 and update.grad_rms["x"] == pytest.approx(math.sqrt(12.5))
    assert p.tolist() == pytest.approx([3.0 - 0.5 * 0.6, 4.0 - 0.5 * 0.8])   # clipped to norm 1
    assert update.move_rms["x"] == pytest.approx(0.5 / math.sqrt(2))

# ----------------------------------------------------------------------------- the trainer's state
def test_a_trainer_declares_everything_before_setup(tmp_path):
    """State is built in one place: setup() fills in what __init__ declared and adds nothing."""
    trainer = Trainer(Recipe.from_dict(TINY_RECIPE), tmp_path / "run", progress=False)
    declared = set(vars(trainer))
    assert trainer.looped is None and trainer.opt is None
    trainer.setup()
    trainer.build_optimizer("main")
    record = trainer.step(0)
    assert set(vars(trainer)) == declared and trainer.looped is not None
    assert record["kind"] == "train" and record["loops"] == 1 and set(record["move_rms"]) >= {"block"}
