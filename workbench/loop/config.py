"""RetrofitConfig: everything that decides a retrofit's architecture, declared in one place.

`workbench.loop.surgery.retrofit(base, config)` builds a `LoopedLM` from it, and the model
keeps it as `looped.retrofit_config`. A run directory's retrofit.json stores `config.to_dict()`
under "settings", and `RetrofitConfig.from_dict` reads it back, so the same function rebuilds
a trained run, its untrained control and a fresh retrofit:

    looped = retrofit(base, RetrofitConfig.from_dict(record["settings"]))

Trained tensors are not part of it: they load on top (`workbench.runs.load_run`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import NamedTuple

from workbench.errors import WorkbenchError

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
REENTRIES = ("bridge", "inject")   # the re-entry designs (`workbench.loop.reentry.REENTRY_DESIGNS`)
HALTING_POOLING = ("mean", "last")  # how the halting head pools the loop state (`workbench.loop.halting`)
MAX_LOOPS = 64  # the most loops a retrofit allocates hook points for (as the identity check's bound)


class Block(NamedTuple):
    """The looped layers start..end-1 of a decoder: `Block(10, 16)`, written "10:16" in a recipe or on the command
    line (`Block.parse`, the one place the string is read). A pair, so `a, b = block` unpacks it."""

    start: int
    end: int

    @classmethod
    def parse(cls, text: str, name: str = "block") -> Block:
        """Returns the block "A:B" names (layers A..B-1).

        Raises:
            WorkbenchError: not two integers around one colon; the message names the option (`name`).
        """
        lo, sep, hi = str(text).partition(":")
        if not sep or not lo.strip().isdigit() or not hi.strip().isdigit():
            raise WorkbenchError(f"{name} '{text}' is not of the form A:B (e.g. 10:16: layers 10..15 looped)")
        return cls(int(lo), int(hi))

    def __str__(self) -> str:
        return f"{self.start}:{self.end}"


@dataclass(frozen=True)
class LoraSettings:
    """One LoRA adapter on the block's projections, shared by every loop (`surgery.attach_lora`)."""

    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    targets: tuple[str, ...] = LORA_TARGETS

    def __post_init__(self):
        object.__setattr__(self, "targets", tuple(self.targets))

    def to_dict(self) -> dict:
        return {"r": self.r, "alpha": self.alpha, "dropout": self.dropout, "targets": list(self.targets)}


@dataclass(frozen=True)
class RetrofitConfig:
    """A looped retrofit's architecture.

    block: the looped layers (`Block`; a run's retrofit.json holds it as [a, b], read back by `from_dict`).
    reentry: "bridge" (the retrofit paper's split bridge) or "inject" (RecurTrace's additive injection).
    memory, memory_window, memory_heads: Loop Memory Attention before each block layer.
    max_loops: hook points exist for loops 1..max_loops.
    halting, halting_pooling: a halting head reading the pooled loop state.
    loop_codes: a learned vector per loop t >= 2 added at re-entry (`workbench.loop.reentry.LoopCodes`; in
        neither paper), so the weight-tied block can tell which loop it is in. Loop 1 never sees one.
    lora: the adapter on the block, or None.
    """

    block: Block
    reentry: str = "bridge"
    memory: bool = False
    max_loops: int = 16
    memory_window: int = 3
    memory_heads: int = 4
    halting: bool = False
    halting_pooling: str = "mean"
    loop_codes: bool = False
    lora: LoraSettings | None = field(default=None)

    def __post_init__(self):
        if not isinstance(self.block, Block):
            raise WorkbenchError(f"RetrofitConfig(block={self.block!r}): give a Block, e.g. Block(10, 16) or "
                                 "Block.parse('10:16')")
        if isinstance(self.max_loops, bool) or not isinstance(self.max_loops, int) or not 1 <= self.max_loops <= MAX_LOOPS:
            raise WorkbenchError(f"max_loops={self.max_loops!r} must be an integer in 1..{MAX_LOOPS} (hook modules "
                                 "are allocated for every loop)")
        if isinstance(self.lora, dict):
            object.__setattr__(self, "lora", LoraSettings(**self.lora))

    def to_dict(self) -> dict:
        """JSON-ready: the block as a list, `lora` present only when there is an adapter, `loop_codes` only when on.

        (A retrofit without loop codes writes exactly what it wrote before they existed, so every committed
        retrofit.json and every parent comparison stays as it was.)
        """
        out = {f.name: getattr(self, f.name) for f in fields(self)
               if f.name != "lora" and not (f.name == "loop_codes" and not self.loop_codes)}
        out["block"] = list(self.block)
        if self.lora is not None:
            out["lora"] = self.lora.to_dict()
        return out

    @classmethod
    def from_dict(cls, d: dict) -> RetrofitConfig:
        """The inverse of `to_dict`; a key it does not know is an error naming the accepted ones."""
        accepted = [f.name for f in fields(cls)]
        unknown = sorted(set(d) - set(accepted))
        if unknown:
            raise WorkbenchError(f"retrofit settings have unknown key '{unknown[0]}'; accepted: {', '.join(accepted)}")
        if "block" not in d:
            raise WorkbenchError("retrofit settings have no 'block' (the looped layers a:b)")
        lora = d.get("lora")
        if lora is not None:
            lora_keys = [f.name for f in fields(LoraSettings)]
            bad = sorted(set(lora) - set(lora_keys))
            if bad:
                raise WorkbenchError(f"retrofit settings: unknown lora key '{bad[0]}'; accepted: {', '.join(lora_keys)}")
            lora = LoraSettings(**lora)
        block = d["block"]
        if not (isinstance(block, list) and len(block) == 2 and all(type(x) is int for x in block)):
            raise WorkbenchError(f"retrofit settings: block {block!r} is not a pair of layer indices [a, b]")
        return cls(**{**d, "block": Block(*block), "lora": lora})
