"""Seconds per training step of a recipe, wall clock and this process's CPU time, without writing a run.

    .venv/bin/python scripts/step_seconds.py training/recurtrace_stage1_state.toml [--steps 5] [--set KEY=VALUE ...]

Builds the recipe's trainer exactly as `workbench train` does (guardrail, held-out evaluation and
`init_from` switched off: they cost time once, not per step), takes one untimed warm-up step of the
first stage, then times `--steps` steps. Prints one JSON line: wall and CPU seconds per step and the
loop count each timed step ran (a `sampled` stage draws it per step). On a shared machine the wall
figure includes waiting for a core; the CPU figure counts only this process's work.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from workbench.train.recipe import Recipe
from workbench.train.trainer import Trainer

QUIET = ["guardrail.enabled=false", "init_from=''", "eval.per_depth=1"]


def main(argv: list[str]) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("recipe")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--set", dest="overrides", action="append", default=[])
    args = p.parse_args(argv)
    recipe = Recipe.from_toml(args.recipe, args.overrides + QUIET)
    trainer = Trainer(recipe, Path(tempfile.mkdtemp()) / "run", progress=False)
    trainer.setup()
    trainer.build_optimizer(trainer.kind_at(0).optimizer.name)   # the first stage kind's (`workbench.train.kinds`)
    walls, cpus, loops = [], [], []
    for step in range(args.steps + 1):
        wall, cpu = time.perf_counter(), time.process_time()
        record = trainer.step(step)
        if step:  # step 0 is the warm-up
            walls.append(time.perf_counter() - wall)
            cpus.append(time.process_time() - cpu)
            loops.append(record["loops"])
    out = {"recipe": args.recipe, "overrides": args.overrides, "steps": args.steps, "loops": loops,
           "wall_s_per_step": round(sum(walls) / args.steps, 3), "cpu_s_per_step": round(sum(cpus) / args.steps, 3),
           "threads": torch.get_num_threads()}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
