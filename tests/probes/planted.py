"""Planted stand-ins for the loop-dynamics probes: every number a correct probe must give is known by construction.

    ContractionMachine  each block layer i's read-position state is c_i + lambda_i^t v (mode "contract" or
                        "expand") or c_i + rotation(theta t) v ("rotate"); head 0 of every layer attends
                        the same way at every pass (JS 0), head 1 flips between the first and the last real
                        key (JS ln 2 between any two consecutive passes).
    LensMachine         the state holds two symbols: `a` in the dimensions the unembedding reads directly
                        (the logit lens) and `c` in the dimensions only the Coda reads. The block applies the
                        row's own table (from the re-injected Prelude) to c and writes a = c + 1 (mod N), so
                        the logit lens always reads the next symbol in the alphabet, the coda lens reads x_t,
                        and a splice shows c is the causal one. `broken=True` shifts its forward logits, so
                        the coda lens at t = T is not the model's output.
    ScriptedMachine     candidate distributions and halting probabilities written out per pass: a row of depth
                        d reads a distinct wrong symbol with probability 0.4 before pass d, its answer with 0.7
                        at d and 0.95 after; its halting head continues (0.9) through pass d + 1 and stops (0.05)
                        from d + 2 on.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from transformer_lens import HookedRootModule

from tests.executors import StandIn
from workbench.loop.looped import LoopedOutput, LoopReadout, _Site
from workbench.loop.positions import last_real_token
from workbench.tasks.chase import parse_prompt
from workbench.tasks.reader import row_candidates


def _positions(input_ids, attention_mask):
    B, S = input_ids.shape
    last = torch.full((B,), S - 1) if attention_mask is None else last_real_token(attention_mask)
    return last.reshape(B, 1)


def _loop_sites(layers: int, heads: bool) -> _Site:
    block = nn.ModuleDict({str(i): (_Site("hook_resid_post", attn=_Site("hook_pattern")) if heads
                                    else _Site("hook_resid_post")) for i in range(layers)})
    return _Site("hook_input", "hook_state", "hook_readout", block=block)


class _Config:
    _attn_implementation = "eager"


class ContractionMachine(StandIn, HookedRootModule):
    """See the module docstring. Two block layers (0, 1); layer 1's output is the state."""

    RATES = (0.8, 0.5)
    halting = None

    def __init__(self, mode: str = "contract", max_loops: int = 10, theta: float = 0.3, expand: float = 1.5,
                 D: int = 6):
        super().__init__()
        assert mode in ("contract", "rotate", "expand")
        self.mode, self.max_loops, self.theta, self.expand, self.D = mode, max_loops, theta, expand, D
        self.a, self.b, self.n_layers = 0, 2, 2
        self.config = _Config()
        self.loop = nn.ModuleDict({str(t): _loop_sites(2, True) for t in range(1, max_loops + 1)})
        self.setup()

    def fixed_point(self, layer: int) -> torch.Tensor:
        c = torch.zeros(self.D, dtype=torch.float64)
        c[2 + layer] = 5.0            # off the plane of v, so rotation and contraction stay in dims 0-1
        return c

    def offset(self, input_ids) -> torch.Tensor:
        """v per row [B, D]: in dims 0-1, its size set by the prompt's tokens (so rows differ)."""
        v = torch.zeros(input_ids.shape[0], self.D, dtype=torch.float64)
        v[:, 0] = 1.0 + (input_ids.sum(-1).double() % 7)
        return v

    def layer_state(self, layer: int, t: int, v: torch.Tensor) -> torch.Tensor:
        c = self.fixed_point(layer)
        if self.mode == "rotate":
            a = self.theta * t
            rot = v.clone()
            rot[:, 0], rot[:, 1] = v[:, 0] * math.cos(a) - v[:, 1] * math.sin(a), v[:, 0] * math.sin(a) + v[:, 1] * math.cos(a)
            return c + rot
        lam = self.expand if self.mode == "expand" else self.RATES[layer]
        return c + lam ** t * v

    def _pattern(self, t: int, attention_mask, S: int, B: int) -> torch.Tensor:
        mask = torch.ones(B, S, dtype=torch.float64) if attention_mask is None else attention_mask.double()
        uniform = mask / mask.sum(-1, keepdim=True)
        first = torch.zeros(B, S, dtype=torch.float64)
        first[torch.arange(B), (mask.cumsum(-1) == 1).float().argmax(-1)] = 1.0
        last = torch.zeros(B, S, dtype=torch.float64)
        last[torch.arange(B), S - 1] = 1.0
        flip = first if t % 2 else last
        return torch.stack([uniform, flip], 1)[:, :, None, :].expand(B, 2, S, S)   # [B, H, q, k]

    def _loop(self, input_ids, attention_mask, loops):
        B, S = input_ids.shape
        v = self.offset(input_ids)
        for t in range(1, loops + 1):
            site = self.loop[str(t)]
            site.hook_input(torch.zeros(B, S, self.D, dtype=torch.float64))
            for i in range(2):
                block = site.block[str(i)]
                block.attn.hook_pattern(self._pattern(t, attention_mask, S, B))
                h = block.hook_resid_post(self.layer_state(i, t, v)[:, None, :].expand(B, S, self.D).clone())
            yield site.hook_state(h)

    def read(self, input_ids, attention_mask=None, loops=1, positions=None, candidates=None, return_states=False):
        positions = _positions(input_ids, attention_mask)
        C = candidates.shape[-1]
        states = [h.gather(1, positions[..., None].expand(-1, -1, self.D)) for h in self._loop(input_ids, attention_mask, loops)]
        scores = torch.zeros(input_ids.shape[0], loops, 1, C)
        return LoopReadout(scores=scores, positions=positions, states=torch.stack(states, 1) if return_states else None)


