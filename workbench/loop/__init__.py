"""The looped model: a pretrained decoder split into Prelude / Block / Coda with the Block run T times.

- `config`: `Block` (the looped layers) and `RetrofitConfig` (the whole architecture).
- `surgery`: `retrofit(base, config)` builds a `LoopedLM` over the base's own weights;
  `attach_lora`, `parameter_groups`, `parameter_report`.
- `looped`: `LoopedLM`, its forward, `read` (scores per loop at chosen positions) and the hook
  points of every site in every loop.
- `reentry`: how loop t's state goes back in (the split bridge, additive injection).
- `memory`: Loop Memory Attention over the previous loops' states.
- `halting`: the halting head and the oracle labels it is trained on.
- `attention`: the attention-pattern hook the looped forward installs on the base's layers.
- `components`: the attention / MLP output hooks (`attn_out`, `mlp_out`) the looped forwards install per layer call.
- `identity`: the loop-1 identity check: loop 1 of a retrofit against the untouched base, exactly.

Nothing in this package imports probes, training, presentation or the CLI.
"""
