"""Training a retrofit: a recipe in, a strictly checked run directory out.

- `recipe`: the TOML recipe's schema, defaults, `--set` overrides and validation.
- `kinds`: the stage kinds, one `StageKind` record each, registered by its module in `stages/` beside its step.
- `losses`: per-loop chain loss, RecurTrace's answer and halting losses, the preservation KL.
- `dense`: the dense controls (direct, scratchpad): their batches, losses and readers.
- `optim`: the optimizer's groups (W_p alone in `prelude_proj`) and its safeguards.
- `evaluate`: held-out accuracy per depth and loop.
- `audit`: the gradient-path audit (per-loop gradient RMS by group, a finite-difference check).
- `build`: `build_run(recipe)`, what a Trainer is handed: the model, the data, the evaluator, the engine.
- `trainer`: `train(recipe)` and the `Trainer` behind it (stages, checkpoints, resume, guardrail).
- `oracle_sweep`: the halting stage's oracle sweep, computed and kept on disk by content.
- `rundir`: the run directory's files, checkpoints, provenance and `load_run`.
"""
