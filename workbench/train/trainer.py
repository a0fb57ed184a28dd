"""`train` and its Trainer: setup, stages of steps, checkpoints, the run directory.

It reads like a table of contents: `setup` (recipe → base → surgery → groups → parent →
held-out rows → run files), `run` (for each step: fresh hashed rows, the stage kind's loss
(`workbench.train.steps.STEPS`), the engine's backward (gradients summed over ranks), liveness,
the engine's clip, step and realized movement; periodic held-out evaluation, guardrail and
checkpoints), `finish` (trained tensors, the base-hash assertion for frozen-base runs,
provenance). The parts a test calls on their own: `steps` (one loss per stage kind), `engine`
(one process, DDP, FSDP2 or ZeRO-2: backward, clip, step, the optimizer state a checkpoint
saves), `guardrail` (read, judge, record), `sharding.reduce_grads` (the gradient sum over
ranks), `parent.check_parent` (init_from) and `resume` (run directory checks, the newest
loadable checkpoint, `TrainState`: what a checkpoint saves).

Under `accelerate launch` every rank builds the same global batch from hashed seeds and takes
its shard; each shard's loss is divided by the global normaliser and gradients are summed
across ranks before clipping, so N processes compute what one process computes on the batch.
"""

from __future__ import annotations

import contextlib
import copy
import json
import random
import shutil
import time
from dataclasses import replace
from pathlib import Path

import torch
from tqdm.auto import tqdm

from workbench import runs
from workbench.defaults import resolve
from workbench.devices import device_record, training_accelerator
from workbench.errors import WorkbenchError
from workbench.guard import guard_output, safe_child
from workbench.io import locked_dir, write_bytes_atomic, write_json_atomic
from workbench.loop.config import LoraSettings, RetrofitConfig
from workbench.loop.halting import oracle_labels
from workbench.loop.surgery import retrofit
from workbench.models import load_base
from workbench.precision import resolve_precision
from workbench.run_tensors import write_tensors
from workbench.tasks import build_rows, task_row
from workbench.tasks.manifest import row_ids_sha256, rows_sha256
from workbench.tasks.reader import reads_symbol
from workbench.tasks.rehearsal import rehearsal_batch, rehearsal_texts
from workbench.train import rundir, sweep_cache
from workbench.train.compiling import compile_limits
from workbench.train.engine import Engine, make_engine
from workbench.train.evaluate import evaluate, evaluate_dense, park_reading
from workbench.train.guardrail import guardrail_provenance, judge_guardrail, read_guardrail
from workbench.train.losses import adapter_disabled, halting_sweep, kl_to_base, make_batch
from workbench.train.optim import check_prelude_group, liveness, lr_factor, make_optimizer
from workbench.train.parent import Parent, check_parent
from workbench.train.recipe import DENSE_KINDS, Recipe, Stage, TaskTable, dumps, mirrored_keys
from workbench.train.resume import TrainState, check_run_dir, keep_metrics_through, restore_newest
from workbench.train.sharding import any_rank, requested_engine
from workbench.train.steps import STEPS, StepContext, StepInputs, hashed_seed

STOPPED_BY_GUARDRAIL = "stopped_by_guardrail"


def retrofit_config(recipe: Recipe, block) -> RetrofitConfig:
    """The retrofit a recipe's [model] and [lora] tables declare, at `block` (resolved when "auto")."""
    m, lora = recipe.model, recipe.lora   # every field the two tables take by name (`recipe.MIRRORED`: the others)
    adapter = LoraSettings(**{k: getattr(lora, k) for k in mirrored_keys("lora")}) if lora.enabled else None
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


