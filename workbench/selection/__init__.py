"""Choosing the block before surgery (RecurTrace App. B): Stage 1 on the untrained base, then the window sweep.

- `stage1`: on the untrained base, the angular distance between adjacent layers, Kneedle knees (the loopable
  span) and window ablation (the damage an untrained loop 2 does); `selection_record` is block_selection.json,
  `resolve_block` what a recipe's block = "auto" asks;
- `window_sweep`: the window sweep: candidate windows, one short training run each, ranked on fresh held-out rows.

`workbench select-block` loads the base once and hands it to both.
"""
