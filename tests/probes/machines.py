"""Constructed looped "models" whose state encodes the chase exactly, so each probe's right answer is known.

A `TableMachine` state at every position is [one-hot of the current symbol (N) | the table f as
an N x N one-hot matrix]. The Prelude writes (x0, f) parsed from the prompt; the read decodes
the current symbol. The block differs by `mode`:

    carry     applies the table held in its own input state: a spliced state carries its own
              table, so after a splice the row follows the source row's orbit;
    prelude   applies the table of the re-injected Prelude (the row's own) to the symbol in its
              input: after a splice the row applies its own rule to the spliced symbol (lawful);
    shortcut  ignores its input and emits f^t(x0) of its own Prelude: a splice is ignored.

It has the LoopedLM hook names a probe uses (loop.{t}.hook_input, .block.0.hook_resid_post,
.hook_state) and its `read` / forward signatures.
"""

from __future__ import annotations

import torch
from torch import nn
from transformer_lens import HookedRootModule

from workbench.loop.looped import LoopReadout, _Site  # the same holder the real model's hook names come from
from workbench.loop.positions import last_real_token
from workbench.tasks.chase import parse_prompt

MODES = ("carry", "prelude", "shortcut")


class TableMachine(HookedRootModule):
    """See the module docstring. `symbols` must be the rows' symbols, in their order."""

    def __init__(self, tokenizer, symbols: list[str], mode: str = "carry", max_loops: int = 8):
        super().__init__()
        assert mode in MODES
        self.tokenizer, self.symbols, self.mode, self.max_loops = tokenizer, list(symbols), mode, max_loops
        self.N = len(symbols)
        self.a, self.b, self.n_layers = 0, 1, 1
        self.loop = nn.ModuleDict({str(t): _Site("hook_input", "hook_state",
                                                   block=nn.ModuleDict({"0": _Site("hook_resid_post")}))
                                   for t in range(1, max_loops + 1)})
        self.setup()

    def _prelude(self, input_ids, attention_mask) -> torch.Tensor:
        N = self.N
        B, S = input_ids.shape
        p = torch.zeros(B, S, N + N * N)
        for b in range(B):
            ids = input_ids[b] if attention_mask is None else input_ids[b][attention_mask[b].bool()]
            _, inst = parse_prompt(self.tokenizer.decode(ids, skip_special_tokens=True))
            p[b, :, self.symbols.index(inst.start)] = 1
            for k, v in inst.table.items():
                p[b, :, N + self.symbols.index(k) * N + self.symbols.index(v)] = 1
        return p

    def _apply(self, sym_state: torch.Tensor, table_state: torch.Tensor) -> torch.Tensor:
        """One-hot of f(symbol): symbol from sym_state[..., :N], f from table_state[..., N:]."""
        N = self.N
        sym = sym_state[..., :N].argmax(-1)                                     # [B, S]
        table = table_state[..., N:].reshape(*sym.shape, N, N)                  # [B, S, N, N]
        return table.gather(2, sym[..., None, None].expand(*sym.shape, 1, N)).squeeze(2)

    def _block(self, u: torch.Tensor, p: torch.Tensor, t: int) -> torch.Tensor:
        N = self.N
        if self.mode == "carry":
            return torch.cat([self._apply(u, u), u[..., N:]], -1)
        if self.mode == "prelude":
            return torch.cat([self._apply(u, p), p[..., N:]], -1)
        x = p
        for _ in range(t):
            x = torch.cat([self._apply(x, p), p[..., N:]], -1)
        return x

    def _loop(self, input_ids, attention_mask, loops):
        p = self._prelude(input_ids, attention_mask)
        h = p
        for t in range(1, loops + 1):
            site = self.loop[str(t)]
            u = site.hook_input(h)
            h = site.hook_state(site.block["0"].hook_resid_post(self._block(u, p, t)))
            yield h

    def forward(self, input_ids, attention_mask=None, loops: int = 1):
        for h in self._loop(input_ids, attention_mask, loops):
            pass
        return h

    def read(self, input_ids, attention_mask=None, loops=1, positions=None, candidates=None, return_states=False):
        B, S = input_ids.shape
        if positions is None:
            last = S - 1 if attention_mask is None else last_real_token(attention_mask)
            positions = torch.as_tensor(last).expand(B).reshape(B, 1)
        cands = candidates if candidates.dim() == 2 else candidates.expand(B, -1)
        index = torch.tensor([[self.symbols.index(self.tokenizer.decode([int(c)]).strip()) for c in row]
                              for row in cands])                                 # [B, C]
        scores, states = [], []
        for h in self._loop(input_ids, attention_mask, loops):
            at = h.gather(1, positions[..., None].expand(-1, -1, h.shape[-1]))  # [B, P, D]
            scores.append(at[..., :self.N].gather(-1, index[:, None, :].expand(-1, at.shape[1], -1)))
            states.append(at)
        return LoopReadout(scores=torch.stack(scores, 1), positions=positions,
                           states=torch.stack(states, 1) if return_states else None)
