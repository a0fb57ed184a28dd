"""Training recipes: one TOML file each, read into the typed `Recipe`, with `--set` overrides.

A recipe is the whole record of a run (docs/architecture.md, run directories): every key is declared once here, in
the dataclass of its table, with its one default and the values it accepts; every key a user writes must be one of
them (a misspelled option is an error naming it and the nearest known key, never silently ignored), and the
resolved recipe, overrides included, is written back into the run directory as `recipe.toml` (`Recipe.to_dict`).
[model] and [lora] declare RetrofitConfig's and LoraSettings' own fields, read from them (`MIRRORED`); a default
shared with code that imports torch (the guardrail's max_drop, the oracle's margin) is read from `workbench.defaults`.

    recipe = Recipe.from_toml("training/smollm2_lora_chase.toml", ["optim.lr=3e-4"])
    recipe.optim.lr, recipe.stages[0].kind, recipe.to_dict() == tomllib.loads(dumps(recipe))

Stages run in order. Each is one of:
  - `chain`: per-loop cross-entropy on the active loops of each row (loop t against x_t, t <= d,
    over the task's candidate symbols, read through `looped.read`), intermediate loops weighted
    by `chain_weight`, ramped linearly to `chain_weight_end` over the stage (the outcome-only
    anneal of the retrofit paper Sec. 5.2: ramp to 0, then a stage at 0 grades final answers only);
  - `sampled`: RecurTrace Stage 1 (App. D): a loop count drawn per step from the clamped
    log-normal Poisson `[sampler]`, language-model loss on the answer token at that depth;
  - `park`: chain supervision up to each row's depth d, then the answer x_d at every loop d..T, T drawn
    per step uniformly from the batch's deepest d to `sampler.max` (the answer loss only at loops T >= d, so
    the state parks on the answer instead of iterating the rule past d); `chain_weight` weights loops t < d;
    `park_depths` (default: every depth) names the depths that park: rows of the stage's other depths keep
    iterating past d (loop t > d targets x_t, the table applied t times), a depth mix whose answer is held on
    some rows and passed on others, so no single loop count reads every row right;
  - `halting`: RecurTrace Stage 2 (App. E): everything frozen but the halting head, which is
    distilled from the loss-improvement oracle (or trained with the ACT / PonderNet objective).
    `[halting] sweep = N` computes the oracle losses and the head's pooled inputs of N training rows
    once (App. E's offline sweep) and trains the head on that cache; 0 runs the frozen model every step.
    A halting-only recipe may `init_from` a parent trained without a head: the head is added fresh.
"""

from __future__ import annotations

import copy
import difflib
import functools
import os
import typing
from dataclasses import MISSING, dataclass, field, fields, is_dataclass, make_dataclass

import tomli_w
import tomllib

from workbench.defaults import EMBEDDED_DEFAULT, MAX_DROP_POINTS, ORACLE_DEPTH_COST, ORACLE_MARGIN, REHEARSAL_SOURCES
from workbench.errors import WorkbenchError
from workbench.loop.config import MAX_LOOPS, LoraSettings, RetrofitConfig
from workbench.readers import read_toml
from workbench.train.declared import (
    above,
    at_least,
    check_keys,
    declared,
    finite,
    one_of,
    plain,
    table,
    type_hints,
    typed,
    within,
)

STAGE_KINDS = ("chain", "sampled", "park", "halting", "direct", "scratchpad")
DENSE_KINDS = ("direct", "scratchpad")  # the dense controls (workbench.train.dense): loop 1 only
ANSWER_TASKS = ("state", "arith")  # multi-token answers, read exactly (`workbench.tasks.reader.read_answers`)
OPTIMIZERS = ("adamw", "sgd")
SCHEDULES = ("constant", "cosine", "linear")
HALTING_OBJECTIVES = ("oracle", "act", "pondernet")
MAX_STEPS = 10 ** 8


def _known_task(key: str, value: str) -> None:
    from workbench.tasks import TASKS  # noqa: PLC0415 - the task generators import torch: only when a recipe is checked

    one_of(*TASKS)(key, value)


def _two_betas(key: str, betas: list) -> None:
    if len(betas) != 2 or not all(0 <= b < 1 for b in betas):
        raise WorkbenchError(f"recipe key '{key}' = {betas} must be two numbers in [0, 1)")


