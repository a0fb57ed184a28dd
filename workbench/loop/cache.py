"""A KV cache for a looped retrofit: one slot per (loop, layer) use of the shared layers.

transformers' attention keys its cache by each attention module's fixed `layer_idx`; a retrofit
runs the block's layer objects T times per token, so a plain cache would stack loop 2's keys on
loop 1's. `LoopCache` is a `DynamicCache` with one extra copy of the block layers' slots per loop
past the first, and `update` sends block layer i at loop t >= 2 to its own slot:

    Prelude and Coda layer i, and block layer i at loop 1   -> slot i (the base's own: loop 1 is the base)
    block layer i (a <= i < b) at loop t >= 2              -> slot n + (t - 2) (b - a) + (i - a)

`LoopedLM` sets the loop (`at_loop`) before each pass of the block. Loop-time memory needs nothing
from the cache: it attends over earlier loops at the same position only, which every decoding
step recomputes for its own tokens.
"""

from __future__ import annotations

import copy

from transformers.cache_utils import DynamicCache

from workbench.errors import WorkbenchError


class LoopCache(DynamicCache):
    """A `DynamicCache` for `loops` passes of a retrofit's block [a, b) in an n-layer base.

    Give it to `LoopedLM.forward(..., cache=...)` on the prompt, then on each new token with the
    attention mask of everything so far; every call must run the same number of loops.
    """

    def __init__(self, config, block: tuple[int, int], n_layers: int, loops: int):
        super().__init__(config=config)
        self.a, self.b = block
        self.n_layers, self.loops = n_layers, loops
        self.loop = 1
        if len(self.layers) != n_layers:
            raise WorkbenchError(f"the cache built {len(self.layers)} layer slots for a {n_layers}-layer model")
        block_slots = self.layers[self.a:self.b]
        self.layers += [copy.deepcopy(layer) for layer in block_slots * (loops - 1)]

    def at_loop(self, t: int) -> None:
        """The loop the block's next layer calls belong to (1..loops)."""
        if not 1 <= t <= self.loops:
            raise WorkbenchError(f"this cache holds loops 1..{self.loops}; loop {t} was asked for")
        self.loop = t

    def slot(self, layer_idx: int) -> int:
        """The cache slot of base layer `layer_idx` at the current loop."""
        if self.loop == 1 or not self.a <= layer_idx < self.b:
            return layer_idx
        return self.n_layers + (self.loop - 2) * (self.b - self.a) + layer_idx - self.a

    def update(self, key_states, value_states, layer_idx: int, *args, **kwargs):
        return super().update(key_states, value_states, self.slot(layer_idx), *args, **kwargs)