class _Scale(nn.Module):
    def __init__(self, D: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(D), requires_grad=False)

    def forward(self, x):
        return x * self.weight.to(x.dtype)


class LensMachine(StandIn, HookedRootModule):
    """See the module docstring. `rows` fix the symbols and their candidate token ids."""

    halting = None

    def __init__(self, tokenizer, rows: list[dict], max_loops: int = 8, broken: bool = False):
        super().__init__()
        self.tokenizer, self.symbols, self.max_loops, self.broken = tokenizer, list(rows[0]["symbols"]), max_loops, broken
        N = self.N = len(self.symbols)
        self.D = 2 * N + N * N
        self.a, self.b, self.n_layers = 0, 1, 2
        self.cands = row_candidates(tokenizer, rows[:1])[0]
        head = nn.Linear(self.D, len(tokenizer), bias=False)
        with torch.no_grad():
            head.weight.zero_()
            for k, tid in enumerate(self.cands.tolist()):
                head.weight[tid, k] = 1.0       # the unembedding reads the first N dimensions: symbol a
        head.weight.requires_grad_(False)
        self.base = nn.Module()
        self.base.model = nn.Module()
        self.base.model.norm = _Scale(self.D)
        self.base.lm_head = head
        self.loop = nn.ModuleDict({str(t): _loop_sites(1, False) for t in range(1, max_loops + 1)})
        self.setup()

    def _prelude(self, input_ids, attention_mask) -> torch.Tensor:
        N = self.N
        B, S = input_ids.shape
        p = torch.zeros(B, S, self.D)
        for b in range(B):
            ids = input_ids[b] if attention_mask is None else input_ids[b][attention_mask[b].bool()]
            _, inst = parse_prompt(self.tokenizer.decode(ids, skip_special_tokens=True))
            p[b, :, N + self.symbols.index(inst.start)] = 1
            for k, v in inst.table.items():
                p[b, :, 2 * N + self.symbols.index(k) * N + self.symbols.index(v)] = 1
        return p

    def _block(self, u, p):
        N = self.N
        c = u[..., N:2 * N].argmax(-1)                                           # [B, S]
        table = p[..., 2 * N:].reshape(*c.shape, N, N)
        nxt = table.gather(2, c[..., None, None].expand(*c.shape, 1, N)).squeeze(2).argmax(-1)
        h = torch.zeros_like(u)
        h[..., :N] = nn.functional.one_hot((nxt + 1) % N, N).float()
        h[..., N:2 * N] = nn.functional.one_hot(nxt, N).float()
        h[..., 2 * N:] = p[..., 2 * N:]
        return h

    def _coda(self, h):
        out = torch.zeros_like(h)
        out[..., :self.N] = h[..., self.N:2 * self.N]                            # the Coda reads c
        return out

    def _loop(self, input_ids, attention_mask, loops):
        p = self._prelude(input_ids, attention_mask)
        h = p
        for t in range(1, loops + 1):
            site = self.loop[str(t)]
            u = site.hook_input(h)
            h = site.hook_state(site.block["0"].hook_resid_post(self._block(u, p)))
            yield t, h

    def forward(self, input_ids, attention_mask=None, loops: int = 1):
        for t, h in self._loop(input_ids, attention_mask, loops):
            pass
        logits = self.base.lm_head(self.loop[str(loops)].hook_readout(self.base.model.norm(self._coda(h))))
        return LoopedOutput(logits=logits + (0.5 if self.broken else 0.0))

    def read(self, input_ids, attention_mask=None, loops=1, positions=None, candidates=None, return_states=False):
        positions = _positions(input_ids, attention_mask)
        W = self.base.lm_head.weight[candidates if candidates.dim() == 1 else candidates[0]]
        scores, states = [], []
        for t, h in self._loop(input_ids, attention_mask, loops):
            at = h.gather(1, positions[..., None].expand(-1, -1, self.D))
            readout = self.loop[str(t)].hook_readout(self.base.model.norm(self._coda(at)))
            scores.append(readout @ W.T)
            states.append(at)
        return LoopReadout(scores=torch.stack(scores, 1), positions=positions,
                           states=torch.stack(states, 1) if return_states else None)


