"""Training a retrofit: a recipe in, a strictly checked run directory out.

- `recipe`: the TOML recipe's schema, defaults, `--set` overrides and validation.
- `losses`: per-loop chain loss, RecurTrace's answer and halting losses, the preservation KL.
- `dense`: the dense controls (direct, scratchpad): their batches, losses and readers.
- `optim`: the optimizer's groups (W_p alone in `prelude_proj`) and its safeguards.
- `evaluate`: held-out accuracy per depth and loop.
- `audit`: the gradient-path audit (per-loop gradient RMS by group, a finite-difference check).
- `trainer`: `train(recipe)` and the `Trainer` behind it (stages, checkpoints, resume, guardrail).
- `rundir`: the run directory's files, checkpoints, provenance and `load_run`.
"""
