"""Training recipes: one TOML file each, read into the typed `Recipe`, with `--set` overrides.

A recipe is the whole record of a run (docs/architecture.md, run directories): every key is declared once here, in
the table it sits in, with its one default and the values it accepts (its type and bounds, or its names: a pydantic
field, `workbench.train.schema`); every key a user writes must be one of them (a misspelled option is an error naming
it and the nearest known key, never silently ignored), every value is checked when the recipe is read, before anything
loads, and the resolved recipe, overrides included, is written back into the run directory as `recipe.toml`
(`Recipe.to_dict`). [model] and [lora] declare RetrofitConfig's and LoraSettings' own fields under their names and
defaults (`MIRRORED`); a default shared with code that imports torch (the guardrail's max_drop, the oracle's margin)
is read from `workbench.defaults`.

    recipe = Recipe.from_toml("training/smollm2_lora_chase.toml", ["optim.lr=3e-4"])
    recipe.optim.lr, recipe.stages[0].kind, recipe.to_dict() == tomllib.loads(dumps(recipe))
Stages run in order. Each is one of the registered stage kinds (`workbench.train.kinds`: one module each under
`workbench/train/stages/`, whose record also holds the kind's own cross-key checks, run here):
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
  - `halting`: the halting stage (RecurTrace's Stage 2, App. E): everything frozen but the halting head, which is
    distilled from the loss-improvement oracle (or trained with the ACT / PonderNet objective).
    `[halting] sweep = N` computes the oracle sweep of N training rows (their per-loop oracle losses and the
    head's pooled inputs) once (App. E's offline sweep) and trains the head on it; 0 runs the frozen model every
    step. A halting-only recipe may `init_from` a parent trained without a head: the head is added fresh;
  - `direct`, `scratchpad`: the dense controls (`workbench.train.dense`), loop 1 only, each an arm of its own.
"""

from __future__ import annotations

import copy
import difflib
import functools
import os
from dataclasses import fields
from typing import Annotated, Literal

import tomli_w
import tomllib
from pydantic import Field, TypeAdapter, ValidationError

from workbench.defaults import (
    CHASE_SURFACES,
    EMBEDDED_DEFAULT,
    MAX_DROP_POINTS,
    ORACLE_DEPTH_COST,
    ORACLE_MARGIN,
    REHEARSAL_SOURCES,
    SYMBOL_SET_NAMES,
    TASK_NAMES,
)
from workbench.errors import WorkbenchError
from workbench.loop.config import HALTING_POOLING, MAX_LOOPS, REENTRIES, LoraSettings, RetrofitConfig
from workbench.readers import read_toml
from workbench.train import kinds as stage_kinds
from workbench.train.schema import (
    Count,
    Flag,
    Number,
    OneOf,
    Real,
    Registered,
    Text,
    default,
    is_table,
    items,
    keys_of,
    refusal,
    table,
)

ANSWER_TASKS = ("state", "arith")  # multi-token answers, read exactly (`workbench.tasks.reader.read_answers`)
OPTIMIZERS = ("adamw", "sgd")
SCHEDULES = ("constant", "cosine", "linear")
HALTING_OBJECTIVES = ("oracle", "act", "pondernet")
MAX_STEPS = 10 ** 8
SEED = Count(0, 2 ** 63 - 1)   # torch.manual_seed's range that is not negative
# A free string: a name, a label, a path or a model name, each read where it is used (the base by the model loader,
# init_from by the run reader), so the schema checks only that it is text.
Label = Text
# "A:B", or "auto" (workbench.selection.stage1.resolve_block); the base's depth bounds A and B when it loads
BLOCK = Annotated[Text, Field(pattern=r"^(auto|\s*-?\d+\s*:\s*-?\d+\s*)$", description="A:B (e.g. 10:16) or auto")]

# ------------------------------------------------------------------ the tables mirrored from the retrofit's own
# [model] and [lora] declare RetrofitConfig's and LoraSettings' fields under their names, at their defaults, and reach
# the retrofit through `workbench.train.build.retrofit_config` by name; tests/training/test_recipes.py holds every
# field of the two dataclasses to a key here (same name, type and default) or to an entry below saying where it
# comes from instead. max_loops is the one default the recipe states itself: 8, not RetrofitConfig's 16, since every
# committed run was trained and recorded at 8 (its recipe.toml and retrofit.json), while a retrofit built in Python
# keeps the documented 16 (docs/api.md).
MIRRORED = {
    # table: (the dataclass it mirrors, {each of its fields the recipe does not take by name: where it comes from})
    "model": (RetrofitConfig, {"block": "model.block, a string, 'A:B' or 'auto' (resolved by the trainer: "
                                        "workbench.selection.stage1.resolve_block)",
                               "lora": "the [lora] table: LoraSettings when lora.enabled, else None"}),
    "lora": (LoraSettings, {"targets": "not a recipe key: an adapter always takes LoraSettings' targets"}),
}
RECIPE_MAX_LOOPS = 8


