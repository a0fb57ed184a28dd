"""Training recipes: one TOML file each, validated against a fixed schema, with `--set` overrides.

A recipe is the whole record of a run (docs/architecture.md, run directories): every key has a default here, every key a
user writes must be one of them (a misspelled option is an error naming it and the nearest
known key, never silently ignored), and the resolved recipe, overrides included, is written
back into the run directory as `recipe.toml`.

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
  - `halting`: RecurTrace Stage 2 (App. E): everything frozen but the halting head, which is
    distilled from the loss-improvement oracle (or trained with the ACT / PonderNet objective).
    `[halting] sweep = N` computes the oracle losses and the head's pooled inputs of N training rows
    once (App. E's offline sweep) and trains the head on that cache; 0 runs the frozen model every step.
    A halting-only recipe may `init_from` a parent trained without a head: the head is added fresh.
"""

from __future__ import annotations

import copy
import difflib
import math
import os

import tomli_w
import tomllib

from workbench.defaults import EMBEDDED_DEFAULT
from workbench.errors import WorkbenchError
from workbench.io import read_toml
from workbench.loop.config import MAX_LOOPS

STAGE_KINDS = ("chain", "sampled", "park", "halting", "direct", "scratchpad")
DENSE_KINDS = ("direct", "scratchpad")  # the dense controls (workbench.dense): loop 1 only
ANSWER_TASKS = ("state", "arith")  # multi-token answers, read exactly (`workbench.tasks.reader.read_answers`)
OPTIMIZERS = ("adamw", "sgd")
SCHEDULES = ("constant", "cosine", "linear")
HALTING_OBJECTIVES = ("oracle", "act", "pondernet")

# Every key a recipe may hold, with its default. The type of the default is the accepted type
# (an int is accepted where a float is the default). `None` marks an optional float.
SCHEMA: dict = {
    "name": "run",
    "seed": 0,
    "init_from": "",                 # a finished run or keeper directory to continue from ("" = fresh)
    "model": {
        "base": EMBEDDED_DEFAULT,
        "block": "10:16",            # "A:B", or "auto" (workbench.block_selection.resolve_block)
        "reentry": "bridge",         # "bridge" | "inject"
        "memory": False,
        "memory_window": 3,
        "memory_heads": 4,
        "halting": False,
        "halting_pooling": "mean",
        "max_loops": 8,
        "attn": "eager",
    },
    "train": {"block": True,         # full-block budget: the looped block's own weights train
              "precision": "fp32",   # "fp32" | "bf16" (frozen weights bf16, trainables fp32; workbench.precision)
              "compile": False},     # torch.compile every decoder layer (benchmarks/precision.py --compile)
    "guardrail": {                   # the capability guardrail at loop 1 (workbench.tasks.guardrail)
        "enabled": True,             # scored before training and at every evaluation
        "max_drop": 3.0,             # points below the base that stop the run (retrofit paper Sec. 4.3)
        "every": 0,                  # also score every N steps (0: only at evaluations)
    },
    "preserve": {                    # KL(base || model) at loop 1 on rehearsal text (workbench.tasks.rehearsal)
        "kl_weight": 0.0,            # 0 = off
        "rows": 8,                   # rehearsal texts per step
        "positions": 8,              # positions read per text
        "sources": ["corpus", "patterns", "numbers"],
    },
    "lora": {"enabled": False, "r": 16, "alpha": 32, "dropout": 0.0},
    "task": {"name": "chase", "alphabet": 8, "symbol_set": "letters", "surface": "symbolic",
             "permutation": False},
    "optim": {
        "name": "adamw",
        "lr": 1e-4,
        "prelude_lr_mult": 10.0,     # the bridge's W_p in its own group (retrofit paper Sec. 5.1)
        "weight_decay": 0.0,
        "betas": [0.9, 0.999],
        "eps": 1e-8,
        "momentum": 0.9,             # sgd only
        "grad_clip": 1.0,
        "warmup_steps": 0,
        "schedule": "constant",
        "batch_size": 8,
    },
    "sampler": {"mean": 4.0, "sigma": 0.5, "max": 8},
    "halting": {
        "objective": "oracle",
        "probe_depths": [1, 2, 4, 6],
        "margin": 0.01,
        "depth_cost": 0.0,
        "oracle_max": 8,
        "lr": 3e-4,
        "warmup_steps": 10,
        "act_cost": 0.01,
        "ponder_lambda": 0.2,
        "ponder_kl": 0.01,
        "sweep": 0,
    },
    "eval": {"every": 100, "per_depth": 64, "depths": [1, 2, 3, 4], "seed": 1, "batch_size": 16},
    "checkpoint": {"every": 100, "keep": 2},
    "log": {"every": 1},
}
STAGE_SCHEMA: dict = {
    "name": "",
    "kind": "chain",
    "steps": 100,
    "depths": [1],
    "depth_weights": [],             # sampling weights over `depths`; empty = uniform
    "chain_weight": 1.0,             # weight of intermediate loops t < d (the final loop has 1)
    "chain_weight_end": None,        # ramp chain_weight linearly to this over the stage
}