# ------------------------------------------------------------------ the tables mirrored from the retrofit's own
# [model] and [lora] declare RetrofitConfig's and LoraSettings' fields under their names, with their types and
# defaults, read from those dataclasses (one source: a field added there is a recipe key at its default, and reaches
# the retrofit through `workbench.train.trainer.retrofit_config`, with no edit here or there). What the recipe states
# otherwise is in the three tables below: the one place a name, a default or a check differs.
MIRRORED = {
    # table: (the dataclass it mirrors, {each of its fields the recipe does not take by name: where it comes from})
    "model": (RetrofitConfig, {"block": "model.block, a string, 'A:B' or 'auto' (resolved by the trainer: "
                                        "workbench.selection.stage1.resolve_block)",
                               "lora": "the [lora] table: LoraSettings when lora.enabled, else None"}),
    "lora": (LoraSettings, {"targets": "not a recipe key: an adapter always takes LoraSettings' targets"}),
}
# Where a recipe's default differs from its dataclass's. max_loops 8, not RetrofitConfig's 16: every committed run
# was trained and recorded at 8 (its recipe.toml and retrofit.json), while a retrofit built in Python keeps the
# documented 16 (docs/api.md). A key given its default here comes after those taken as they are.
MIRRORED_DEFAULTS = {"model": {"max_loops": 8}, "lora": {}}
MIRRORED_CHECKS = {
    "model": {"reentry": (one_of("bridge", "inject"),), "memory_window": (within(1, MAX_LOOPS),),
              "memory_heads": (within(1, 64),), "max_loops": (within(1, MAX_LOOPS),)},
    "lora": {"r": (within(1, 4096),), "alpha": (within(0.0, 1e6, low_ok=False),), "dropout": (within(0.0, 0.999),)},
}


def mirrored_keys(name: str) -> tuple[str, ...]:
    """The fields of the dataclass that the table `name` mirrors which the recipe declares under the same name."""
    source, otherwise = MIRRORED[name]
    return tuple(f.name for f in fields(source) if f.name not in otherwise)


def _mirror(name: str, doc: str, before: list, after: list):
    """The frozen table `name`: its own keys `before`, then the mirrored dataclass's fields (in its order, those given
    a default in MIRRORED_DEFAULTS last), then its own keys `after`; each own key a (name, type, declared(...))."""
    source, _ = MIRRORED[name]
    hints, defaults, checks = typing.get_type_hints(source), MIRRORED_DEFAULTS[name], MIRRORED_CHECKS[name]
    taken = [f for f in fields(source) if f.name in mirrored_keys(name)]
    spec = []
    for f in [f for f in taken if f.name not in defaults] + [f for f in taken if f.name in defaults]:
        if hints[f.name] not in (bool, int, float, str) or f.default is MISSING:
            raise TypeError(f"{source.__name__}.{f.name} cannot be a recipe key as it is (a bool, int, float or str "
                            f"with a default): say where the recipe gives it in MIRRORED['{name}']")
        spec.append((f.name, hints[f.name], declared(defaults.get(f.name, f.default), *checks.get(f.name, ()))))
    cls = make_dataclass(f"{name.capitalize()}Table", before + spec + after, frozen=True)
    cls.__module__, cls.__doc__ = __name__, doc
    return cls


# ------------------------------------------------------------------ the tables
ModelTable = _mirror(
    "model", "[model]: the base and the retrofit made of it (`workbench.train.trainer.retrofit_config`): "
    "RetrofitConfig's fields but block and lora (`MIRRORED`), the base and the attention implementation.",
    before=[("base", str, declared(EMBEDDED_DEFAULT)),
            ("block", str, declared("10:16"))],             # "A:B", or "auto" (workbench.selection.stage1.resolve_block)
    after=[("attn", str, declared("eager"))])


@dataclass(frozen=True)
class TrainTable:
    """[train]: what trains and how it is computed."""

    block: bool = declared(True)                    # full-block budget: the looped block's own weights train
    precision: str = declared("fp32", one_of("fp32", "bf16"))  # bf16: frozen weights bf16, trainables fp32
    compile: bool = declared(False)                 # torch.compile every decoder layer; off: 0.86x on a whole run (docs/gpu.md)


@dataclass(frozen=True)
class GuardrailTable:
    """[guardrail]: the capability guardrail at loop 1 (workbench.tasks.guardrail)."""

    enabled: bool = declared(True)                  # scored before training and at every evaluation
    max_drop: float = declared(MAX_DROP_POINTS, above(0.0))  # points below the base that stop the run (paper Sec. 4.3)
    every: int = declared(0, at_least(0))           # also score every N steps (0: only at evaluations)


