"""Recipes: unknown keys are errors that name the key and suggest the nearest; overrides; shipped recipes."""

from __future__ import annotations

from pathlib import Path

import pytest

from workbench.errors import WorkbenchError
from workbench.train.recipe import dumps, load_recipe, needed_loops, resolve

REPO = Path(__file__).resolve().parents[2]
SHIPPED = sorted((REPO / "training").glob("*.toml"))


@pytest.mark.parametrize("extra, named, suggested", [
    ({"optim": {"lrr": 1e-3}}, "optim.lrr", "optim.lr"),
    ({"sed": 1}, "sed", "seed"),
    ({"model": {"reentr": "bridge"}}, "model.reentr", "model.reentry"),
    ({"stages": [{"depths": [1], "stepz": 3}]}, "stages.0.stepz", "stages.0.steps"),
])
def test_unknown_key_is_named_with_nearest_suggestion(write_recipe, extra, named, suggested):
    with pytest.raises(WorkbenchError) as err:
        load_recipe(write_recipe(**extra))
    msg = str(err.value)
    assert f"'{named}'" in msg and f"did you mean '{suggested}'" in msg and "\n" not in msg


def test_unknown_key_through_set_is_named(write_recipe):
    with pytest.raises(WorkbenchError, match=r"'optim\.warmup'.*did you mean 'optim\.warmup_steps'"):
        load_recipe(write_recipe(), ["optim.warmup=5"])


def test_overrides_are_typed_and_resolved(write_recipe):
    r = load_recipe(write_recipe(), ["optim.lr=3e-4", "stages.1.steps=7", "model.block=1:5", "lora.enabled=true",
                                     "train.block=false"])
    assert r["optim"]["lr"] == 3e-4 and r["stages"][1]["steps"] == 7 and r["model"]["block"] == "1:5"
    assert r["lora"]["enabled"] is True and r["lora"]["r"] == 16  # defaults filled in
    assert resolve(__import__("tomllib").loads(dumps(r))) == r   # the resolved recipe round-trips


@pytest.mark.parametrize("overrides, pattern", [
    (["optim.lr=fast"], "optim.lr.*float"),
    (["stages.5.steps=1"], "stage index '5'"),
    (["model.reentry=concat"], "accepted: bridge, inject"),
    (["lora.enabled=true"], "train.block = false"),
    (["stages.1.depths=[1, 4]"], "depths in 1..3"),
    (["stages.1.depth_weights=[1]"], "one weight"),
    (["optim.name=muon"], "accepted: adamw, sgd"),
    (["stages.0.kind=halting"], "model.halting = false"),
])
def test_bad_values_are_one_line_errors(write_recipe, overrides, pattern):
    with pytest.raises(WorkbenchError, match=pattern) as err:
        load_recipe(write_recipe(), overrides)
    assert "\n" not in str(err.value)


def test_shipped_recipes_open_with_their_command_and_resolve():
    assert {p.stem for p in SHIPPED} >= {"retrofit_full_block", "retrofit_lora", "recurtrace", "smollm2_lora_chase"}
    for path in SHIPPED:
        first = path.read_text().splitlines()[0]
        assert first.startswith(f"# workbench train training/{path.name}"), path.name
        r = load_recipe(path)
        assert needed_loops(r) <= r["model"]["max_loops"]


def test_shipped_recipes_match_their_papers():
    full = load_recipe(REPO / "training" / "retrofit_full_block.toml")
    assert full["train"]["block"] and not full["lora"]["enabled"] and full["model"]["reentry"] == "bridge"
    lora = load_recipe(REPO / "training" / "retrofit_lora.toml")
    assert lora["lora"]["enabled"] and lora["lora"]["r"] == 16 and not lora["train"]["block"]
    rt = load_recipe(REPO / "training" / "recurtrace.toml")
    assert rt["model"]["reentry"] == "inject" and rt["model"]["memory"] and not rt["train"]["block"]
    assert [s["kind"] for s in rt["stages"]] == ["sampled", "halting"]
    assert (rt["sampler"]["mean"], rt["sampler"]["sigma"], rt["sampler"]["max"]) == (4.0, 0.5, 8)
    assert rt["halting"]["probe_depths"] == [1, 2, 4, 6] and rt["halting"]["lr"] == 3e-4
    # the outcome-only anneal: chain weight ramped to zero, then final answers only
    kinds = [(s["chain_weight"], s["chain_weight_end"]) for s in full["stages"][-2:]]
    assert kinds == [(1.0, 0.0), (0.0, None)]