def mirrored_keys(name: str) -> tuple[str, ...]:
    """The fields of the dataclass that the table `name` mirrors which the recipe declares under the same name."""
    source, otherwise = MIRRORED[name]
    return tuple(f.name for f in fields(source) if f.name not in otherwise)


# ------------------------------------------------------------------ the tables
@table
class ModelTable:
    """[model]: the base and the retrofit made of it (`workbench.train.build.retrofit_config`): RetrofitConfig's
    fields but block and lora (`MIRRORED`), the base and the attention implementation."""

    base: Label = EMBEDDED_DEFAULT
    block: BLOCK = "10:16"
    reentry: OneOf(REENTRIES) = RetrofitConfig.reentry
    memory: Flag = RetrofitConfig.memory
    memory_window: Count(1, MAX_LOOPS) = RetrofitConfig.memory_window
    memory_heads: Count(1, 64) = RetrofitConfig.memory_heads
    halting: Flag = RetrofitConfig.halting
    halting_pooling: OneOf(HALTING_POOLING) = RetrofitConfig.halting_pooling
    loop_codes: Flag = RetrofitConfig.loop_codes
    max_loops: Count(1, MAX_LOOPS) = RECIPE_MAX_LOOPS
    attn: Literal["eager", "sdpa"] = "eager"        # the attention implementations a run records (`workbench.runs`)


@table
class TrainTable:
    """[train]: what trains and how it is computed."""

    block: Flag = True                              # full-block budget: the looped block's own weights train
    precision: Literal["fp32", "bf16"] = "fp32"     # bf16: frozen weights bf16, trainables fp32
    compile: Flag = False                           # torch.compile every decoder layer; off: 0.86x on a whole run (docs/gpu.md)


@table
class GuardrailTable:
    """[guardrail]: the capability guardrail at loop 1 (workbench.tasks.guardrail)."""

    enabled: Flag = True                            # scored before training and at every evaluation
    max_drop: Real(0.0) = MAX_DROP_POINTS           # points below the base that stop the run (paper Sec. 4.3)
    every: Count(0) = 0                             # also score every N steps (0: only at evaluations)


@table
class PreserveTable:
    """[preserve]: KL(base || model) at loop 1 on rehearsal text (workbench.tasks.rehearsal)."""

    kl_weight: Real(0.0) = 0.0                      # 0 = off
    rows: Count(1) = 8                              # rehearsal texts per step
    positions: Count(1) = 8                         # positions read per text
    sources: list[OneOf(REHEARSAL_SOURCES)] = items(REHEARSAL_SOURCES)


@table
class LoraTable:
    """[lora]: one adapter on the block's projections (`LoraSettings`: its fields but targets), when enabled."""

    enabled: Flag = False
    r: Count(1, 4096) = LoraSettings.r
    alpha: Count(1, 10 ** 6) = LoraSettings.alpha
    dropout: Real(0.0, 0.999) = LoraSettings.dropout


@table
class TaskTable:
    """[task]: the generator of training and held-out rows (`workbench.tasks`)."""

    name: OneOf(TASK_NAMES) = "chase"
    alphabet: Count(2, 64) = 8
    symbol_set: OneOf(SYMBOL_SET_NAMES) = "letters"
    surface: OneOf(CHASE_SURFACES) = "symbolic"
    permutation: Flag = False


@table
class OptimTable:
    """[optim]: the main optimizer (`workbench.train.optim.make_optimizer`) and its schedule."""

    name: OneOf(OPTIMIZERS) = "adamw"
    lr: Real(above=0.0) = 1e-4
    prelude_lr_mult: Real(above=0.0, high=1e6) = 10.0      # W_p's own group (retrofit paper Sec. 5.1)
    loop_codes_lr_mult: Real(above=0.0, high=1e6) = 10.0   # the loop codes' own group
    weight_decay: Real(0.0, 1e3) = 0.0
    betas: Annotated[list[Number(0.0, below=1.0)], Field(min_length=2, max_length=2)] = items([0.9, 0.999])
    eps: Real(above=0.0, high=1.0) = 1e-8
    momentum: Real(0.0, 1.0) = 0.9                 # sgd only
    grad_clip: Real(0.0, 1e9) = 1.0
    warmup_steps: Count(0, 10 ** 9) = 0
    schedule: OneOf(SCHEDULES) = "constant"
    batch_size: Count(1, 65536) = 8


