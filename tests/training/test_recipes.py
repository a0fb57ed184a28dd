"""Recipes: unknown keys are errors that name the key and suggest the nearest; overrides; shipped recipes; every
committed recipe and every specimen's recorded recipe read into the typed Recipe unchanged."""

from __future__ import annotations

import ast
import inspect
import typing
from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path

import pytest
import tomllib

from workbench.errors import WorkbenchError
from workbench.loop.config import Block, LoraSettings, RetrofitConfig
from workbench.train.recipe import LoraTable, ModelTable, Recipe, Stage, dumps, known_keys, mirrored_keys

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
        Recipe.from_toml(write_recipe(**extra))
    msg = str(err.value)
    assert f"'{named}'" in msg and f"did you mean '{suggested}'" in msg and "\n" not in msg


def test_unknown_key_through_set_is_named(write_recipe):
    with pytest.raises(WorkbenchError, match=r"'optim\.warmup'.*did you mean 'optim\.warmup_steps'"):
        Recipe.from_toml(write_recipe(), ["optim.warmup=5"])


TABLES = sorted({k.rsplit(".", 1)[0] for k in known_keys() if "." in k})


def _keys_of(table: str) -> list[str]:
    prefix = table + "."
    return [k[len(prefix):] for k in known_keys() if k.startswith(prefix) and "." not in k[len(prefix):]]


@pytest.mark.parametrize("table", TABLES)
def test_a_mistyped_set_key_lists_every_key_its_table_accepts(write_recipe, table):
    """Generated over every table: `--set TABLE.<typo>=1` names the table's keys, all of them, on one line."""
    index = table.replace("stages.N", "stages.0")
    with pytest.raises(WorkbenchError) as err:
        Recipe.from_toml(write_recipe(), [f"{index}.zz_not_a_key=1"])
    msg = str(err.value)
    assert "\n" not in msg and f"[{table}] accepts:" in msg
    listed = msg.split("accepts: ", 1)[1].rstrip(")").split(", ")
    assert listed == _keys_of(table)


def test_a_mistyped_table_lists_the_tables(write_recipe):
    with pytest.raises(WorkbenchError) as err:
        Recipe.from_toml(write_recipe(), ["optimm.lr=1"])
    msg = str(err.value)
    assert "did you mean 'optim.lr'" in msg
    for table in ("optim", "model", "eval", "stages", "guardrail"):
        assert table in msg.split("tables: ", 1)[1]


def test_overrides_are_typed_and_resolved(write_recipe):
    r = Recipe.from_toml(write_recipe(), ["optim.lr=3e-4", "stages.1.steps=7", "model.block=1:5", "lora.enabled=true",
                                     "train.block=false"])
    assert r.optim.lr == 3e-4 and r.stages[1].steps == 7 and r.model.block == "1:5"
    assert r.lora.enabled is True and r.lora.r == 16  # defaults filled in
    assert Recipe.from_dict(tomllib.loads(dumps(r))) == r   # the resolved recipe round-trips


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
        Recipe.from_toml(write_recipe(), overrides)
    assert "\n" not in str(err.value)


def test_shipped_recipes_open_with_their_command_and_resolve():
    assert {p.stem for p in SHIPPED} >= {"retrofit_full_block", "retrofit_lora", "recurtrace", "smollm2_lora_chase"}
    for path in SHIPPED:
        first = path.read_text().splitlines()[0]
        assert first.startswith(f"# workbench train training/{path.name}"), path.name
        r = Recipe.from_toml(path)
        assert r.needed_loops() <= r.model.max_loops


def test_shipped_recipes_match_their_papers():
    full = Recipe.from_toml(REPO / "training" / "retrofit_full_block.toml")
    assert full.train.block and not full.lora.enabled and full.model.reentry == "bridge"
    lora = Recipe.from_toml(REPO / "training" / "retrofit_lora.toml")
    assert lora.lora.enabled and lora.lora.r == 16 and not lora.train.block
    rt = Recipe.from_toml(REPO / "training" / "recurtrace.toml")
    assert rt.model.reentry == "inject" and rt.model.memory and not rt.train.block
    assert [s.kind for s in rt.stages] == ["sampled", "halting"]
    assert (rt.sampler.mean, rt.sampler.sigma, rt.sampler.max) == (4.0, 0.5, 8)
    assert rt.halting.probe_depths == [1, 2, 4, 6] and rt.halting.lr == 3e-4
    # the outcome-only anneal: chain weight ramped to zero, then final answers only
    kinds = [(s.chain_weight, s.chain_weight_end) for s in full.stages[-2:]]
    assert kinds == [(1.0, 0.0), (0.0, None)]


