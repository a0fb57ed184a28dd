"""Starting and resuming a run directory: what may be trained into it, and the newest checkpoint that loads.

- `check_run_dir`: a fresh run needs an empty directory; a resume needs the same resolved recipe, a checkpoint
  to continue from, and a run that is not finished (its history is kept).
- `restore_newest`: the newest intact checkpoint (a damaged one gives way to the one before it).
- `keep_metrics_through`: metrics.jsonl cut back to the restored step, so the resumed run logs each step once.
- `TrainState`: the trainer's mutable state, every key a checkpoint's state.json holds beside its step.
"""

from __future__ import annotations

import difflib
import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import tomllib
from safetensors import SafetensorError

from workbench import runs
from workbench.errors import WorkbenchError
from workbench.io import write_bytes_atomic
from workbench.train import rundir
from workbench.train.recipe import Recipe, dumps

STORED_AS = {"frozen_sha256": "stage2_frozen_sha256"}   # state.json's key of a field named otherwise


@dataclass
class TrainState:
    """What a checkpoint saves (state.json, beside "step") and a resume restores: the trainer's mutable state.

    `to_dict` writes the keys checkpoints have always held, so run directories written before this class existed
    resume and new checkpoints are byte-identical to theirs: the frozen digest is written only once a freezing
    optimizer (the halting stage's) has been set up (it was absent before), under the key it has always had
    (`STORED_AS`: the halting stage was first called Stage 2).
    """

    live_projections: int | None = None     # the step W_p / W_s (or alpha) first got gradient (liveness)
    live_gate: int | None = None            # the step the bridge gate first got gradient
    elapsed_s: float = 0.0                  # training seconds so far, over every resume
    optimizer: str | None = None            # the optimizer built: "main" or "halting" (None: none yet)
    last_passing_step: int | None = None    # the last step whose guardrail reading passed
    frozen_sha256: str | None = None        # digest of everything but the halting head when the halting stage began

    def to_dict(self) -> dict:
        """The state as state.json holds it (without "step")."""
        out = {STORED_AS.get(k, k): v for k, v in asdict(self).items()}
        if out[STORED_AS["frozen_sha256"]] is None:
            del out[STORED_AS["frozen_sha256"]]
        return out

    @classmethod
    def from_dict(cls, stored: dict) -> TrainState:
        """The state a checkpoint's state.json holds (its "step" is not state); missing keys take their defaults."""
        state = cls()
        state.update(stored)
        return state

    def update(self, stored: dict) -> None:
        """Takes every declared key `stored` (a checkpoint's state) holds; keys it lacks keep their value, and a key
        this class does not declare is not read (no version of the trainer wrote one)."""
        for f in fields(self):
            if STORED_AS.get(f.name, f.name) in stored:
                setattr(self, f.name, stored[STORED_AS.get(f.name, f.name)])


def check_run_dir(run_dir: Path, recipe_text: str, resume: bool) -> None:
    """Refuses to train a fresh run into a directory that holds one, or to resume with another recipe.

    `recipe_text` is the resolved recipe (`recipe.dumps`). A stored recipe is compared after resolving it through
    this version's defaults, so a run started before a new option existed (written without its key) resumes when
    the option keeps its default.
    """
    recipe_file = Path(run_dir) / runs.RECIPE
    if not resume:
        if recipe_file.exists() or (Path(run_dir) / runs.CHECKPOINTS).exists():
            raise WorkbenchError(f"run directory '{run_dir}' already holds a run; pass --resume or another --out")
        return
    if not recipe_file.is_file():
        raise WorkbenchError(f"--resume: '{run_dir}' holds no {runs.RECIPE}; nothing to resume")
    try:
        stored = dumps(Recipe.from_dict(tomllib.loads(recipe_file.read_text())))
    except (tomllib.TOMLDecodeError, WorkbenchError) as e:
        raise WorkbenchError(f"--resume: {recipe_file} is not a valid recipe ({e})") from None
    check_resumable(run_dir)
    if stored != recipe_text:
        changed = [a[1:].strip() for a in difflib.unified_diff(stored.splitlines(), recipe_text.splitlines(),
                                                               lineterm="", n=0)
                   if a[:1] in "+-" and a[:3] not in ("+++", "---")]
        raise WorkbenchError(f"--resume: the resolved recipe differs from {recipe_file} "
                             f"({'; '.join(changed[:6])}); resume with the same recipe and --set overrides")


def _status(prov_path: Path) -> str | None:
    """A run's provenance status ("finished" when the file has none), "unreadable", or None without the file."""
    if not prov_path.is_file():
        return None
    try:
        prov = json.loads(prov_path.read_text())
    except (ValueError, UnicodeDecodeError):
        return "unreadable"
    return prov.get("status", "finished") if isinstance(prov, dict) else "unreadable"


def check_resumable(run_dir: Path) -> None:
    """Refuses a resume that would lose history: a finished run (an exported run, a shipped keeper), or a run
    with metrics or provenance but no checkpoint to continue from (it would restart at step 0)."""
    status, metrics = _status(Path(run_dir) / runs.PROVENANCE), Path(run_dir) / runs.METRICS
    if status == "finished":
        raise WorkbenchError(f"--resume: '{run_dir}' is a finished run ({runs.PROVENANCE}); nothing is "
                             "left to train and its history is kept: train into another --out (init_from "
                             "continues from it)")
    if not rundir.checkpoints(run_dir):
        lines = len(metrics.read_bytes().splitlines()) if metrics.is_file() else 0
        if lines or status is not None:
            raise WorkbenchError(f"--resume: '{run_dir}' has no checkpoint to continue from; resuming would "
                                 f"restart at step 0 and discard its {runs.METRICS} ({lines} lines): train "
                                 "into another --out")


def restore_newest(run_dir: Path, load: Callable[[Path], dict]) -> tuple[int, dict, list[str]]:
    """Returns (step, state, failures) of the newest checkpoint `load(checkpoint_dir)` loads; step 0 without one.

    `load` builds what the checkpoint needs and loads it, returning the trainer state it stored (with "step"). A
    checkpoint that fails to load (a file cut short or edited) is listed in `failures` and the one before it tried.

    Raises:
        WorkbenchError: there are checkpoints and none of them loads.
    """
    done = rundir.checkpoints(run_dir)
    failures = []
    for candidate in reversed(done):
        ckpt = Path(run_dir) / runs.CHECKPOINTS / f"step_{candidate}"
        try:
            state = load(ckpt)
        except (WorkbenchError, OSError, ValueError, KeyError, SafetensorError) as err:  # a damaged checkpoint
            # its files by name within step_N (the message names the run): a deep run directory's path would take
            # the 120 characters and cut the file and the fault off
            first = str(err).splitlines()[0].replace(f"{ckpt}{os.sep}", "")[:120] if str(err) else ""
            failures.append(f"step_{candidate}: {type(err).__name__}: {first}")
            continue
        return state.pop("step"), state, failures
    if done:
        raise WorkbenchError(f"--resume: no checkpoint of '{run_dir}' loads ({'; '.join(failures)[:300]}); "
                             "remove the checkpoints directory to start over")
    return 0, {}, failures


def keep_metrics_through(run_dir: Path, step: int) -> None:
    """Drops metrics.jsonl lines logged after `step` (and lines cut short by a kill); from step 0 none is kept."""
    kept = []
    path = Path(run_dir) / runs.METRICS
    for line in path.read_text().split("\n"):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # empty, or a line cut short by the kill
            continue
        if step and record["step"] <= step:
            kept.append(line + "\n")
    write_bytes_atomic(path, "".join(kept).encode())