class Trainer:
    """One run of one resolved recipe into `run_dir`: setup, train (stages), save.

    Everything the run holds is declared here; `setup` builds the model and what depends on it, `build_optimizer`
    the optimizer of the current stage kind (main or halting). The engine (`workbench.train.engine`) takes each
    step's backward, clip and update across the processes; without one given, it is the one `accelerate launch`
    set up (`sharding.requested_engine`).
    """

    def __init__(self, recipe: Recipe, run_dir: Path, resume: bool = False, progress: bool = True,
                 recipe_dir: Path | None = None, inputs=(), device=None, engine: Engine | None = None,
                 choose_block=None):
        self.recipe, self.run_dir, self.resume, self.progress = recipe, Path(run_dir), resume, progress
        self.choose_block = choose_block   # block = "auto": (base, tokenizer, "auto") -> ((a, b), record), handed in
        self.inputs = list(inputs)  # files the run reads (the recipe): the output guard never writes over them
        self.recipe_dir = Path(recipe_dir) if recipe_dir is not None else Path.cwd()  # init_from resolves here
        self.acc, self.device = training_accelerator(device)   # --device; each rank's own under accelerate launch
        self.device_record = device_record(device, self.device)
        n = self.acc.num_processes
        self.engine = engine if engine is not None else make_engine(requested_engine(n), n)
        self.engine.check_optimizer(recipe.optim.name)   # before anything is written
        self.stages = recipe.stages
        self.total = sum(s.steps for s in self.stages)
        self.main_total = sum(s.steps for s in self.stages if s.kind != "halting")
        self.state = TrainState()   # what a checkpoint saves and a resume restores
        self.status = "running"
        self.guarded = False             # run() holds the output guard: setup() does not take it again
        # Built by setup():
        self.looped = self.tok = None    # the retrofit and its tokenizer
        self.block_record: dict | None = None
        self.base_hash = self.frozen_hash = None
        self.groups: list[str] = []      # the trained parameter groups (`runs.trained_groups`)
        self.parent: Parent | None = None
        self.task_options: dict = {}
        self.heldout: list[dict] = []
        self.precision_record: dict | None = None
        self.guardrail_base = None       # the base's guardrail counts (None: guardrail off)
        self.teacher = None              # the frozen base of the preservation KL (None: off)
        # Built by build_optimizer():
        self.opt = self.sched = None
        self.opt_names: list[list[str]] = []
        self.params: list[torch.nn.Parameter] = []
        # Shown on the progress bar:
        self.latest_acc = None           # "worst/mean" held-out cell
        self.latest_guardrail = None     # "correct/total" at loop 1
        self._sweeps: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}   # Stage 2's oracle sweeps by stage start

    @property
    def lineage(self) -> dict | None:
        return None if self.parent is None else self.parent.lineage

    # -------------------------------------------------------------- setup
    def setup(self) -> None:
        r, m = self.recipe, self.recipe.model
        if not self.guarded:  # called by hand, not from run(): the guard decides before any write
            with self._guard():
                pass
        check_run_dir(self.run_dir, dumps(r), self.resume)
        self.acc.wait_for_everyone()  # every rank checks before the main process writes
        torch.manual_seed(r.seed)  # LoRA's A matrices are drawn from it
        base, self.tok = load_base(m.base, attn_implementation=m.attn)
        block, self.block_record = m.block, {"source": "given", "block": m.block}
        if block == "auto":  # angular distance + Kneedle + window ablation (`workbench.selection.stage1.resolve_block`)
            if self.choose_block is None:
                raise WorkbenchError("block = 'auto' needs block selection: use `workbench train`, "
                                     "workbench.train_recipe, or a block A:B")
            block, self.block_record = self.choose_block(base, self.tok, block)
        self.base_hash = runs.base_sha256(base)
        self.looped = retrofit(base, retrofit_config(r, block))  # LoRA's A matrices are drawn last
        self.looped.to(self.device).train()
        for p in self.looped.parameters():
            p.requires_grad_(False)
        self.groups = runs.trained_groups(self.looped.retrofit_config, r.train.block)
        if r.init_from:
            self.parent = check_parent(r.init_from, self.recipe_dir, self.base_hash, self.looped.retrofit_config,
                                       self.groups, halting_only=all(s.kind == "halting" for s in self.stages))
        self.task_options = task_options(r.task, self.tok)
        e = r.eval
        self.heldout = build_rows(r.task.name, e.depths, e.per_depth, e.seed, split="test", **self.task_options)
        if self.acc.is_main_process and not self.resume:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            write_json_atomic(self.run_dir / runs.RETROFIT,
                              {**rundir.retrofit_record(self.looped, m.base, self.base_hash, self.groups),
                               "block_selection": self.block_record})
            write_bytes_atomic(self.run_dir / runs.RECIPE, dumps(r).encode())
            write_bytes_atomic(self.run_dir / runs.METRICS, b"")
        self.acc.wait_for_everyone()
        self._set_precision()
        # The base's reading in the run's own precision (bf16 alone moves it): loop 1 is the base until a parent loads.
        self.guardrail_base = read_guardrail(self.looped, self.tok) if r.guardrail.enabled else None
        self.teacher = self._teacher() if r.preserve.kl_weight > 0 else None  # the base, never the parent
        if r.train.compile:
            # In place (nn.Module.compile), so parameter names and checkpoints are unchanged; after the teacher's copy.
            for layer in self.looped.layers:
                layer.compile()
        if self.parent is not None:
            runs.load_trained(self.looped, self.parent.dir / runs.TRAINABLE, self.parent.groups)
        self.engine.prepare(self.looped)   # last (fsdp2: the frozen layers outside the block sharded)

    def _set_precision(self) -> None:
        """Frozen weights to bf16 once (trained groups stay fp32) when the recipe asks and the hardware has it."""
        used, self.precision_record = resolve_precision(self.recipe.train.precision, self.device)
        self.precision_record["frozen_tensors_cast"] = runs.set_run_precision(self.looped, self.groups, used)
        if self.progress and self.acc.is_main_process:
            hw = self.precision_record["hardware"]
            tqdm.write(f"precision: {used} ({hw['name']}; bf16 units: {', '.join(hw['bf16_units']) or 'none'}; "
                       f"{self.precision_record['frozen_tensors_cast']} frozen tensors stored in bf16)"
                       if used == "bf16" else f"precision: fp32 ({hw['name']})")
        for p in self.looped.parameters():
            p.requires_grad_(False)
        self.frozen_hash = runs.base_sha256(self.looped.base)   # in the dtype the run keeps them

    def _teacher(self):
        """The frozen base for the preservation KL: the adapter switched off, or a frozen copy (full block)."""
        if "lora" in self.groups:
            return lambda: adapter_disabled(self.looped)
        teacher = copy.deepcopy(self.looped).eval()
        for p in teacher.parameters():
            p.requires_grad_(False)
        return teacher

    def build_optimizer(self, kind: str) -> None:
        """The main optimizer (every trained group but the halting head) or Stage 2's (head only), as the engine
        steps it (`Engine.wrap`)."""
        if self.opt is not None:
            self.engine.release(self.opt)
        for p in self.looped.parameters():
            p.requires_grad_(False)
        r = self.recipe
        if kind == "halting":
            h = r.halting
            cfg = replace(r.optim, name="adamw", lr=h.lr, prelude_lr_mult=1.0, weight_decay=0.0)
            self.opt, self.opt_names = make_optimizer(self.looped, ["halting"], cfg)
            self._freeze_for_stage2()
            steps = sum(s.steps for s in self.stages if s.kind == "halting")
            factor = lr_factor(h.warmup_steps, steps, "cosine")
        else:
            main_groups = [g for g in self.groups if g != "halting"]
            self.opt, self.opt_names = make_optimizer(self.looped, main_groups, r.optim)
            check_prelude_group(self.opt, self.looped, r.optim.lr, r.optim.prelude_lr_mult)
            factor = lr_factor(r.optim.warmup_steps, self.main_total, r.optim.schedule)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, factor)
        self.params = [p for g in self.opt.param_groups for p in g["params"]]
        self.opt = self.engine.wrap(self.looped, self.opt, self.clip(kind))
        self.state.optimizer = "halting" if kind == "halting" else "main"

    def clip(self, kind: str) -> float:
        """The gradient clipping norm of a stage kind's steps (0: none): Stage 2 clips the head at 1."""
        return 1.0 if kind == "halting" else self.recipe.optim.grad_clip

    def _freeze_for_stage2(self) -> None:
        """Stage 2 (RecurTrace App. E): asserts only the halting head takes gradient, and records the digest of
        everything else (base, block, re-entry, memory, LoRA), which `finish` checks is unchanged."""
        moving = [n for n, p in self.looped.named_parameters() if p.requires_grad and not n.startswith("halting.")]
        if moving:
            raise WorkbenchError(f"Stage 2 must train the halting head alone; {moving[0]} takes gradient")
        if not any(p.requires_grad for p in self.looped.halting.parameters()):
            raise WorkbenchError("Stage 2 has no halting parameter to train")
        self.state.stage2_frozen_sha256 = rundir.state_sha256(self.looped)

    # -------------------------------------------------------------- one step
    def stage_at(self, step: int) -> tuple[int, Stage, int]:
        """(stage index, stage, step within the stage) of a global step."""
        start = 0
        for i, s in enumerate(self.stages):
            if step < start + s.steps:
                return i, s, step - start
            start += s.steps
        raise IndexError(step)

    def rows(self, step: int, stage: Stage) -> list[dict]:
        """The global batch of a step: fresh training rows from hashed seeds, the same on every rank."""
        B, seed = self.recipe.optim.batch_size, self.recipe.seed
        rng = random.Random(hashed_seed("depths", step, seed))
        depths = rng.choices(stage.depths, weights=stage.depth_weights or None, k=B)
        return [task_row(self.recipe.task.name, d, step * B + i, seed, split="train", **self.task_options)
                for i, d in enumerate(depths)]

    def halting_cache(self, start: int, stage: Stage) -> tuple[torch.Tensor, torch.Tensor]:
        """Stage 2's offline sweep (`[halting] sweep` rows), computed once per stage and kept in memory.

        The rows are the ones the online Stage 2 would draw at the stage's first steps (`rows`), so the
        sweep is deterministic from the recipe and a resumed run rebuilds the same cache."""
        if start in self._sweeps:
            return self._sweeps[start]
        h, B = self.recipe.halting, self.recipe.optim.batch_size
        rows = [r for s in range(start, start + -(-h.sweep // B)) for r in self.rows(s, stage)][: h.sweep]
        size = self.recipe.eval.batch_size
        batches = (make_batch(rows[i:i + size], self.tok, device=self.device) for i in range(0, len(rows), size))
        t0 = time.perf_counter()
        # one process: the sweep is read from the cache when the same frozen model, rows and loops computed it before
        # (a sweep of heads on one Stage 1 model, `workbench.train.sweep_cache`); several ranks compute their own
        key = (sweep_cache.sweep_key(self.looped, rows, h.oracle_max, size,
                                     json.dumps(self.precision_record, sort_keys=True, default=str), self.device)
               if sweep_cache.enabled() and self.acc.num_processes == 1 else None)
        cached = sweep_cache.read_sweep(key, len(rows), h.oracle_max) if key else None
        if cached is not None:
            losses, z = (t.to(self.device) for t in cached)
        else:
            was_training = self.looped.training
            self.looped.eval()
            with tqdm(total=len(rows), desc="oracle sweep", leave=False, dynamic_ncols=True,
                      disable=not (self.progress and self.acc.is_main_process)) as bar:
                losses, z = halting_sweep(self.looped, batches, h.oracle_max, progress=bar.update)
            self.looped.train(was_training)
            if key:
                sweep_cache.write_sweep(key, losses, z)
        labels = oracle_labels(losses, margin=h.margin, depth_cost=h.depth_cost)
        target = (labels < 0.5).float().argmax(1) + 1
        depths = sorted({r["depth"] for r in rows})
        self._log({"kind": "halting_sweep", "step": start, "rows": len(rows), "loops": h.oracle_max,
                   "seconds": round(time.perf_counter() - t0, 2), "cache": "off" if key is None else
                   "read" if cached is not None else "written", "sweep_key": key,
                   "continue_rate": [round(float(v), 4) for v in labels.mean(0)],
                   "mean_target": round(float(target.float().mean()), 4),
                   "mean_target_by_depth": {str(d): round(float(target[[r["depth"] == d for r in rows]]
                                                                     .float().mean()), 4) for d in depths}})
        self._sweeps[start] = (losses, z)
        return losses, z

    def step(self, step: int) -> dict:
        """Trains one step: the stage kind's loss (`STEPS`), gradients over ranks, checks, clip, update; returns
        the step's metrics.jsonl record."""
        _, stage, local = self.stage_at(step)
        rows = self.rows(step, stage)
        x = StepInputs(step, local, stage, rows, rows[self.acc.process_index::self.acc.num_processes],
                       stage.chain_weight_at(local), self.device, self.tok)
        run = StepContext(self.recipe.seed, self.recipe.sampler, self.recipe.halting, self.acc.process_index,
                          self.acc.num_processes, self.halting_cache)
        self.opt.zero_grad(set_to_none=True)
        out = STEPS[stage.kind](self.looped, x, run)
        loss, loops, info = out.loss, out.loops, {"chain_weight": x.chain_weight, **out.info}
        if self.teacher is not None and stage.kind != "halting":
            kl = kl_to_base(self.looped, self._rehearsal(step), self.teacher)
            info["kl_base"] = round(float(kl.detach()), 6)
            loss = loss + self.recipe.preserve.kl_weight * kl
        total_loss, squares = self.engine.backward(self.opt, loss, self.params, self.acc, self.device)
        if not torch.isfinite(total_loss):
            self._stop_non_finite(step, f"the loss is {float(total_loss)}")
        if stage.kind != "halting" and loops >= 2 and "reentry" in self.groups:
            self._check_liveness(step, info, squares)
        lr = {g["name"]: g["lr"] for g in self.opt.param_groups}
        update = self.engine.update(self.opt, self.params, self.opt_names, squares, self.clip(stage.kind))
        self.sched.step()
        bad = next((self._param_name(p) for p in self.params if not torch.isfinite(p).all()), None)
        if bad is not None:
            self._stop_non_finite(step, f"the update made trained tensor '{bad}' non-finite")
        return {"kind": "train", "step": step + 1, "stage": stage.name or stage.kind, "loops": loops,
                "loss": float(total_loss), "lr": lr, "grad_norm": float(update.grad_norm),
                "grad_rms": update.grad_rms, "move_rms": update.move_rms, **info}

    def _param_name(self, param) -> str:
        """The name of a trained parameter, as in `LoopedLM.named_parameters()`."""
        return next(n for n, p in self.looped.named_parameters() if p is param)

    def _stop_non_finite(self, step: int, what: str) -> None:
        """Stops the run: nothing non-finite is checkpointed, exported or given provenance."""
        last = rundir.checkpoints(self.run_dir)
        raise WorkbenchError(f"step {step + 1}: {what}; the run stops without saving (its last checkpoint: "
                             f"{f'step {last[-1]}' if last else 'none'}); lower optim.lr or check the recipe's numbers")

    def _rehearsal(self, step: int) -> dict:
        """This step's rehearsal texts for the preservation KL (never the guardrail's template)."""
        p = self.recipe.preserve
        texts = rehearsal_texts(step, self.recipe.seed, p.rows, p.sources)
        batch = rehearsal_batch(self.tok, texts, p.positions)
        return {k: v.to(self.device) for k, v in batch.items()}

    def _check_liveness(self, step: int, info: dict, squares: dict | None = None) -> None:
        """W_p / W_s (or alpha) must get gradient on the first step through the re-entry; the gate on a
        later one (its gradient is (translated - h) * dL/du, exactly zero until W_p or W_s move)."""
        grads = liveness(self.looped, squares)
        if self.state.live_projections is None:
            need = [n for n in ("prelude_proj.weight", "state_proj.weight", "alpha") if n in grads]
            dead = [n for n in need if grads[n] == 0.0]
            if dead:
                raise WorkbenchError(f"liveness: the re-entry's {dead[0]} got exactly zero gradient at step {step + 1}")
            self.state.live_projections = step + 1
            info["liveness"] = grads
        elif "gate" in grads and self.state.live_gate is None:
            if grads["gate"] == 0.0:
                raise WorkbenchError(f"liveness: the bridge gate got exactly zero gradient at step {step + 1}, "
                                     "after W_p / W_s had moved")
            self.state.live_gate = step + 1
            info["liveness"] = grads

    # -------------------------------------------------------------- the run
    def run(self, stop_after: int | None = None) -> dict:
        """Sets up (unless done), trains every remaining step, saves; returns the summary (`training.train`).

        The run directory is locked meanwhile: a second process training into it is refused."""
        main = self.acc.is_main_process
        # A Trainer set up by hand (setup() before run()) passed the guard in setup() and wrote the directory itself.
        guard = contextlib.nullcontext() if self.looped is not None else self._guard()
        lock = locked_dir(self.run_dir, "run directory") if main else contextlib.nullcontext()
        with guard, lock, compile_limits(self.recipe.train.compile):
            return self._run(stop_after)

    def _guard(self):
        """The output guard's decision on the run directory (main process), before any work; held until released."""
        if not self.acc.is_main_process:
            return contextlib.nullcontext()
        parent = self.recipe.init_from or None
        reading = [*self.inputs, *([self.recipe_dir / parent, Path(parent)] if parent else [])]
        if self.resume:  # a run resumed from its own recipe.toml reads it: that is not writing over an input
            reading = [r for r in reading if Path(r).resolve() != (self.run_dir / runs.RECIPE).resolve()]
        return guard_output(self.run_dir, "train", kind=runs.RUN_OUTPUT, resume=self.resume, reading=reading)

    def _run(self, stop_after: int | None) -> dict:
        if self.looped is None:
            self.guarded = True   # run() holds the guard
            self.setup()
        start = self._restore() if self.resume else 0
        t0 = time.perf_counter() - self.state.elapsed_s
        if start == 0:
            self._evaluate(0)
            if self.recipe.guardrail.enabled and not self._check_guardrail(0):
                return self._stop_by_guardrail(0)  # an init_from parent that already fails
        bar = tqdm(total=self.total, initial=start, desc=self.recipe.name, dynamic_ncols=True,
                   disable=not (self.progress and self.acc.is_main_process))
        step = start
        while step < self.total:
            kind = "halting" if self.stage_at(step)[1].kind == "halting" else "main"
            if self.state.optimizer != kind:
                self.build_optimizer(kind)
            record = self.step(step)
            step += 1
            self.state.elapsed_s = time.perf_counter() - t0
            if step % self.recipe.log.every == 0 or step == self.total:
                self._log({**record, "elapsed_s": round(self.state.elapsed_s, 2)})
            evaluated = step % self.recipe.eval.every == 0 or step == self.total
            if evaluated:
                self._evaluate(step)
            g = self.recipe.guardrail
            if g.enabled and (evaluated or (g.every and step % g.every == 0)):
                if not self._check_guardrail(step):
                    bar.close()
                    return self._stop_by_guardrail(step)
                self._checkpoint(step)  # the last passing checkpoint is what a stopped run keeps
            elif step % self.recipe.checkpoint.every == 0 or step == self.total:
                self._checkpoint(step)
            bar.update(1)
            bar.set_postfix(loss=f"{record['loss']:.3f}", acc=self.latest_acc or "-",
                            guard=self.latest_guardrail or "-", stage=record["stage"])
            if stop_after is not None and step >= stop_after and step < self.total:
                bar.close()
                return self._summary(step, finished=False)
        bar.close()
        self.finish()
        return self._summary(step, finished=True)

    def _log(self, record: dict) -> None:
        if self.acc.is_main_process:
            with open(self.run_dir / runs.METRICS, "a") as f:
                f.write(json.dumps(record, sort_keys=True) + "\n")

    def _evaluate(self, step: int) -> None:
        """Depth × loop active-label accuracy on the held-out rows, into metrics.jsonl (main process)."""
        if self.acc.is_main_process or self.engine.reads_on_every_rank:   # a sharded base all-gathers
            kinds = self.recipe.kinds
            dense = next((k for k in DENSE_KINDS if k in kinds), None)
            past = self.recipe.sampler.max if "park" in kinds else None   # a park run: also read past d
            matrix, frame = (evaluate_dense(self.looped, self.tok, self.heldout, dense, self.recipe.eval.batch_size)
                             if dense else evaluate(self.looped, self.tok, self.heldout, self.recipe.eval.batch_size,
                                                    answer_loops=self.recipe.sampler.max, past=past))
            cells = [v for row in matrix.values() for v in row.values()]
            self.latest_acc = f"{min(cells):.2f}/{sum(cells) / len(cells):.2f}"  # worst / mean cell
            extra = park_reading(frame) if past is not None and reads_symbol(self.heldout[0]) else {}
            self._log({"kind": "eval", "step": step, "acc": matrix, "min_active": min(cells),
                       "mean_active": sum(cells) / len(cells), **extra})
        self.acc.wait_for_everyone()

    def _check_guardrail(self, step: int) -> bool:
        """Scores the guardrail at loop 1 against the base; logs it; returns whether the run may go on."""
        passed = True
        if self.acc.is_main_process or self.engine.reads_on_every_rank:
            now = read_guardrail(self.looped, self.tok)
            passed, record = judge_guardrail(self.guardrail_base, now, self.recipe.guardrail.max_drop, step)
            self.latest_guardrail = f"{now.correct}/{now.total}"
            self._log(record)
        passed = any_rank(self.acc, passed, self.device)
        if passed:
            self.state.last_passing_step = step
        return passed

    def _stop_by_guardrail(self, step: int) -> dict:
        """Ends a run that lost more than guardrail.max_drop points: no trained tensors at the top level,
        checkpoints after the last passing reading removed, provenance saying so."""
        self.status = STOPPED_BY_GUARDRAIL
        if self.acc.is_main_process:
            last = self.state.last_passing_step
            for old in rundir.checkpoints(self.run_dir):
                if last is None or old > last:
                    shutil.rmtree(self.run_dir / runs.CHECKPOINTS / f"step_{old}")
            rundir.write_provenance(self.run_dir, {}, {"recipe": self.recipe.seed},
                                    {"status": STOPPED_BY_GUARDRAIL, "stopped_at_step": step,
                                     "last_passing_checkpoint": (None if last is None else "the initial state (step 0)"
                                                                 if last == 0 else f"checkpoints/step_{last}"),
                                     "guardrail": self._guardrail_record(), "precision": self.precision_record,
                                     "device": self.device_record, "lineage": self.lineage,
                                     "wall_s": round(self.state.elapsed_s, 1)})
        self.acc.wait_for_everyone()
        return self._summary(step, finished=False)

    def _guardrail_record(self) -> dict | None:
        return guardrail_provenance(self.guardrail_base, self.run_dir / runs.METRICS, self.recipe.guardrail.max_drop)

    def _checkpoint(self, step: int) -> None:
        self.engine.before_save(self.opt, keep=self.acc.is_main_process)   # every rank; the main process saves
        if self.acc.is_main_process:
            rundir.save_checkpoint(self.run_dir, step, self.looped, self.groups, self.opt, self.opt_names,
                                   self.sched, self.state.to_dict(), keep=self.recipe.checkpoint.keep,
                                   protect=self.state.last_passing_step)
        self.acc.wait_for_everyone()

    def _load_checkpoint(self, ckpt: Path) -> dict:
        """Builds the optimizer the checkpoint was saved with and loads it; returns the state it stored."""
        self.build_optimizer(rundir.read_checkpoint_state(ckpt)["optimizer"])
        return rundir.load_checkpoint(ckpt, self.looped, self.groups, self.opt, self.opt_names, self.sched)

    def _restore(self) -> int:
        """Loads the newest intact checkpoint (`resume.restore_newest`); drops metrics lines logged after it.
        Returns its step.

        A run without a checkpoint is refused before this (`resume.check_resumable`: its history would be lost).
        """
        step, state, failures = restore_newest(self.run_dir, self._load_checkpoint)
        self.state.update(state)
        if failures and self.progress:
            tqdm.write(f"--resume: skipped {len(failures)} damaged checkpoint(s): {'; '.join(failures)[:300]}")
        if self.acc.is_main_process:
            rundir.discard_partial_checkpoints(self.run_dir)
            keep_metrics_through(self.run_dir, step)
        self.acc.wait_for_everyone()
        return step

    def finish(self) -> None:
        """Writes the trained tensors and provenance; asserts a frozen base is bit-for-bit unchanged."""
        base_unchanged = None
        frozen = self.state.stage2_frozen_sha256
        if frozen is not None and rundir.state_sha256(self.looped) != frozen:
            raise WorkbenchError("Stage 2 moved a tensor outside the halting head (base, block, re-entry, memory "
                                 "or LoRA changed after Stage 1)")
        if "block" not in self.groups:
            digest = runs.base_sha256(self.looped.base)
            if digest != self.frozen_hash:
                raise WorkbenchError(f"the base weights changed during a frozen-base run ({self.frozen_hash[:12]}... -> "
                                     f"{digest[:12]}...)")
            base_unchanged = True
        if self.acc.is_main_process:
            # A continued run writes only the tensors it changed and names its parent (`workbench.run_tensors`).
            write_tensors(self.run_dir / runs.TRAINABLE, runs.trained_state(self.looped, self.groups),
                          None if self.parent is None else self.parent.dir)
            t, e = self.recipe.task, self.recipe.eval
            manifests = {
                "heldout": {"rows": len(self.heldout), "rows_sha256": rows_sha256(self.heldout),
                            "row_ids_sha256": row_ids_sha256(self.heldout), "split": "test",
                            "depths": e.depths, "per_depth": e.per_depth, "seed": e.seed},
                "train": {"generator": f"workbench.tasks.task_row({t.name!r})", "split": "train",
                          "alphabet": self.task_options.get("alphabet"),
                          "seed": self.recipe.seed, "rows": self.total * self.recipe.optim.batch_size},
            }
            rundir.write_provenance(self.run_dir, manifests, {"recipe": self.recipe.seed, "eval": e.seed},
                                    {"steps": self.total, "wall_s": round(self.state.elapsed_s, 1),
                                     "processes": self.acc.num_processes, "base_unchanged": base_unchanged,
                                     # bf16 reductions split by thread count: a bit-for-bit rerun needs the same
                                     "torch_threads": torch.get_num_threads(),
                                     "liveness": {"projections_step": self.state.live_projections,
                                                  "gate_step": self.state.live_gate},
                                     "stage2_frozen": None if frozen is None else True,
                                     "status": "finished", "precision": self.precision_record,
                                     "device": self.device_record, "engine": self.engine.record(),
                                     "guardrail": self._guardrail_record(), "lineage": self.lineage})
        self.acc.wait_for_everyone()

    def _summary(self, step: int, finished: bool) -> dict:
        evals = [json.loads(line) for line in (self.run_dir / runs.METRICS).read_text().splitlines() if '"eval"' in line]
        evals = [e for e in evals if e["kind"] == "eval"]
        return {"run_dir": str(self.run_dir), "steps": step, "finished": finished, "status": self.status
                if not finished else "finished", "guardrail": self._guardrail_record(),
                "before": evals[0]["acc"] if evals and evals[0]["step"] == 0 else None,
                "after": evals[-1]["acc"] if evals else None, "wall_s": round(self.state.elapsed_s, 1),
                "device": self.device_record}


# Every decoder layer shares one forward, so torch compiles it once per variant it meets: frozen Linear or LoRA
# projections, grad mode on or off, an input that requires grad or not, each shape first static and then dynamic.
# The default limit of 8 was reached in a run's first few steps, after which torch ran the remaining variants
# eager without an error (the first whole-run measurement read that mix). The limit is raised for the run
# and reaching it is an error, so a compiled run is compiled throughout or stops saying why.
def train(recipe_path: str | Path, out: str | Path | None = None,
          overrides: list[str] | dict | None = None, resume: bool = False, stop_after: int | None = None,
          progress: bool = True, device: str | None = None, choose_block=None) -> dict:
    """Trains a recipe into a run directory; returns a summary dict.

    Args:
        recipe_path: a TOML recipe (see `workbench.train.recipe`), or a shipped recipe's name (`smollm2_lora_chase`).
        out: the run directory (default runs/<recipe name>).
        overrides: `key=value` strings (as `--set`) or a {dotted key: value} dict.
        resume: continue from the latest checkpoint in `out` (the recipe must match its recipe.toml).
        stop_after: stop after this global step, as if the process were stopped there (tests,
            time-boxed runs); the run directory is then resumable but not finished.
        device: "auto" (None), "cpu", "cuda" or "cuda:N" (`workbench.devices`), recorded in provenance.
        choose_block: resolves block = "auto" (`workbench.selection.stage1.resolve_block`); None refuses "auto".
    Returns:
        {"run_dir", "steps", "finished", "before", "after", "wall_s"}: before / after are
        {depth: {loop: accuracy}} on the held-out rows (before is None when step 0 was not evaluated).
    """
    recipe_path = resolve("recipe", recipe_path)
    recipe = Recipe.from_toml(recipe_path, overrides)
    run_dir = Path(out) if out is not None else safe_child("runs", recipe.name, "recipe name")
    return Trainer(recipe, run_dir, resume=resume, progress=progress, recipe_dir=Path(recipe_path).resolve().parent,
                   inputs=[recipe_path], device=device, choose_block=choose_block).run(stop_after=stop_after)
