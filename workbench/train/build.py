"""`build_run(recipe)`: everything a Trainer is handed, built once: the model, the data, the evaluator, the engine.

It reads like the recipe's tables in order: the base (`[model] base`), its block (given, or chosen when "auto"), the
retrofit at that block with LoRA's A matrices drawn from the recipe's seed, the trained groups, the parent
(`init_from`, checked here, loaded last), the task's training and held-out rows (`TrainingData`), the precision, the
guardrail's base reading, the preservation KL's teacher, the compiled layers and the engine's prepared model. The
Trainer (`workbench.train.trainer`) loops over what it is handed and writes the run directory; it loads nothing.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from workbench import runs
from workbench.errors import WorkbenchError
from workbench.loop.config import Block, LoraSettings, RetrofitConfig
from workbench.loop.surgery import retrofit
from workbench.models import load_base
from workbench.precision import resolve_precision
from workbench.tasks import build_rows, task_row
from workbench.tasks.reader import reads_symbol
from workbench.train import rundir
from workbench.train.engine import Engine
from workbench.train.evaluate import evaluate, park_reading
from workbench.train.guardrail import read_guardrail
from workbench.train.kinds import stage_kind
from workbench.train.losses import adapter_disabled
from workbench.train.parent import Parent, check_parent
from workbench.train.recipe import Recipe, Stage, TaskTable, mirrored_keys
from workbench.train.steps import hashed_seed


def retrofit_config(recipe: Recipe, block) -> RetrofitConfig:
    """The retrofit a recipe's [model] and [lora] tables declare, at `block` (resolved when "auto")."""
    m, lora = recipe.model, recipe.lora   # every field the two tables take by name (`recipe.MIRRORED`: the others)
    adapter = LoraSettings(**{k: getattr(lora, k) for k in mirrored_keys("lora")}) if lora.enabled else None
    block = Block.parse(block) if isinstance(block, str) else Block(*block)   # the recipe's "A:B", read at its edge
    return RetrofitConfig(block=block, lora=adapter, **{k: getattr(m, k) for k in mirrored_keys("model")})


def task_options(task: TaskTable, tokenizer) -> dict:
    """The generator options of a recipe's [task] table (`workbench.tasks.build_rows`): the chase takes
    all of them, p-hop its alphabet, state tracking and arithmetic none."""
    if task.name == "chase":
        return dict(tokenizer=tokenizer, alphabet=task.alphabet, surface=task.surface,
                    symbol_set=task.symbol_set, permutation=task.permutation)
    if task.name == "phop":
        return dict(tokenizer=tokenizer, alphabet=task.alphabet)
    return {}


@dataclass
class TrainingData:
    """The rows of a run: fresh training rows from hashed seeds at every step, and the held-out rows."""

    task: str
    seed: int                  # the recipe's seed
    batch_size: int            # rows per step (the global batch)
    options: dict              # the generator's options (`task_options`)
    heldout: list[dict]

    def rows(self, step: int, stage: Stage) -> list[dict]:
        """The global batch of a step: its depths drawn from the stage's, the same rows on every rank."""
        B = self.batch_size
        rng = random.Random(hashed_seed("depths", step, self.seed))
        depths = rng.choices(stage.depths, weights=stage.depth_weights or None, k=B)
        return [task_row(self.task, d, step * B + i, self.seed, split="train", **self.options)
                for i, d in enumerate(depths)]


@dataclass
class Evaluator:
    """How a run reads its held-out rows: the looped reader (depth x loop accuracy, past each depth to `past`
    loops when a kind reads past), or a control arm's own reader (`StageKind.reader`)."""

    tokenizer: object
    rows: list[dict]
    batch_size: int
    answer_loops: int          # the loops a multi-token answer is read at
    past: int | None           # read every depth to this many loops (park), else None
    reader: Callable | None    # an arm's reader, else None

    def read(self, model) -> tuple[dict, dict]:
        """({depth: {loop: accuracy}}, what the evaluation record adds: the reading past d when read)."""
        if self.reader is not None:
            matrix, frame = self.reader(model, self.tokenizer, self.rows, self.batch_size)
        else:
            matrix, frame = evaluate(model, self.tokenizer, self.rows, self.batch_size,
                                     answer_loops=self.answer_loops, past=self.past)
        extra = park_reading(frame) if self.past is not None and reads_symbol(self.rows[0]) else {}
        return matrix, extra


@dataclass
class BuiltRun:
    """What a Trainer is handed: the model and what depends on it, built from one recipe by `build_run`."""

    recipe: Recipe
    model: torch.nn.Module     # the retrofit (LoopedLM) on its device, parent loaded, prepared by the engine
    tokenizer: object
    data: TrainingData
    evaluator: Evaluator
    engine: Engine
    device: torch.device
    processes: int             # the number of ranks
    groups: list[str]          # the trained parameter groups (`runs.trained_groups`)
    base_hash: str             # the base's digest as loaded
    frozen_hash: str           # the frozen base's digest in the dtype the run keeps it
    retrofit_record: dict      # retrofit.json, as the model stood before its precision was set
    parent: Parent | None
    precision_record: dict
    guardrail_base: object     # the base's guardrail counts (None: guardrail off)
    teacher: object            # the frozen base of the preservation KL (None: off)
    guardrail_start: object = None   # step 0's counts when they are the base's (None: step 0 reads its own)


