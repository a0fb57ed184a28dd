"""Every recipe key's bounds, read from the schema: a value just outside what a key declares (below its lower bound,
above its upper one, a name it does not accept, a value of another type, a number that is not finite) is refused in
one line that names the key, through `--set` and before anything loads."""

from __future__ import annotations

import json
import math
import typing
from pathlib import Path

import pytest
import tomllib
from pydantic import AfterValidator

from tests.test_cli_errors import assert_clean_error, invoke
from workbench.errors import WorkbenchError
from workbench.train.recipe import Recipe, Stage, apply_overrides, known_keys
from workbench.train.schema import annotation, is_table

RECIPE = Path(__file__).resolve().parents[2] / "training" / "smollm2_lora_chase.toml"
RAW = tomllib.loads(RECIPE.read_text())


def _hint(dotted: str):
    """The declared annotation of a dotted key (stage keys as stages.N.key)."""
    parts = dotted.split(".")
    cls, parts = (Stage, parts[2:]) if parts[0] == "stages" else (Recipe, parts)
    for part in parts[:-1]:
        cls = cls.__pydantic_fields__[part].annotation
        assert is_table(cls)
    return annotation(cls, parts[-1])


def _members(hint) -> list:
    """The alternatives of an annotation: [hint], or each member of a union (None left out)."""
    if typing.get_origin(hint) is typing.Annotated:
        return [hint]
    args = typing.get_args(hint)
    return [a for a in args if a is not type(None)] if typing.get_origin(hint) in (typing.Union, type(int | None)) \
        else [hint]


def _outside(hint) -> list:
    """Values the annotation refuses, derived from it: each bound crossed, a name not listed, a wrong type."""
    out, members = [], _members(hint)
    if len(members) == 2 and {typing.get_args(m)[0] for m in members} == {int, float}:
        members = members[1:]   # a number kept as written (`Number`): its float member refuses what both refuse
    for member in members:
        base, meta = (typing.get_args(member)[0], typing.get_args(member)[1:]) \
            if typing.get_origin(member) is typing.Annotated else (member, ())
        if typing.get_origin(base) is list:
            out += [[v] for v in _outside(typing.get_args(base)[0]) if not isinstance(v, list)] + ["x"]
            continue
        if typing.get_origin(base) is typing.Literal:
            out += ["nonsense", 1]
            continue
        bounds = {}
        for m in meta:
            for item in [m, *getattr(m, "metadata", ())]:
                for name in ("ge", "gt", "le", "lt"):
                    if getattr(item, name, None) is not None and type(item).__name__.lower() == name:
                        bounds[name] = getattr(item, name)
                if getattr(item, "pattern", None) or isinstance(item, AfterValidator):   # a form, a registry's names
                    out.append("nonsense")
        step = 1 if base is int else 1e-3
        out += [bounds["ge"] - step] if "ge" in bounds else []
        out += [bounds["gt"]] if "gt" in bounds else []
        out += [bounds["le"] + step] if "le" in bounds else []
        out += [bounds["lt"]] if "lt" in bounds else []
        out += {bool: [1], int: [1.5, True], float: ["x", math.inf, True], str: [5]}[base]
    return out


def _toml(value) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(map(_toml, value)) + "]"
    return "inf" if isinstance(value, float) and math.isinf(value) else json.dumps(value)


CASES = [(key.replace("stages.N.", "stages.0."), value) for key in known_keys() for value in _outside(_hint(key))]


FREE_TEXT = {"name", "init_from", "model.base", "stages.N.name"}   # labels and paths, read where they are used


@pytest.mark.parametrize("key", known_keys())
def test_every_key_is_bounded_or_named(key):
    """A number has a lower bound, a string is one of its names or has a form, a bool is strict: only the free texts
    above are open. The generated set below is read from these bounds, so a bound left out would go untested."""
    refused = _outside(_hint(key))
    if key in FREE_TEXT:
        assert refused == [5], key
    elif refused != [1]:        # a bool: only true and false
        assert any(v not in ("x", 1, 5, 1.5, True, math.inf, [1.5], [True], ["x"], [math.inf]) for v in refused), \
            (key, refused)


def test_the_generated_set_covers_every_key():
    assert len(CASES) >= 180 and {k for k, _ in CASES} == {k.replace("stages.N.", "stages.0.") for k in known_keys()}


@pytest.mark.parametrize("key, value", CASES, ids=[f"{k}={_toml(v)}" for k, v in CASES])
def test_a_value_outside_a_keys_declaration_is_refused_in_one_line(key, value):
    with pytest.raises(WorkbenchError) as err:
        Recipe.from_dict(apply_overrides(RAW, [f"{key}={_toml(value)}"]))   # Recipe.from_toml, the file read once
    message = str(err.value)
    assert "\n" not in message and f"'{key}'" in message, message


@pytest.mark.parametrize("setting, fragment", [
    ("halting.act_cost=-5.0", "'halting.act_cost' = -5.0 must be a finite number >= 0"),
    ("halting.margin=-1e9", "'halting.margin' = -1000000000.0 must be a finite number >= 0"),
    ("sampler.max=-3", "'sampler.max' = -3 must lie in [1, 64]"),
    ("task.surface=nonsense", "'task.surface' = 'nonsense' is not accepted; accepted: symbolic, relay, pointer"),
])
def test_the_four_accepted_before_are_refused_before_the_base_loads(capsys, monkeypatch, tmp_path, setting, fragment):
    """Issue 56's fuzz cases: each passed `Recipe.from_toml` before, and task.surface was refused only in
    the trainer's setup, after the base had loaded."""
    import workbench.train.build as build

    def no_base(*args, **kwargs):
        raise AssertionError("the base was loaded")

    monkeypatch.setattr(build, "load_base", no_base)
    code, _, err = invoke(capsys, monkeypatch, "train", RECIPE, "--out", tmp_path / "run", "--set", setting)
    assert_clean_error(code, err, fragment)
    assert list(tmp_path.iterdir()) == []