def known_keys() -> list[str]:
    """Every dotted key a recipe accepts (stage keys as `stages.N.key`)."""
    keys = []

    def walk(node: dict, prefix: str) -> None:
        for k, v in node.items():
            if isinstance(v, dict):
                walk(v, f"{prefix}{k}.")
            else:
                keys.append(prefix + k)

    walk(SCHEMA, "")
    keys += [f"stages.N.{k}" for k in STAGE_SCHEMA]
    return keys


def _unknown(key: str) -> WorkbenchError:
    generic = key
    parts = key.split(".")
    if len(parts) >= 3 and parts[0] == "stages" and parts[1].isdigit():
        generic = ".".join(["stages", "N", *parts[2:]])
    near = difflib.get_close_matches(generic, known_keys(), n=1, cutoff=0.5)
    hint = ""
    if near:
        suggestion = near[0].replace("stages.N.", f"stages.{parts[1]}.") if generic != key else near[0]
        hint = f"; did you mean '{suggestion}'?"
    return WorkbenchError(f"unknown recipe key {key!r}{hint} (known keys: see workbench.train.recipe.SCHEMA)")


NUMBER_LISTS = ("depths", "depth_weights", "betas", "probe_depths")  # list keys whose items are numbers


def _check_type(key: str, value, default):
    if default is None:
        if value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)):
            return None if value is None else float(value)
        raise WorkbenchError(f"recipe key '{key}' = {value!r} must be a number")
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, float):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif isinstance(default, int):
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif isinstance(default, list):
        ok = isinstance(value, list)
        numbers = key.rsplit(".", 1)[-1] in NUMBER_LISTS
        kind = (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)) if numbers else \
            (lambda v: isinstance(v, type(default[0]))) if default else (lambda v: True)
        if ok and not all(kind(v) for v in value):
            raise WorkbenchError(f"recipe key '{key}' = {value!r} must be a list of "
                                 f"{'numbers' if numbers else type(default[0]).__name__ + 's'}")
    else:
        ok = isinstance(value, str)
    if not ok:
        raise WorkbenchError(f"recipe key '{key}' = {value!r} must be of type {type(default).__name__}")
    return value


def _merge(schema: dict, given: dict, prefix: str = "") -> dict:
    out = copy.deepcopy(schema)
    for key, value in given.items():
        full = prefix + key
        if key not in schema:
            raise _unknown(full)
        if isinstance(schema[key], dict):
            if not isinstance(value, dict):
                raise WorkbenchError(f"recipe key '{full}' must be a table, got {value!r}")
            out[key] = _merge(schema[key], value, full + ".")
        else:
            out[key] = _check_type(full, value, schema[key])
    return out