@table
class SamplerTable:
    """[sampler]: the loop counts of sampled stages (clamped log-normal Poisson) and park's deepest count."""

    mean: Real(1.0, MAX_LOOPS) = 4.0
    sigma: Real(0.0, 10.0) = 0.5
    max: Count(1, MAX_LOOPS) = 8


@table
class HaltingTable:
    """[halting]: the halting stage: the head's objective, its own optimizer and the oracle sweep's size
    (`workbench.train.stages.halting`)."""

    objective: OneOf(HALTING_OBJECTIVES) = "oracle"
    probe_depths: list[Count(1, MAX_LOOPS)] = items([1, 2, 4, 6])
    margin: Real(0.0) = ORACLE_MARGIN               # a loss gain: a deeper loop continues past L_t - margin
    depth_cost: Real(0.0) = ORACLE_DEPTH_COST
    oracle_max: Count(1, MAX_LOOPS) = 8
    lr: Real(above=0.0, high=1e3) = 3e-4
    warmup_steps: Count(0, 10 ** 9) = 10
    act_cost: Real(0.0) = 0.01
    ponder_lambda: Real(above=0.0, below=1.0) = 0.2   # the geometric prior's rate: at 1 its log is -inf past loop 1
    ponder_kl: Real(0.0) = 0.01
    sweep: Count(0, 10 ** 7) = 0


@table
class EvalTable:
    """[eval]: the held-out rows and how often they are read."""

    every: Count(1) = 100
    per_depth: Count(1, 10 ** 6) = 64
    depths: list[Count(1)] = items([1, 2, 3, 4])
    seed: SEED = 1
    batch_size: Count(1, 65536) = 16


@table
class CheckpointTable:
    """[checkpoint]: how often a resumable checkpoint is written, and how many are kept."""

    every: Count(1) = 100
    keep: Count(1) = 2


@table
class LogTable:
    """[log]: how often a training step's record goes into metrics.jsonl."""

    every: Count(1) = 1


@table
class Stage:
    """One [[stages]] table: `steps` steps of one kind on rows drawn from `depths`."""

    name: Label = ""
    kind: Registered(stage_kinds.names) = "chain"   # a registered stage kind (`workbench.train.kinds`)
    steps: Count(1, MAX_STEPS) = 100
    depths: list[Count(1)] = items([1])
    depth_weights: list[Number(0.0)] = items([])     # sampling weights over `depths`; empty = uniform
    chain_weight: Real(0.0) = 1.0                   # weight of intermediate loops t < d (the final loop has 1)
    chain_weight_end: Real(0.0) | None = None       # ramp chain_weight linearly to this over the stage
    park_depths: list[Count(1)] | None = None       # park stages: the depths that park (unset = all); the rest iterate

    def chain_weight_at(self, local: int) -> float:
        """The chain weight at step `local` of this stage (the linear ramp to `chain_weight_end`)."""
        end = self.chain_weight if self.chain_weight_end is None else self.chain_weight_end
        return self.chain_weight + (end - self.chain_weight) * local / max(self.steps - 1, 1)


@table
class Recipe:
    """A resolved training recipe: every table with every key (`Recipe.from_toml`, `Recipe.from_dict`)."""

    name: Label = "run"
    seed: SEED = 0
    init_from: Label = ""                           # a finished run or keeper directory to continue from ("" = fresh)
    model: ModelTable = default(ModelTable)
    train: TrainTable = default(TrainTable)
    guardrail: GuardrailTable = default(GuardrailTable)
    preserve: PreserveTable = default(PreserveTable)
    lora: LoraTable = default(LoraTable)
    task: TaskTable = default(TaskTable)
    optim: OptimTable = default(OptimTable)
    sampler: SamplerTable = default(SamplerTable)
    halting: HaltingTable = default(HaltingTable)
    eval: EvalTable = default(EvalTable)
    checkpoint: CheckpointTable = default(CheckpointTable)
    log: LogTable = default(LogTable)
    stages: list[Stage] = items([])

    @classmethod
    def from_dict(cls, raw: dict) -> Recipe:
        """Returns the full recipe (every key, defaults filled in) after validating `raw`.

        Raises:
            WorkbenchError: an unknown key (naming it and the nearest known key), a wrong type,
                or a value outside what the trainer accepts.
        """
        stages = raw.get("stages")
        given = {**raw, "stages": stages if isinstance(stages, list) else []}
        try:
            recipe = _SCHEMA.validate_python(given)
        except ValidationError as err:
            raise refusal(err, cls, given, _unknown) from None
        if not recipe.stages:
            raise WorkbenchError("a recipe needs at least one [[stages]] table")
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
        return _SCHEMA.dump_python(self, exclude_none=True)

    @property
    def kinds(self) -> set[str]:
        """The stage kinds this recipe trains."""
        return {s.kind for s in self.stages}

    def needed_loops(self) -> int:
        """The largest loop count any stage or evaluation runs."""
        return max([max(self.eval.depths), *(stage_kinds.stage_kind(s.kind).loops(self, s) for s in self.stages)])