@dataclass(frozen=True)
class PreserveTable:
    """[preserve]: KL(base || model) at loop 1 on rehearsal text (workbench.tasks.rehearsal)."""

    kl_weight: float = declared(0.0, above(0.0))    # 0 = off
    rows: int = declared(8, at_least(1))            # rehearsal texts per step
    positions: int = declared(8, at_least(1))       # positions read per text
    sources: list[str] = declared(list(REHEARSAL_SOURCES), one_of(*REHEARSAL_SOURCES))


LoraTable = _mirror(
    "lora", "[lora]: one adapter on the block's projections (`LoraSettings`: its fields but targets), when enabled.",
    before=[("enabled", bool, declared(False))], after=[])


@dataclass(frozen=True)
class TaskTable:
    """[task]: the generator of training and held-out rows (`workbench.tasks`)."""

    name: str = declared("chase", _known_task)
    alphabet: int = declared(8, within(2, 64))
    symbol_set: str = declared("letters")
    surface: str = declared("symbolic")
    permutation: bool = declared(False)


@dataclass(frozen=True)
class OptimTable:
    """[optim]: the main optimizer (`workbench.train.optim.make_optimizer`) and its schedule."""

    name: str = declared("adamw", one_of(*OPTIMIZERS))
    lr: float = declared(1e-4, above(0.0, strict=True))
    prelude_lr_mult: float = declared(10.0, within(0.0, 1e6, low_ok=False))  # W_p's own group (retrofit paper Sec. 5.1)
    loop_codes_lr_mult: float = declared(10.0, within(0.0, 1e6, low_ok=False))  # the loop codes' own group
    weight_decay: float = declared(0.0, within(0.0, 1e3))
    betas: list[float] = declared([0.9, 0.999], _two_betas)
    eps: float = declared(1e-8, within(0.0, 1.0, low_ok=False))
    momentum: float = declared(0.9, within(0.0, 1.0))  # sgd only
    grad_clip: float = declared(1.0, within(0.0, 1e9))
    warmup_steps: int = declared(0, within(0, 10 ** 9))
    schedule: str = declared("constant", one_of(*SCHEDULES))
    batch_size: int = declared(8, within(1, 65536))


@dataclass(frozen=True)
class SamplerTable:
    """[sampler]: the loop counts of sampled stages (clamped log-normal Poisson) and park's deepest count."""

    mean: float = declared(4.0, within(1.0, MAX_LOOPS))
    sigma: float = declared(0.5, within(0.0, 10.0))
    max: int = declared(8)


@dataclass(frozen=True)
class HaltingTable:
    """[halting]: Stage 2, the halting head's objective and its own optimizer (`workbench.train.losses`)."""

    objective: str = declared("oracle", one_of(*HALTING_OBJECTIVES))
    probe_depths: list[int] = declared([1, 2, 4, 6])
    margin: float = declared(ORACLE_MARGIN)
    depth_cost: float = declared(ORACLE_DEPTH_COST)
    oracle_max: int = declared(8)
    lr: float = declared(3e-4, within(0.0, 1e3, low_ok=False))
    warmup_steps: int = declared(10, within(0, 10 ** 9))
    act_cost: float = declared(0.01)
    ponder_lambda: float = declared(0.2)
    ponder_kl: float = declared(0.01)
    sweep: int = declared(0, within(0, 10 ** 7))


@dataclass(frozen=True)
class EvalTable:
    """[eval]: the held-out rows and how often they are read."""

    every: int = declared(100, at_least(1))
    per_depth: int = declared(64, within(1, 10 ** 6))
    depths: list[int] = declared([1, 2, 3, 4])
    seed: int = declared(1)
    batch_size: int = declared(16, within(1, 65536))


@dataclass(frozen=True)
class CheckpointTable:
    """[checkpoint]: how often a resumable checkpoint is written, and how many are kept."""

    every: int = declared(100, at_least(1))
    keep: int = declared(2, at_least(1))


@dataclass(frozen=True)
class LogTable:
    """[log]: how often a training step's record goes into metrics.jsonl."""

    every: int = declared(1, at_least(1))