def resolve(raw: dict) -> dict:
    """Returns the full recipe (every key, defaults filled in) after validating `raw`.

    Raises:
        WorkbenchError: an unknown key (naming it and the nearest known key), a wrong type,
            or a value outside what the trainer accepts.
    """
    raw = dict(raw)
    stages = raw.pop("stages", None)
    recipe = _merge(SCHEMA, raw)
    if not isinstance(stages, list) or not stages:
        raise WorkbenchError("a recipe needs at least one [[stages]] table")
    recipe["stages"] = []
    for i, stage in enumerate(stages):
        if not isinstance(stage, dict):
            raise WorkbenchError(f"recipe key 'stages.{i}' must be a table")
        recipe["stages"].append(_merge(STAGE_SCHEMA, stage, f"stages.{i}."))
    _validate(recipe)
    return recipe


def _choice(key: str, value: str, accepted: tuple) -> None:
    if value not in accepted:
        raise WorkbenchError(f"recipe key '{key}' = '{value}' is not accepted; accepted: {', '.join(accepted)}")


# key: (lowest, highest, whether `lowest` itself is accepted); every float anywhere must be finite.
RANGES = {
    "model.max_loops": (1, MAX_LOOPS, True), "model.memory_window": (1, MAX_LOOPS, True),
    "model.memory_heads": (1, 64, True), "task.alphabet": (2, 64, True),
    "optim.prelude_lr_mult": (0.0, 1e6, False), "optim.weight_decay": (0.0, 1e3, True),
    "optim.eps": (0.0, 1.0, False), "optim.momentum": (0.0, 1.0, True), "optim.grad_clip": (0.0, 1e9, True),
    "optim.warmup_steps": (0, 10 ** 9, True), "halting.lr": (0.0, 1e3, False),
    "halting.warmup_steps": (0, 10 ** 9, True), "halting.sweep": (0, 10 ** 7, True),
    "lora.r": (1, 4096, True), "lora.alpha": (0.0, 1e6, False), "lora.dropout": (0.0, 0.999, True),
    "sampler.mean": (1.0, MAX_LOOPS, True), "sampler.sigma": (0.0, 10.0, True),
    "optim.batch_size": (1, 65536, True), "eval.batch_size": (1, 65536, True), "eval.per_depth": (1, 10 ** 6, True),
}
MAX_STEPS = 10 ** 8


def _finite(node, key: str = "") -> None:
    if isinstance(node, dict):
        for k, v in node.items():
            _finite(v, f"{key}.{k}" if key else k)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            _finite(v, f"{key}.{i}")
    elif isinstance(node, float) and not math.isfinite(node):
        raise WorkbenchError(f"recipe key '{key}' = {node} must be a finite number")


def _in_ranges(r: dict) -> None:
    for key, (low, high, low_ok) in RANGES.items():
        section, name = key.split(".")
        value = r[section][name]
        if not (low <= value <= high) or (value == low and not low_ok):
            raise WorkbenchError(f"recipe key '{key}' = {value} must lie in {'[' if low_ok else '('}{low}, {high}]")
    betas = r["optim"]["betas"]
    if len(betas) != 2 or not all(isinstance(b, (int, float)) and 0 <= b < 1 for b in betas):
        raise WorkbenchError(f"recipe key 'optim.betas' = {betas} must be two numbers in [0, 1)")


