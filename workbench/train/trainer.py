"""`train` and its Trainer: setup, stages of steps, checkpoints, the run directory.

It reads like a table of contents: `setup` (the run directory checked, the run built by
`workbench.train.build.build_run`: model, data, evaluator, engine; the run files written), `run` (for each step:
fresh hashed rows, the stage kind's loss (its record's step, `workbench.train.kinds`), the engine's backward
(gradients summed over ranks), the checks the kind takes (liveness), the engine's clip, step and realized movement;
periodic held-out evaluation, guardrail and checkpoints), `finish` (trained tensors, the base-hash assertion for
frozen-base runs, provenance). The trainer names no stage kind: what differs between kinds is read from their
records. The parts a test calls on their own: `kinds` (one record per stage kind), `engine`
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
import json
import shutil
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from workbench import runs
from workbench.defaults import resolve
from workbench.devices import device_record, training_accelerator
from workbench.errors import WorkbenchError
from workbench.guard import guard_output, safe_child
from workbench.io import locked_dir, write_bytes_atomic, write_json_atomic
from workbench.run_tensors import write_tensors
from workbench.tasks.manifest import row_ids_sha256, rows_sha256
from workbench.tasks.rehearsal import rehearsal_batch, rehearsal_texts
from workbench.train import rundir
from workbench.train.build import BuiltRun, build_run
from workbench.train.compiling import compile_limits
from workbench.train.engine import Engine, make_engine
from workbench.train.guardrail import guardrail_provenance, judge_guardrail, read_guardrail
from workbench.train.kinds import StageKind, optimizer_named, stage_kind
from workbench.train.losses import kl_to_base
from workbench.train.optim import liveness
from workbench.train.recipe import Recipe, Stage, dumps
from workbench.train.resume import TrainState, check_run_dir, keep_metrics_through, restore_newest
from workbench.train.sharding import any_rank, requested_engine
from workbench.train.steps import StepContext, StepInputs

__all__ = ["STOPPED_BY_GUARDRAIL", "Trainer", "train"]

STOPPED_BY_GUARDRAIL = "stopped_by_guardrail"


class Trainer:
    """One run of one resolved recipe into `run_dir`: setup, train (stages), save.

    Everything the run holds is declared here; `setup` checks the run directory, is handed the built run
    (`build_run`: model, data, evaluator, engine) and writes the run files, `build_optimizer` the optimizer of the
    current stage kind (its record's, `StageKind.optimizer`). The engine (`workbench.train.engine`) takes each
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
        self.state = TrainState()   # what a checkpoint saves and a resume restores
        self.status = "running"
        self.guarded = False             # run() holds the output guard: setup() does not take it again
        self.built: BuiltRun | None = None   # handed over by setup() (`build_run`)
        self.own: dict[str, object] = {}     # what each stage kind keeps of the run (`StageKind.context`), by kind
        # Built by build_optimizer():
        self.opt = self.sched = None
        self.opt_names: list[list[str]] = []
        self.params: list[torch.nn.Parameter] = []
        # Shown on the progress bar:
        self.latest_acc = None           # "worst/mean" held-out cell
        self.latest_guardrail = None     # "correct/total" at loop 1

    @property
    def looped(self):
        """The retrofit being trained (None before setup)."""
        return None if self.built is None else self.built.model

    @property
    def lineage(self) -> dict | None:
        parent = None if self.built is None else self.built.parent
        return None if parent is None else parent.lineage

    # -------------------------------------------------------------- setup
    def setup(self) -> None:
        """Checks the run directory, builds the run (`build_run`) and writes its first files (main process)."""
        r = self.recipe
        if not self.guarded:  # called by hand, not from run(): the guard decides before any write
            with self._guard():
                pass
        check_run_dir(self.run_dir, dumps(r), self.resume)
        self.acc.wait_for_everyone()  # every rank checks before the main process writes
        main = self.acc.is_main_process
        self.built = build_run(r, self.device, self.engine, self.acc.num_processes, self.recipe_dir,
                               self.choose_block, progress=self.progress and main)
        if main and not self.resume:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            write_json_atomic(self.run_dir / runs.RETROFIT, self.built.retrofit_record)
            write_bytes_atomic(self.run_dir / runs.RECIPE, dumps(r).encode())
            write_bytes_atomic(self.run_dir / runs.METRICS, b"")
        self.acc.wait_for_everyone()

    def build_optimizer(self, name: str) -> None:
        """The optimizer `name` (a stage kind's, `StageKind.optimizer`), over the steps of every stage it steps,
        as the engine steps it (`Engine.wrap`)."""
        if self.opt is not None:
            self.engine.release(self.opt)
        spec, looped = optimizer_named(name), self.looped
        for p in looped.parameters():
            p.requires_grad_(False)
        self.opt, self.opt_names = spec.build(looped, self.built.groups, self.recipe)
        if spec.frozen:   # the digest of everything it leaves frozen, checked unchanged by `finish`
            self.state.frozen_sha256 = rundir.state_sha256(looped)
        steps = sum(s.steps for s in self.stages if stage_kind(s.kind).optimizer.name == name)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, spec.schedule(self.recipe, steps))
        self.params = [p for g in self.opt.param_groups for p in g["params"]]
        self.opt = self.engine.wrap(looped, self.opt, spec.clip(self.recipe))
        self.state.optimizer = name

    # -------------------------------------------------------------- one step
    def stage_at(self, step: int) -> tuple[int, Stage, int]:
        """(stage index, stage, step within the stage) of a global step."""
        start = 0
        for i, s in enumerate(self.stages):
            if step < start + s.steps:
                return i, s, step - start
            start += s.steps
        raise IndexError(step)

    def kind_at(self, step: int) -> StageKind:
        """The record of the stage kind trained at a global step."""
        return stage_kind(self.stage_at(step)[1].kind)

    def context(self, kind: StageKind) -> StepContext:
        """What a step of `kind` reads of the run beside its rows; the kind's own part built at its first step."""
        if kind.context is not None and kind.name not in self.own:
            self.own[kind.name] = kind.context(self.built, self._log, self.progress and self.acc.is_main_process)
        r = self.recipe
        return StepContext(r.seed, r.sampler, r.halting, self.acc.process_index, self.acc.num_processes,
                           self.own.get(kind.name))

    def step(self, step: int) -> dict:
        """Trains one step: the stage kind's loss (its record's step), gradients over ranks, the checks the kind
        takes, clip, update; returns the step's metrics.jsonl record."""
        _, stage, local = self.stage_at(step)
        kind = stage_kind(stage.kind)
        rows = self.built.data.rows(step, stage)
        x = StepInputs(step, local, stage, rows, rows[self.acc.process_index::self.acc.num_processes],
                       stage.chain_weight_at(local), self.device, self.built.tokenizer)
        run = self.context(kind)
        self.opt.zero_grad(set_to_none=True)
        out = kind.step(self.looped, x, run)
        loss, loops, info = out.loss, out.loops, {"chain_weight": x.chain_weight, **out.info}
        if self.built.teacher is not None and kind.kl:
            kl = kl_to_base(self.looped, self._rehearsal(step), self.built.teacher)
            info["kl_base"] = round(float(kl.detach()), 6)
            loss = loss + self.recipe.preserve.kl_weight * kl
        total_loss, squares = self.engine.backward(self.opt, loss, self.params, self.acc, self.device)
        if not torch.isfinite(total_loss):
            self._stop_non_finite(step, f"the loss is {float(total_loss)}")
        if kind.liveness and loops >= 2 and "reentry" in self.built.groups:
            self._check_liveness(step, info, squares)
        lr = {g["name"]: g["lr"] for g in self.opt.param_groups}
        update = self.engine.update(self.opt, self.params, self.opt_names, squares, kind.optimizer.clip(self.recipe))
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
        batch = rehearsal_batch(self.built.tokenizer, texts, p.positions)
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
            optimizer = self.kind_at(step).optimizer.name
            if self.state.optimizer != optimizer:
                self.build_optimizer(optimizer)
            record = self.step(step)
            step += 1
            self.state.elapsed_s = time.perf_counter() - t0
            if step % self.recipe.log.every == 0 or step == self.total:
                self._log({**record, "elapsed_s": round(self.state.elapsed_s, 2)})
            evaluated = step % self.recipe.eval.every == 0 or step == self.total
            if evaluated:
                self._evaluate(step)
            g = self.recipe.guardrail
            if g.enabled and self.kind_at(step - 1).guardrail and (evaluated or (g.every and step % g.every == 0)):
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
            matrix, extra = self.built.evaluator.read(self.looped)
            cells = [v for row in matrix.values() for v in row.values()]
            self.latest_acc = f"{min(cells):.2f}/{sum(cells) / len(cells):.2f}"  # worst / mean cell
            self._log({"kind": "eval", "step": step, "acc": matrix, "min_active": min(cells),
                       "mean_active": sum(cells) / len(cells), **extra})
        self.acc.wait_for_everyone()

    def _check_guardrail(self, step: int) -> bool:
        """Scores the guardrail at loop 1 against the base; logs it; returns whether the run may go on."""
        passed = True
        if self.acc.is_main_process or self.engine.reads_on_every_rank:
            start = self.built.guardrail_start if step == 0 else None
            now = start or read_guardrail(self.looped, self.built.tokenizer)
            passed, record = judge_guardrail(self.built.guardrail_base, now, self.recipe.guardrail.max_drop, step)
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
                                     "guardrail": self._guardrail_record(), "precision": self.built.precision_record,
                                     "device": self.device_record, "lineage": self.lineage,
                                     "wall_s": round(self.state.elapsed_s, 1)})
        self.acc.wait_for_everyone()
        return self._summary(step, finished=False)

    def _guardrail_record(self) -> dict | None:
        base = self.built.guardrail_base
        return guardrail_provenance(base, self.run_dir / runs.METRICS, self.recipe.guardrail.max_drop)

    def _checkpoint(self, step: int) -> None:
        self.engine.before_save(self.opt, keep=self.acc.is_main_process)   # every rank; the main process saves
        if self.acc.is_main_process:
            rundir.save_checkpoint(self.run_dir, step, self.looped, self.built.groups, self.opt, self.opt_names,
                                   self.sched, self.state.to_dict(), keep=self.recipe.checkpoint.keep,
                                   protect=self.state.last_passing_step)
        self.acc.wait_for_everyone()

    def _load_checkpoint(self, ckpt: Path) -> dict:
        """Builds the optimizer the checkpoint was saved with and loads it; returns the state it stored."""
        self.build_optimizer(rundir.read_checkpoint_state(ckpt)["optimizer"])
        return rundir.load_checkpoint(ckpt, self.looped, self.built.groups, self.opt, self.opt_names, self.sched)

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
        """Writes the trained tensors and provenance; asserts a frozen base is bit-for-bit unchanged, and what a
        freezing optimizer froze (`Optimizer.frozen`) too."""
        run, base_unchanged = self.built, None
        frozen = self.state.frozen_sha256
        if frozen is not None and rundir.state_sha256(self.looped) != frozen:
            raise WorkbenchError(next(k.optimizer.freeze_message for k in map(stage_kind, self.recipe.kinds)
                                      if k.optimizer.frozen))
        if "block" not in run.groups:
            digest = runs.base_sha256(self.looped.base)
            if digest != run.frozen_hash:
                raise WorkbenchError(f"the base weights changed during a frozen-base run ({run.frozen_hash[:12]}... -> "
                                     f"{digest[:12]}...)")
            base_unchanged = True
        if self.acc.is_main_process:
            # A continued run writes only the tensors it changed and names its parent (`workbench.run_tensors`).
            write_tensors(self.run_dir / runs.TRAINABLE, runs.trained_state(self.looped, run.groups),
                          None if run.parent is None else run.parent.dir)
            t, e, heldout = self.recipe.task, self.recipe.eval, run.data.heldout
            manifests = {
                "heldout": {"rows": len(heldout), "rows_sha256": rows_sha256(heldout),
                            "row_ids_sha256": row_ids_sha256(heldout), "split": "test",
                            "depths": e.depths, "per_depth": e.per_depth, "seed": e.seed},
                "train": {"generator": f"workbench.tasks.task_row({t.name!r})", "split": "train",
                          "alphabet": run.data.options.get("alphabet"),
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
                                     "status": "finished", "precision": run.precision_record,
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