# ----------------------------------------------------------------------------- the typed recipe
COMMITTED = sorted(p for p in (REPO / "training").rglob("*.toml") if "stages" in tomllib.loads(p.read_text()))
RECORDED = sorted((REPO / "training").rglob("recipe.toml"))   # what each committed run wrote into its directory


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        elif k == "stages":
            for i, stage in enumerate(v):
                out.update(_flat(stage, f"{prefix}stages.{i}."))
        else:
            out[prefix + k] = v
    return out


def _default(dotted: str):
    """The declared default of a dotted key (stage keys as stages.N.key)."""
    parts = dotted.split(".")
    if parts[0] == "stages":
        node, parts = Stage(), parts[2:]
    else:
        node = Recipe()
    for part in parts:
        node = getattr(node, part)
    return node


def test_every_committed_recipe_loads():
    assert len(COMMITTED) >= 40 and len(RECORDED) >= 25
    for path in COMMITTED:
        r = Recipe.from_toml(path)
        assert Recipe.from_dict(r.to_dict()) == r and tomllib.loads(dumps(r)) == r.to_dict(), path


def test_every_recorded_recipe_round_trips():
    """A specimen's recipe.toml is what the trainer recorded: read back, it gives the same keys and values; a key
    added since the run was trained (halting.sweep, train.compile, ...) comes back at its default."""
    exact = 0
    for path in RECORDED:
        d = tomllib.loads(path.read_text())
        back = Recipe.from_dict(d).to_dict()
        mine, theirs = _flat(back), _flat(d)
        assert {k: repr(mine[k]) for k in theirs} == {k: repr(v) for k, v in theirs.items()}, path  # 1 stays 1
        assert all(mine[k] == _default(k) for k in set(mine) - set(theirs)), path
        exact += back == d
    assert exact >= 5    # the runs trained since the newest keys (model.loop_codes, optim.loop_codes_lr_mult) arrived
    #                      round-trip exactly: from_dict(d).to_dict() == d (the park-codes keeper and its four heads)


def test_to_dict_lists_every_key_in_declaration_order():
    r = Recipe.from_toml(REPO / "training" / "smollm2_lora_chase.toml")
    d = r.to_dict()
    assert list(d) == [f.name for f in fields(Recipe)]
    assert all(list(d[f.name]) == [g.name for g in fields(getattr(r, f.name))]
               for f in fields(Recipe) if is_dataclass(getattr(r, f.name)))
    assert "chain_weight_end" not in d["stages"][0]   # None is left out (TOML has no null), as recipe.toml records it


def test_the_retrofit_keys_take_the_retrofit_defaults():
    """One default per architecture key: a recipe's [model] and [lora] defaults are RetrofitConfig's and LoraSettings'
    (max_loops apart, declared 8 once in the recipe: the loop count every committed run was trained at)."""
    config, model, lora = RetrofitConfig(block=Block(1, 2)), ModelTable(), Recipe().lora
    shared = [f.name for f in fields(ModelTable) if f.name in {g.name for g in fields(RetrofitConfig)}]
    assert set(shared) == {"block", "reentry", "memory", "memory_window", "memory_heads", "halting",
                           "halting_pooling", "max_loops", "loop_codes"}
    assert all(getattr(model, k) == getattr(config, k) for k in shared if k not in ("block", "max_loops"))
    assert (lora.r, lora.alpha, lora.dropout) == (LoraSettings().r, LoraSettings().alpha, LoraSettings().dropout)
    assert model.max_loops == 8 and all(Recipe.from_toml(p).model.max_loops == 8 for p in RECORDED)


# ----------------------------------------------------------------------------- one default per key
# Each default a recipe key shares with the code below the recipe, and each place that restated it before (issue 43):
# the place, the function (or class) and its parameter. Every one reads the key's one default; none writes a literal.
READ_ELSEWHERE = [
    ("workbench/tasks/guardrail.py", "passes", "max_drop"),                     # guardrail.max_drop
    ("workbench/train/losses.py", "sample_loop_counts", "mean"),                # sampler.mean, .sigma, .max
    ("workbench/train/losses.py", "sample_loop_counts", "sigma"),
    ("workbench/train/losses.py", "sample_loop_counts", "max_loops"),
    ("workbench/loop/halting.py", "oracle_labels", "margin"),                   # halting.margin, .depth_cost
    ("workbench/loop/halting.py", "oracle_labels", "depth_cost"),
    ("workbench/tasks/rehearsal.py", "rehearsal_texts", "sources"),             # preserve.sources
    ("workbench/loop/halting.py", "HaltingHead.__init__", "pooling"),           # RetrofitConfig.halting_pooling
    ("workbench/loop/memory.py", "LoopMemoryAttention.__init__", "n_heads"),    # RetrofitConfig.memory_heads
]