def _validate(r: dict) -> None:
    _finite(r)
    _in_ranges(r)
    _choice("model.reentry", r["model"]["reentry"], ("bridge", "inject"))
    from workbench.tasks import TASKS  # the generators import torch: only when a recipe is validated

    _choice("task.name", r["task"]["name"], TASKS)
    _check_task(r)
    _choice("optim.name", r["optim"]["name"], OPTIMIZERS)
    _choice("optim.schedule", r["optim"]["schedule"], SCHEDULES)
    _choice("halting.objective", r["halting"]["objective"], HALTING_OBJECTIVES)
    _choice("train.precision", r["train"]["precision"], ("fp32", "bf16"))
    for src in r["preserve"]["sources"]:
        _choice("preserve.sources", src, ("corpus", "patterns", "numbers"))
    for key, low in (("guardrail.max_drop", 0.0), ("preserve.kl_weight", 0.0), ("optim.lr", 0.0)):
        section, name = key.split(".")
        value = r[section][name]
        if not math.isfinite(value) or value < low or (key == "optim.lr" and value == 0):
            raise WorkbenchError(f"recipe key '{key}' = {value} must be a finite number "
                                 f"{'> 0' if key == 'optim.lr' else '>= 0'}")
    for key in ("preserve.rows", "preserve.positions"):
        section, name = key.split(".")
        if r[section][name] < 1:
            raise WorkbenchError(f"recipe key '{key}' = {r[section][name]} must be >= 1")
    if r["guardrail"]["every"] < 0:
        raise WorkbenchError(f"recipe key 'guardrail.every' = {r['guardrail']['every']} must be >= 0")
    if r["lora"]["enabled"] and r["train"]["block"]:
        raise WorkbenchError("lora.enabled = true with train.block = true: the LoRA budget keeps the block's "
                             "base weights frozen; set train.block = false")
    alphabet, max_loops = r["task"]["alphabet"], r["model"]["max_loops"]
    if r["task"]["name"] in ANSWER_TASKS + ("state_query",):
        alphabet = None  # no alphabet bounds a state-tracking or arithmetic depth
    for key in ("optim.batch_size", "eval.per_depth", "eval.every", "checkpoint.every", "checkpoint.keep", "log.every"):
        section, name = key.split(".")
        if r[section][name] < 1:
            raise WorkbenchError(f"recipe key '{key}' = {r[section][name]} must be >= 1")
    for i, s in enumerate(r["stages"]):
        _choice(f"stages.{i}.kind", s["kind"], STAGE_KINDS)
        if not 1 <= s["steps"] <= MAX_STEPS:
            raise WorkbenchError(f"recipe key 'stages.{i}.steps' = {s['steps']} must lie in [1, {MAX_STEPS}]")
        _check_depths(f"stages.{i}.depths", s["depths"], alphabet, max_loops)
        w = s["depth_weights"]
        if w and (len(w) != len(s["depths"]) or min(w) < 0 or sum(w) <= 0):
            raise WorkbenchError(f"recipe key 'stages.{i}.depth_weights' = {w} needs one weight >= 0 per depth "
                                 f"({len(s['depths'])}) with a positive sum")
        if s["kind"] == "halting" and not r["model"]["halting"]:
            raise WorkbenchError(f"stage {i} is a halting stage but model.halting = false")
    _check_depths("eval.depths", r["eval"]["depths"], alphabet, max_loops)
    kinds = {s["kind"] for s in r["stages"]}
    if kinds & set(DENSE_KINDS) and len(kinds) > 1:
        raise WorkbenchError(f"stages mix {', '.join(sorted(kinds))}: a dense control (direct or scratchpad) is an arm "
                             "of its own, every stage of its recipe has that kind")
    for i, s in enumerate(r["stages"]):
        if s["kind"] == "park" and not max(s["depths"]) <= r["sampler"]["max"] <= max_loops:
            raise WorkbenchError(f"recipe key 'sampler.max' = {r['sampler']['max']} must lie in "
                                 f"{max(s['depths'])}..model.max_loops = {max_loops} (stage {i} parks on the answer "
                                 "from its deepest row's depth up to sampler.max loops)")
    probe = r["halting"]["probe_depths"]
    # Loop counts past oracle_max are not read (losses.halting_loss), so the default [1, 2, 4, 6] suits a short
    # sweep; a list with none inside 1..oracle_max would read nothing and train to a NaN.
    if "halting" in kinds and not (probe and all(isinstance(t, int) and t >= 1 for t in probe)
                                   and any(t <= r["halting"]["oracle_max"] for t in probe)):
        raise WorkbenchError(f"recipe key 'halting.probe_depths' = {probe} must be loop counts >= 1, at least one "
                             f"in 1..halting.oracle_max = {r['halting']['oracle_max']}")
    for key, kind in (("sampler.max", "sampled"), ("halting.oracle_max", "halting")):
        section, name = key.split(".")
        if kind in kinds and not 1 <= r[section][name] <= max_loops:
            raise WorkbenchError(f"recipe key '{key}' = {r[section][name]} must lie in "
                                 f"1..model.max_loops = {max_loops}")