@dataclass(frozen=True)
class Stage:
    """One [[stages]] table: `steps` steps of one kind on rows drawn from `depths`."""

    name: str = declared("")
    kind: str = declared("chain", one_of(*STAGE_KINDS))
    steps: int = declared(100, within(1, MAX_STEPS))
    depths: list[int] = declared([1])
    depth_weights: list[float] = declared([])       # sampling weights over `depths`; empty = uniform
    chain_weight: float = declared(1.0)             # weight of intermediate loops t < d (the final loop has 1)
    chain_weight_end: float | None = declared(None)  # ramp chain_weight linearly to this over the stage
    park_depths: list[int] | None = declared(None)  # park stages: the depths that park (unset = all); the rest iterate

    def chain_weight_at(self, local: int) -> float:
        """The chain weight at step `local` of this stage (the linear ramp to `chain_weight_end`)."""
        end = self.chain_weight if self.chain_weight_end is None else self.chain_weight_end
        return self.chain_weight + (end - self.chain_weight) * local / max(self.steps - 1, 1)


@dataclass(frozen=True)
class Recipe:
    """A resolved training recipe: every table with every key (`Recipe.from_toml`, `Recipe.from_dict`)."""

    name: str = declared("run")
    seed: int = declared(0)
    init_from: str = declared("")                   # a finished run or keeper directory to continue from ("" = fresh)
    model: ModelTable = table(ModelTable)
    train: TrainTable = table(TrainTable)
    guardrail: GuardrailTable = table(GuardrailTable)
    preserve: PreserveTable = table(PreserveTable)
    lora: LoraTable = table(LoraTable)
    task: TaskTable = table(TaskTable)
    optim: OptimTable = table(OptimTable)
    sampler: SamplerTable = table(SamplerTable)
    halting: HaltingTable = table(HaltingTable)
    eval: EvalTable = table(EvalTable)
    checkpoint: CheckpointTable = table(CheckpointTable)
    log: LogTable = table(LogTable)
    stages: list[Stage] = field(default_factory=list)

    @classmethod
    def from_dict(cls, raw: dict) -> Recipe:
        """Returns the full recipe (every key, defaults filled in) after validating `raw`.

        Raises:
            WorkbenchError: an unknown key (naming it and the nearest known key), a wrong type,
                or a value outside what the trainer accepts.
        """
        raw = dict(raw)
        stages = raw.pop("stages", None)
        top = _build(cls, raw, "")
        if not isinstance(stages, list) or not stages:
            raise WorkbenchError("a recipe needs at least one [[stages]] table")
        built = []
        for i, stage in enumerate(stages):
            if not isinstance(stage, dict):
                raise WorkbenchError(f"recipe key 'stages.{i}' must be a table")
            built.append(_build(Stage, stage, f"stages.{i}."))
        recipe = cls(**{f.name: getattr(top, f.name) for f in fields(cls) if f.name != "stages"}, stages=built)
        finite(recipe.to_dict())
        check_keys(recipe)
        _validate(recipe)
        return recipe

    @classmethod
    def from_toml(cls, path: str | os.PathLike, overrides: list[str] | dict | None = None) -> Recipe:
        """Returns the resolved recipe of a TOML file with `--set` overrides applied.

        Raises:
            WorkbenchError: a missing file, bad TOML, or an invalid recipe.
        """
        return cls.from_dict(apply_overrides(read_toml(path, "recipe"), overrides))

    def to_dict(self) -> dict:
        """Every key in declaration order, as recipe.toml records it (a None value left out: TOML has no null)."""
        return plain(self)

    @property
    def kinds(self) -> set[str]:
        """The stage kinds this recipe trains."""
        return {s.kind for s in self.stages}

    def needed_loops(self) -> int:
        """The largest loop count any stage or evaluation runs."""
        loops = [max(self.eval.depths)]
        for s in self.stages:
            if s.kind in DENSE_KINDS:
                loops.append(1)
            elif s.kind == "chain":
                loops.append(max(s.depths))
            elif s.kind in ("sampled", "park"):
                loops.append(self.sampler.max)
            else:
                loops.append(self.halting.oracle_max)
        return max(loops)


# ------------------------------------------------------------------ reading and checking
@functools.cache
def known_keys() -> list[str]:
    """Every dotted key a recipe accepts (stage keys as `stages.N.key`)."""
    keys = []

    def walk(cls, prefix: str) -> None:
        for f in fields(cls):
            hint = type_hints(cls)[f.name]
            if f.name == "stages" and cls is Recipe:
                continue
            if is_dataclass(hint):
                walk(hint, f"{prefix}{f.name}.")
            else:
                keys.append(prefix + f.name)

    walk(Recipe, "")
    return keys + [f"stages.N.{f.name}" for f in fields(Stage)]