def build_run(recipe: Recipe, device: torch.device, engine: Engine, processes: int = 1, recipe_dir: Path = Path(),
              choose_block=None, progress: bool = False) -> BuiltRun:
    """Builds the run a recipe declares on `device`, its model prepared by `engine`.

    Args:
        recipe_dir: where `init_from` resolves.
        choose_block: resolves block = "auto": (base, tokenizer, "auto") -> ((a, b), record); None refuses "auto".
        progress: print the precision line (the main process).
    Raises:
        WorkbenchError: block "auto" without `choose_block`, or a parent that does not fit (`check_parent`).
    """
    r, m = recipe, recipe.model
    torch.manual_seed(r.seed)  # LoRA's A matrices are drawn from it
    base, tok = load_base(m.base, attn_implementation=m.attn)
    block, block_record = m.block, {"source": "given", "block": m.block}
    if block == "auto":  # angular distance + Kneedle + window ablation (`workbench.selection.stage1.resolve_block`)
        if choose_block is None:
            raise WorkbenchError("block = 'auto' needs block selection: use `workbench train`, "
                                 "workbench.train_recipe, or a block A:B")
        block, block_record = choose_block(base, tok, block)
    base_hash = runs.base_sha256(base)
    looped = retrofit(base, retrofit_config(r, block))  # LoRA's A matrices are drawn last
    looped.to(device).train()
    freeze(looped)
    groups = runs.trained_groups(looped.retrofit_config, r.train.block)
    parent = None
    if r.init_from:
        new_head = all(stage_kind(s.kind).new_head for s in r.stages)
        parent = check_parent(r.init_from, recipe_dir, base_hash, looped.retrofit_config, groups, halting_only=new_head)
    options = task_options(r.task, tok)
    e = r.eval
    heldout = build_rows(r.task.name, e.depths, e.per_depth, e.seed, split="test", **options)
    record = {**rundir.retrofit_record(looped, m.base, base_hash, groups), "block_selection": block_record}
    precision_record, frozen_hash = set_precision(looped, groups, r.train.precision, device, progress)
    # The base's reading in the run's own precision (bf16 alone moves it): loop 1 is the base until a parent loads.
    guardrail_base = read_guardrail(looped, tok) if r.guardrail.enabled else None
    teacher = make_teacher(looped, groups) if r.preserve.kl_weight > 0 else None  # the base, never the parent
    if r.train.compile:
        # In place (nn.Module.compile), so parameter names and checkpoints are unchanged; after the teacher's copy.
        for layer in looped.layers:
            layer.compile()
    if parent is not None:
        runs.load_trained(looped, parent.dir / runs.TRAINABLE, parent.groups)
    engine.prepare(looped)   # last (fsdp2: the frozen layers outside the block sharded)
    # Step 0 would read the very model the base's reading read, unless a parent loaded, layers were compiled or the
    # base was sharded since: the same weights through the same code, so its counts are the base's, not read twice.
    unchanged = parent is None and not r.train.compile and not engine.reads_on_every_rank
    registered = [stage_kind(k) for k in sorted(r.kinds)]
    evaluator = Evaluator(tok, heldout, e.batch_size, answer_loops=r.sampler.max,
                          past=r.sampler.max if any(k.reads_past for k in registered) else None,
                          reader=next((k.reader for k in registered if k.reader is not None), None))
    data = TrainingData(r.task.name, r.seed, r.optim.batch_size, options, heldout)
    return BuiltRun(r, looped, tok, data, evaluator, engine, device, processes, groups, base_hash, frozen_hash, record,
                    parent, precision_record, guardrail_base, teacher, guardrail_base if unchanged else None)


def freeze(looped) -> None:
    """Every parameter frozen: an optimizer marks what it trains (`Optimizer.build`)."""
    for p in looped.parameters():
        p.requires_grad_(False)


def set_precision(looped, groups: list[str], asked: str, device, progress: bool) -> tuple[dict, str]:
    """Frozen weights to bf16 once (trained groups stay fp32) when the recipe asks and the hardware has it.

    Returns (the precision record, the frozen base's digest in the dtype the run keeps it)."""
    used, record = resolve_precision(asked, device)
    record["frozen_tensors_cast"] = runs.set_run_precision(looped, groups, used)
    if progress:
        hw = record["hardware"]
        tqdm.write(f"precision: {used} ({hw['name']}; bf16 units: {', '.join(hw['bf16_units']) or 'none'}; "
                   f"{record['frozen_tensors_cast']} frozen tensors stored in bf16)"
                   if used == "bf16" else f"precision: fp32 ({hw['name']})")
    freeze(looped)
    return record, runs.base_sha256(looped.base)


def make_teacher(looped, groups: list[str]):
    """The frozen base for the preservation KL: the adapter switched off, or a frozen copy (full block)."""
    if "lora" in groups:
        return lambda: adapter_disabled(looped)
    teacher = copy.deepcopy(looped).eval()
    freeze(teacher)
    return teacher