def _parameter_default(path: str, qualname: str, parameter: str) -> ast.expr:
    """The default expression of `parameter` of the function `qualname` ("Class.method" for a method) in `path`."""
    tree = ast.parse((REPO / path).read_text())
    *owner, name = qualname.split(".")
    scope = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == owner[0]) if owner else tree
    fn = next(n for n in scope.body if isinstance(n, ast.FunctionDef) and n.name == name)
    args = fn.args.posonlyargs + fn.args.args
    named = dict(zip([a.arg for a in args][len(args) - len(fn.args.defaults):], fn.args.defaults))
    named.update({a.arg: d for a, d in zip(fn.args.kwonlyargs, fn.args.kw_defaults) if d is not None})
    return named[parameter]


@pytest.mark.parametrize("path, qualname, parameter", READ_ELSEWHERE)
def test_code_below_the_recipe_restates_no_default_it_shares(path, qualname, parameter):
    """A literal there would be a second statement of the key's default (an AST check: `3.0`, `8`, `"mean"`)."""
    default = _parameter_default(path, qualname, parameter)
    assert not isinstance(default, (ast.Constant, ast.Tuple, ast.List)), (path, qualname, parameter)


def test_each_shared_default_is_one_object_read_by_both_sides():
    """The recipe's default and the lower module's are the same object: a float written twice in two modules would be
    two objects (`is` fails), so each side reads it from its one home."""
    import workbench.defaults as d
    from workbench.loop.halting import HaltingHead, oracle_labels
    from workbench.loop.memory import LoopMemoryAttention
    from workbench.tasks import guardrail, rehearsal
    from workbench.train.losses import sample_loop_counts

    def default(fn, name):
        return inspect.signature(fn).parameters[name].default

    r = Recipe()
    assert r.guardrail.max_drop is d.MAX_DROP_POINTS is guardrail.MAX_DROP_POINTS is default(guardrail.passes, "max_drop")
    assert r.halting.margin is d.ORACLE_MARGIN is default(oracle_labels, "margin")
    assert r.halting.depth_cost is d.ORACLE_DEPTH_COST is default(oracle_labels, "depth_cost")
    assert tuple(r.preserve.sources) == d.REHEARSAL_SOURCES and rehearsal.SOURCES is d.REHEARSAL_SOURCES
    assert default(rehearsal.rehearsal_texts, "sources") is d.REHEARSAL_SOURCES
    s = r.sampler   # the recipe is the lower of the two here (losses imports it)
    assert (default(sample_loop_counts, "mean"), default(sample_loop_counts, "sigma"),
            default(sample_loop_counts, "max_loops")) == (s.mean, s.sigma, s.max)
    assert default(sample_loop_counts, "mean") is s.mean and default(sample_loop_counts, "sigma") is s.sigma
    assert default(HaltingHead, "pooling") is RetrofitConfig.halting_pooling is r.model.halting_pooling
    assert default(LoopMemoryAttention, "n_heads") == RetrofitConfig.memory_heads == r.model.memory_heads
    assert (r.guardrail.max_drop, r.halting.margin, r.halting.depth_cost, s.mean, s.sigma, s.max) == \
        (3.0, 0.01, 0.0, 4.0, 0.5, 8)   # the values every committed run trained with


def _unmirrored(name: str, table) -> list[str]:
    """Each field of the dataclass the table `name` mirrors that is neither a key of `table` under its name, type and
    default (max_loops: the recipe's own 8) nor named in `MIRRORED` with where it comes from."""
    from workbench.train import recipe as rec
    from workbench.train.schema import annotation

    source, otherwise = rec.MIRRORED[name]
    hints, ours, wrong = typing.get_type_hints(source), {f.name: f for f in fields(table)}, []
    for f in fields(source):
        if f.name in otherwise:
            continue
        expected = rec.RECIPE_MAX_LOOPS if (name, f.name) == ("model", "max_loops") else f.default
        hint = annotation(table, f.name) if f.name in ours else None
        base = typing.get_args(hint)[0] if typing.get_origin(hint) is typing.Annotated else hint
        kind = type(typing.get_args(base)[0]) if typing.get_origin(base) is typing.Literal else base
        if f.name not in ours or ours[f.name].default != expected or kind is not hints[f.name]:
            wrong.append(f.name)
    return wrong


def test_model_and_lora_are_read_from_the_retrofit_dataclasses(monkeypatch):
    """[model] and [lora] take RetrofitConfig's and LoraSettings' fields by name, each at its dataclass's default but
    max_loops; every field is either a key or named in `MIRRORED` (where it comes from)."""
    from workbench.train import recipe as rec

    for name, table, source in (("model", ModelTable, RetrofitConfig), ("lora", LoraTable, LoraSettings)):
        _, otherwise = rec.MIRRORED[name]
        assert set(rec.mirrored_keys(name)) | set(otherwise) == {f.name for f in fields(source)}
        assert _unmirrored(name, table) == [], name
    assert ModelTable().max_loops == rec.RECIPE_MAX_LOOPS == 8 != RetrofitConfig.max_loops

    # A field added to the dataclass without its key is named here.
    @dataclass(frozen=True)
    class Wider(RetrofitConfig):
        new_knob: int = 5

    monkeypatch.setitem(rec.MIRRORED, "model", (Wider, rec.MIRRORED["model"][1]))
    assert _unmirrored("model", ModelTable) == ["new_knob"]