def _unknown(key: str) -> WorkbenchError:
    """The one-line error for an unknown recipe key: the nearest known key, and what the table it names holds."""
    generic = key
    parts = key.split(".")
    if len(parts) >= 3 and parts[0] == "stages" and parts[1].isdigit():
        generic = ".".join(["stages", "N", *parts[2:]])
    known = known_keys()
    near = difflib.get_close_matches(generic, known, n=1, cutoff=0.5)
    hint = ""
    if near:
        suggestion = near[0].replace("stages.N.", f"stages.{parts[1]}.") if generic != key else near[0]
        hint = f"; did you mean '{suggestion}'?"
    table = generic.rsplit(".", 1)[0] + "." if "." in generic else ""
    inside = [k[len(table):] for k in known if table and k.startswith(table) and "." not in k[len(table):]]
    if inside:
        listing = f"[{table[:-1]}] accepts: {', '.join(inside)}"
    else:
        tops = sorted({k.split(".")[0] for k in known if "." in k} - {"stages"}) + ["stages"]
        listing = (f"top-level keys: {', '.join(k for k in known if '.' not in k)}; tables: {', '.join(tops)}")
    return WorkbenchError(f"unknown recipe key {key!r}{hint} ({listing})")


def _build(cls, given: dict, prefix: str):
    """An instance of the table `cls` from the keys a recipe gives (the rest at their defaults)."""
    values = {}
    for name, value in given.items():
        full = prefix + name
        hint = type_hints(cls).get(name)
        if hint is None:
            raise _unknown(full)
        if is_dataclass(hint):
            if not isinstance(value, dict):
                raise WorkbenchError(f"recipe key '{full}' must be a table, got {value!r}")
            values[name] = _build(hint, value, full + ".")
        else:
            values[name] = typed(full, value, hint)
    return cls(**values)


def _validate(r: Recipe) -> None:
    """The checks that read more than one key."""
    _check_task(r)
    if r.lora.enabled and r.train.block:
        raise WorkbenchError("lora.enabled = true with train.block = true: the LoRA budget keeps the block's "
                             "base weights frozen; set train.block = false")
    max_loops = r.model.max_loops
    # No alphabet bounds a state-tracking or arithmetic depth.
    alphabet = None if r.task.name in ANSWER_TASKS + ("state_query",) else r.task.alphabet
    for i, s in enumerate(r.stages):
        _check_depths(f"stages.{i}.depths", s.depths, alphabet, max_loops)
        w = s.depth_weights
        if w and (len(w) != len(s.depths) or min(w) < 0 or sum(w) <= 0):
            raise WorkbenchError(f"recipe key 'stages.{i}.depth_weights' = {w} needs one weight >= 0 per depth "
                                 f"({len(s.depths)}) with a positive sum")
        if s.kind == "halting" and not r.model.halting:
            raise WorkbenchError(f"stage {i} is a halting stage but model.halting = false")
    _check_depths("eval.depths", r.eval.depths, alphabet, max_loops)
    kinds = r.kinds
    if kinds & set(DENSE_KINDS) and len(kinds) > 1:
        raise WorkbenchError(f"stages mix {', '.join(sorted(kinds))}: a dense control (direct or scratchpad) is an arm "
                             "of its own, every stage of its recipe has that kind")
    for i, s in enumerate(r.stages):
        if s.park_depths is not None and not s.park_depths:
            raise WorkbenchError(f"recipe key 'stages.{i}.park_depths' = [] parks no depth; name at least one or "
                                 "leave the key out (every depth parks)")
        if s.park_depths and s.kind != "park":
            raise WorkbenchError(f"recipe key 'stages.{i}.park_depths' belongs to a park stage; stage {i} is "
                                 f"{s.kind!r}")
        if s.park_depths and not set(s.park_depths) <= set(s.depths):
            raise WorkbenchError(f"recipe key 'stages.{i}.park_depths' = {s.park_depths} names depths the stage "
                                 f"does not train (its depths: {s.depths})")
        if s.kind == "park" and not max(s.depths) <= r.sampler.max <= max_loops:
            raise WorkbenchError(f"recipe key 'sampler.max' = {r.sampler.max} must lie in "
                                 f"{max(s.depths)}..model.max_loops = {max_loops} (stage {i} parks on the answer "
                                 "from its deepest row's depth up to sampler.max loops)")
    probe = r.halting.probe_depths
    # Loop counts past oracle_max are not read (losses.halting_loss), so the default [1, 2, 4, 6] suits a short
    # sweep; a list with none inside 1..oracle_max would read nothing and train to a NaN.
    if "halting" in kinds and not (probe and all(isinstance(t, int) and t >= 1 for t in probe)
                                   and any(t <= r.halting.oracle_max for t in probe)):
        raise WorkbenchError(f"recipe key 'halting.probe_depths' = {probe} must be loop counts >= 1, at least one "
                             f"in 1..halting.oracle_max = {r.halting.oracle_max}")
    for name, value, kind in (("sampler.max", r.sampler.max, "sampled"),
                              ("halting.oracle_max", r.halting.oracle_max, "halting")):
        if kind in kinds and not 1 <= value <= max_loops:
            raise WorkbenchError(f"recipe key '{name}' = {value} must lie in 1..model.max_loops = {max_loops}")


