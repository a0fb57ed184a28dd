"""The stage kinds a recipe may name: one record each (`StageKind`), registered by the module beside its step.

A kind's module (`workbench/train/stages/<name>.py`, or a module of a contributor's own) defines its step function and
ends with `register(StageKind(...))`: the record says everything the recipe's checks, the trainer and the device tests
read of the kind (its step, its optimizer and clipping, which checks apply, how a run of it is evaluated, which loops
it runs, what it saves). Nothing else lists the kinds: the recipe accepts the names registered here, the trainer
dispatches through the record, tests/test_devices.py trains each kind's `example`.

The shipped kinds' modules are imported the first time the registry is read (`kinds()`), so reading a recipe's
module costs no torch; a module registered later (a contributor's, a test's) joins them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from workbench.errors import WorkbenchError

STAGES = Path(__file__).parent / "stages"   # the shipped kinds' modules, one file each


@dataclass(frozen=True)
class Optimizer:
    """How the steps of the kinds that share it are optimized; a run switches optimizer when the kind's differs.

    Attributes:
        name: what a checkpoint's state.json records ("main", "halting"); a resume builds the optimizer named there.
        build: (model, the run's trained groups, recipe) -> (optimizer, parameter names per group); it marks what
            trains and checks what it must.
        schedule: (recipe, steps of the stages it optimizes) -> the learning-rate factor of a step (`optim.lr_factor`).
        clip: recipe -> the gradient clipping norm of its steps (0: none).
        frozen: everything it does not train is frozen for its stages: the digest of the rest is recorded when it is
            built and checked unchanged when the run finishes (`freeze_message` says what moved).
    """

    name: str
    build: Callable
    schedule: Callable
    clip: Callable
    frozen: bool = False
    freeze_message: str = ""


@dataclass(frozen=True)
class StageKind:
    """One stage kind: what a recipe's `kind = "<name>"` trains and everything the run reads of it.

    Attributes:
        name: the recipe value `stages.N.kind`.
        step: (model, StepInputs, StepContext) -> StepLoss (`workbench.train.steps`): one step's loss.
        optimizer: the `Optimizer` of its steps.
        loops: (recipe, stage) -> the largest loop count a step of the stage runs (`Recipe.needed_loops`).
        check: (recipe, stage index) -> None, raising WorkbenchError: its cross-key checks, run when a recipe is read.
        kl: the preservation KL ([preserve] kl_weight) is added to its loss.
        liveness: the re-entry's liveness is checked on its steps of two loops or more.
        guardrail: the guardrail is read at its evaluations (and every [guardrail] every steps).
        answers: trains multi-token answers (state, arith), not only one-token symbols.
        arm: the controls it is one of ("dense control"; "": none): an arm of its own, every stage of its recipe has
            its kind.
        reader: (model, tokenizer, rows, kind, batch_size) -> ({depth: {loop: accuracy}}, frame) that an arm's
            held-out rows are read with; None: the looped reader (`workbench.train.evaluate.evaluate`).
        reads_past: its runs' evaluations also read loops past each depth, to `sampler.max`.
        stage_keys: the optional stage keys (beside steps, depths, weights and chain weights) only it reads.
        new_head: a recipe of only such stages may add a fresh halting head to a parent trained without one.
        context: (BuiltRun, log) -> what its steps read of the run beyond the step's rows, built once per run
            (`StepContext.own`); None: nothing.
        example: the tables of a tiny run (on top of tests/training/conftest.py's TINY_RECIPE) training it: the
            device tests train every registered kind's examples.
    """

    name: str
    step: Callable
    optimizer: Optimizer
    loops: Callable
    check: Callable = lambda recipe, i: None
    kl: bool = True
    liveness: bool = True
    guardrail: bool = True
    answers: bool = False
    arm: str = ""
    reader: Callable | None = None
    reads_past: bool = False
    stage_keys: tuple[str, ...] = ()
    new_head: bool = False
    context: Callable | None = None
    example: dict[str, dict] = field(default_factory=dict)


_KINDS: dict[str, StageKind] = {}
_SHIPPED: list[str] = []   # the shipped modules once imported (empty: not yet)


def register(kind: StageKind) -> StageKind:
    """Adds a stage kind to the registry (a kind module's last line); returns it.

    Raises:
        WorkbenchError: a name already registered by another record.
    """
    known = _KINDS.get(kind.name)
    if known is not None and known != kind:
        raise WorkbenchError(f"stage kind '{kind.name}' is registered twice")
    _KINDS[kind.name] = kind
    return kind


def unregister(name: str) -> None:
    """Removes a registered kind (a contributor's module unloaded, a test's kind after the test)."""
    _KINDS.pop(name, None)


def kinds() -> dict[str, StageKind]:
    """{name: StageKind} of every registered kind, the shipped ones first (imported on the first read)."""
    if not _SHIPPED:
        _SHIPPED.extend(sorted(p.stem for p in STAGES.glob("*.py") if not p.stem.startswith("_")))
        for stem in _SHIPPED:
            importlib.import_module(f"workbench.train.stages.{stem}")   # loaded by name, as the probes are
    return dict(_KINDS)


def names() -> tuple[str, ...]:
    """The registered kinds' names: what `stages.N.kind` accepts."""
    return tuple(kinds())


def stage_kind(name: str) -> StageKind:
    """The record of kind `name`.

    Raises:
        WorkbenchError: an unregistered name, listing the registered ones.
    """
    found = kinds().get(name)
    if found is None:
        raise WorkbenchError(f"stage kind '{name}' is unknown; accepted: {', '.join(names())}")
    return found


def optimizer_named(name: str) -> Optimizer:
    """The `Optimizer` a checkpoint names (state.json's `optimizer`)."""
    found = next((k.optimizer for k in kinds().values() if k.optimizer.name == name), None)
    if found is None:
        raise WorkbenchError(f"a checkpoint names optimizer '{name}', which no stage kind uses")
    return found