def test_the_trainer_maps_every_mirrored_key_to_the_retrofit():
    """`retrofit_config` passes each [model] and [lora] key the dataclasses share by name: a recipe setting each one
    away from its default builds exactly the retrofit it names."""
    from workbench.train.build import retrofit_config

    raw = {"model": {"reentry": "inject", "memory": True, "memory_window": 5, "memory_heads": 2, "halting": True,
                     "halting_pooling": "last", "loop_codes": True, "max_loops": 12},
           "lora": {"enabled": True, "r": 4, "alpha": 8, "dropout": 0.1}, "train": {"block": False},
           "stages": [{"depths": [1]}]}
    assert set(raw["model"]) == set(mirrored_keys("model")) and set(raw["lora"]) - {"enabled"} == set(
        mirrored_keys("lora"))
    config = retrofit_config(Recipe.from_dict(raw), (1, 3))
    assert config == RetrofitConfig(block=Block(1, 3), **raw["model"], lora=LoraSettings(r=4, alpha=8, dropout=0.1))
    assert retrofit_config(Recipe.from_dict({"stages": [{"depths": [1]}]}), (1, 3)) == RetrofitConfig(
        block=Block(1, 3), max_loops=8)


@pytest.mark.parametrize("raw, pattern", [
    ({"model": {"reentry": "concat"}}, r"'model\.reentry' = 'concat' is not accepted; accepted: bridge, inject$"),
    ({"model": {"memory_heads": 65}}, r"'model\.memory_heads' = 65 must lie in \[1, 64\]$"),
    ({"model": {"memory_window": 0}}, r"'model\.memory_window' = 0 must lie in \[1, 64\]$"),
    ({"model": {"max_loops": 65}}, r"'model\.max_loops' = 65 must lie in \[1, 64\]$"),
    ({"model": {"memory": 1}}, r"'model\.memory' = 1 must be of type bool$"),
    ({"lora": {"r": 0}}, r"'lora\.r' = 0 must lie in \[1, 4096\]$"),
    ({"lora": {"alpha": 0}}, r"'lora\.alpha' = 0 must lie in \[1, 1000000\]$"),
    ({"lora": {"dropout": 1.0}}, r"'lora\.dropout' = 1\.0 must lie in \[0\.0, 0\.999\]$"),
    ({"lora": {"targets": ["q_proj"]}}, r"unknown recipe key 'lora\.targets'"),
])
def test_the_mirrored_keys_keep_their_types_and_checks(raw, pattern):
    with pytest.raises(WorkbenchError, match=pattern):
        Recipe.from_dict({**raw, "stages": [{"depths": [1], "steps": 1}]})


@pytest.mark.parametrize("raw, pattern", [
    ({"model": {"max_loopz": 4}}, r"unknown recipe key 'model\.max_loopz'; did you mean 'model\.max_loops'\?"),
    ({"optim": {"batch_size": "8"}}, r"recipe key 'optim\.batch_size' = '8' must be of type int$"),
    ({"optim": {"betas": [0.9, "x"]}}, r"recipe key 'optim\.betas' = \[0\.9, 'x'\] must be a list of numbers$"),
    ({"optim": "fast"}, r"recipe key 'optim' must be a table, got 'fast'$"),
    ({"task": {"alphabet": 99}}, r"recipe key 'task\.alphabet' = 99 must lie in \[2, 64\]$"),
    ({"optim": {"lr": 0}}, r"recipe key 'optim\.lr' = 0\.0 must be a finite number > 0$"),
    ({"checkpoint": {"keep": 0}}, r"recipe key 'checkpoint\.keep' = 0 must be >= 1$"),
])
def test_from_dict_refuses_each_error_class_in_one_line(raw, pattern):
    """Without a TOML file: an unknown key with its suggestion, a wrong type, a value out of range."""
    with pytest.raises(WorkbenchError, match=pattern) as err:
        Recipe.from_dict({**raw, "stages": [{"depths": [1], "steps": 1}]})
    assert "\n" not in str(err.value)


def test_an_int_where_a_float_is_declared_reads_as_that_float():
    r = Recipe.from_dict({"optim": {"lr": 1}, "stages": [{"chain_weight_end": 0}]})
    assert r.optim.lr == 1.0 and isinstance(r.optim.lr, float) and r.stages[0].chain_weight_end == 0.0