def _check_depths(key: str, depths: list, alphabet: int | None, max_loops: int) -> None:
    if alphabet is None:  # RecurTrace's answer tasks: a depth is a number of rules, any number of loops reads it
        if not depths or not all(isinstance(d, int) and d >= 1 for d in depths):
            raise WorkbenchError(f"recipe key '{key}' = {depths} must be depths >= 1")
        return
    if not depths or not all(isinstance(d, int) and 1 <= d < alphabet and d <= max_loops for d in depths):
        raise WorkbenchError(f"recipe key '{key}' = {depths} must be depths in 1..{min(alphabet - 1, max_loops)} "
                             "(below the alphabet, within model.max_loops)")


def _check_task(r: dict) -> None:
    """Chase-only options left at their defaults for the RecurTrace tasks; only sampled and halting stages
    train multi-token answers (chain and the dense controls grade single-token symbols)."""
    t = r["task"]
    if t["name"] != "chase" and (t["surface"] != "symbolic" or t["symbol_set"] != "letters" or t["permutation"]):
        raise WorkbenchError(f"task.name = '{t['name']}' takes no task.surface, task.symbol_set or task.permutation "
                             "(chase options); leave them at their defaults")
    if t["name"] == "phop" and not 2 <= t["alphabet"] <= 32:
        raise WorkbenchError(f"recipe key 'task.alphabet' = {t['alphabet']} is out of range for phop; accepted: 2..32")
    for i, s in enumerate(r["stages"]):
        if t["name"] in ANSWER_TASKS and s["kind"] not in ("sampled", "halting"):  # park grades symbols too
            raise WorkbenchError(f"stage {i} is a {s['kind']} stage, which grades single-token symbols; "
                                 f"task '{t['name']}' answers in several tokens: use kind 'sampled'")
        if t["name"] != "chase" and s["kind"] in DENSE_KINDS:
            raise WorkbenchError(f"stage {i} is a {s['kind']} stage, a dense control of the chase; "
                                 f"task '{t['name']}' trains with kind 'sampled' or 'chain'")


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
                if part != "stages" and part not in SCHEMA and node is raw:
                    raise _unknown(key)
                node = node.setdefault(part, [] if part == "stages" else {})
                if not isinstance(node, (dict, list)):
                    raise WorkbenchError(f"--set {key!r}: '{'.'.join(parts[:j + 1])}' is a value, not a table; "
                                         "set it directly (e.g. --set stages.0.steps=50)")
        if isinstance(node, list):
            raise WorkbenchError(f"--set {key!r} must name a key inside a stage, e.g. stages.0.steps")
        node[parts[-1]] = value
    return raw


def load_recipe(path: str | os.PathLike, overrides: list[str] | dict | None = None) -> dict:
    """Returns the resolved recipe of a TOML file with overrides applied.

    Raises:
        WorkbenchError: a missing file, bad TOML, or an invalid recipe.
    """
    return resolve(apply_overrides(read_toml(path, "recipe"), overrides))


def dumps(recipe: dict) -> str:
    """Returns the resolved recipe as TOML text (None values left out: TOML has no null)."""
    def strip(node):
        if isinstance(node, dict):
            return {k: strip(v) for k, v in node.items() if v is not None}
        if isinstance(node, list):
            return [strip(v) for v in node]
        return node

    return tomli_w.dumps(strip(recipe))


def needed_loops(recipe: dict) -> int:
    """The largest loop count any stage or evaluation runs."""
    loops = [max(recipe["eval"]["depths"])]
    for s in recipe["stages"]:
        if s["kind"] in DENSE_KINDS:
            loops.append(1)
        elif s["kind"] == "chain":
            loops.append(max(s["depths"]))
        elif s["kind"] in ("sampled", "park"):
            loops.append(recipe["sampler"]["max"])
        else:
            loops.append(recipe["halting"]["oracle_max"])
    return max(loops)