_SCHEMA = TypeAdapter(Recipe)


# ------------------------------------------------------------------ reading and checking
@functools.cache
def known_keys() -> list[str]:
    """Every dotted key a recipe accepts (stage keys as `stages.N.key`)."""
    def walk(cls, prefix: str) -> list[str]:
        keys = []
        for name in keys_of(cls):
            hint = cls.__pydantic_fields__[name].annotation
            keys += walk(hint, f"{prefix}{name}.") if is_table(hint) else [] if hint == list[Stage] else [prefix + name]
        return keys

    return walk(Recipe, "") + [f"stages.N.{name}" for name in keys_of(Stage)]


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


def _validate(r: Recipe) -> None:
    """The checks that read more than one key: the recipe's own, then each stage kind's (`StageKind.check`)."""
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
    _check_depths("eval.depths", r.eval.depths, alphabet, max_loops)
    registered = stage_kinds.kinds()
    arm = next((registered[k].arm for k in sorted(r.kinds) if registered[k].arm), "")
    if arm and len(r.kinds) > 1:
        every = " or ".join(k.name for k in registered.values() if k.arm == arm)
        raise WorkbenchError(f"stages mix {', '.join(sorted(r.kinds))}: a {arm} ({every}) is an arm "
                             "of its own, every stage of its recipe has that kind")
    for i, s in enumerate(r.stages):
        for key in (k for other in registered.values() for k in other.stage_keys):
            if getattr(s, key) is not None and key not in registered[s.kind].stage_keys:
                owners = " or ".join(k.name for k in registered.values() if key in k.stage_keys)
                raise WorkbenchError(f"recipe key 'stages.{i}.{key}' belongs to a {owners} stage; stage {i} is "
                                     f"{s.kind!r}")
        registered[s.kind].check(r, i)


def _check_depths(key: str, depths: list, alphabet: int | None, max_loops: int) -> None:
    if alphabet is None:  # RecurTrace's answer tasks: a depth is a number of rules, any number of loops reads it
        if not depths or not all(isinstance(d, int) and d >= 1 for d in depths):
            raise WorkbenchError(f"recipe key '{key}' = {depths} must be depths >= 1")
        return
    if not depths or not all(isinstance(d, int) and 1 <= d < alphabet and d <= max_loops for d in depths):
        raise WorkbenchError(f"recipe key '{key}' = {depths} must be depths in 1..{min(alphabet - 1, max_loops)} "
                             "(below the alphabet, within model.max_loops)")


def _check_task(r: Recipe) -> None:
    """Chase-only options left at their defaults for the RecurTrace tasks; only the kinds that train multi-token
    answers (`StageKind.answers`: sampled, halting) take a task that answers in several tokens."""
    t, chase = r.task, TaskTable()
    if t.name != "chase" and (t.surface, t.symbol_set, t.permutation) != (chase.surface, chase.symbol_set,
                                                                           chase.permutation):
        raise WorkbenchError(f"task.name = '{t.name}' takes no task.surface, task.symbol_set or task.permutation "
                             "(chase options); leave them at their defaults")
    if t.name == "phop" and not 2 <= t.alphabet <= 32:
        raise WorkbenchError(f"recipe key 'task.alphabet' = {t.alphabet} is out of range for phop; accepted: 2..32")
    for i, s in enumerate(r.stages):
        if t.name in ANSWER_TASKS and not stage_kinds.stage_kind(s.kind).answers:  # park grades symbols too
            raise WorkbenchError(f"stage {i} is a {s.kind} stage, which grades single-token symbols; "
                                 f"task '{t.name}' answers in several tokens: use kind 'sampled'")


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
                if part not in keys_of(Recipe) and node is raw:
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