class ScriptedMachine(StandIn, HookedRootModule):
    """See the module docstring: per-pass candidate distributions and halting probabilities written out per row."""

    def __init__(self, tokenizer, rows: list[dict], max_loops: int = 8):
        super().__init__()
        self.max_loops, self.a, self.b = max_loops, 0, 1
        self.halting = nn.Identity()            # "has a halting head": its probabilities come from the script
        self.by_prompt = {r["prompt"]: r for r in rows}
        self.tokenizer = tokenizer
        self.setup()

    def script(self, row: dict, T: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(candidate probabilities [T, C], continue probabilities [T]) of one row."""
        C, d, ans = len(row["symbols"]), row["depth"], row["symbols"].index(row["answer"])
        probs = torch.zeros(T, C)
        for t in range(1, T + 1):
            top, p = ((ans + t) % C, 0.4) if t < d else (ans, 0.7 if t == d else 0.95)
            probs[t - 1] = (1 - p) / (C - 1)
            probs[t - 1, top] = p
        cont = torch.tensor([0.9 if t <= d + 1 else 0.05 for t in range(1, T + 1)])
        return probs, cont

    def read(self, input_ids, attention_mask=None, loops=1, positions=None, candidates=None, return_states=False):
        B = input_ids.shape[0]
        rows = []
        for b in range(B):
            ids = input_ids[b] if attention_mask is None else input_ids[b][attention_mask[b].bool()]
            rows.append(self.by_prompt[self.tokenizer.decode(ids, skip_special_tokens=True)])
        scripts = [self.script(r, loops) for r in rows]
        scores = torch.stack([p.log() for p, _ in scripts])[:, :, None, :]       # [B, T, 1, C]
        states = torch.stack([p for p, _ in scripts])[:, :, None, :]             # any state: its steps are read
        return LoopReadout(scores=scores, positions=_positions(input_ids, attention_mask),
                           states=states if return_states else None,
                           halt_probs=torch.stack([c for _, c in scripts]))