def _check_depths(key: str, depths: list, alphabet: int | None, max_loops: int) -> None:
    if alphabet is None:  # RecurTrace's answer tasks: a depth is a number of rules, any number of loops reads it
        if not depths or not all(isinstance(d, int) and d >= 1 for d in depths):
            raise WorkbenchError(f"recipe key '{key}' = {depths} must be depths >= 1")
        return
    if not depths or not all(isinstance(d, int) and 1 <= d < alphabet and d <= max_loops for d in depths):
        raise WorkbenchError(f"recipe key '{key}' = {depths} must be depths in 1..{min(alphabet - 1, max_loops)} "
                             "(below the alphabet, within model.max_loops)")


def _check_task(r: Recipe) -> None:
    """Chase-only options left at their defaults for the RecurTrace tasks; only sampled and halting stages
    train multi-token answers (chain and the dense controls grade single-token symbols)."""
    t, chase = r.task, TaskTable()
    if t.name != "chase" and (t.surface, t.symbol_set, t.permutation) != (chase.surface, chase.symbol_set,
                                                                           chase.permutation):
        raise WorkbenchError(f"task.name = '{t.name}' takes no task.surface, task.symbol_set or task.permutation "
                             "(chase options); leave them at their defaults")
    if t.name == "phop" and not 2 <= t.alphabet <= 32:
        raise WorkbenchError(f"recipe key 'task.alphabet' = {t.alphabet} is out of range for phop; accepted: 2..32")
    for i, s in enumerate(r.stages):
        if t.name in ANSWER_TASKS and s.kind not in ("sampled", "halting"):  # park grades symbols too
            raise WorkbenchError(f"stage {i} is a {s.kind} stage, which grades single-token symbols; "
                                 f"task '{t.name}' answers in several tokens: use kind 'sampled'")
        if t.name != "chase" and s.kind in DENSE_KINDS:
            raise WorkbenchError(f"stage {i} is a {s.kind} stage, a dense control of the chase; "
                                 f"task '{t.name}' trains with kind 'sampled' or 'chain'")


# ------------------------------------------------------------------ --set overrides and the recorded text

def parse_override(item: str) -> tuple[str, object]:
    """Returns (dotted key, value) from "key=value"; the value is read as TOML, else as a string."""
    if "=" not in item:
        raise WorkbenchError(f"--set {item!r} is not of the form key=value (e.g. optim.lr=3e-4)")
    key, text = (s.strip() for s in item.split("=", 1))
    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        value = text
    return key, value


def apply_overrides(raw: dict, overrides: list[str] | dict | None) -> dict:
    """Returns a copy of the raw recipe with `--set key=value` items applied (before validation)."""
    raw = copy.deepcopy(raw)
    items = overrides.items() if isinstance(overrides, dict) else map(parse_override, overrides or [])
    for key, value in items:
        parts = key.split(".")
        node = raw
        for j, part in enumerate(parts[:-1]):
            if isinstance(node, list):
                if not part.isdigit() or int(part) >= len(node):
                    raise WorkbenchError(f"--set {key!r}: stage index {part!r} is outside 0..{len(node) - 1}")
                node = node[int(part)]
            else:
                if part not in type_hints(Recipe) and node is raw:
                    raise _unknown(key)
                node = node.setdefault(part, [] if part == "stages" else {})
                if not isinstance(node, (dict, list)):
                    raise WorkbenchError(f"--set {key!r}: '{'.'.join(parts[:j + 1])}' is a value, not a table; "
                                         "set it directly (e.g. --set stages.0.steps=50)")
        if isinstance(node, list):
            raise WorkbenchError(f"--set {key!r} must name a key inside a stage, e.g. stages.0.steps")
        node[parts[-1]] = value
    return raw


def dumps(recipe: Recipe) -> str:
    """Returns the resolved recipe as TOML text: what the run directory's recipe.toml records."""
    return tomli_w.dumps(recipe.to_dict())
