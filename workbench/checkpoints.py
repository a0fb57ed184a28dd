"""A `--checkpoint` / `--model` spec, parsed once into a `Checkpoint` that every loader is handed.

    smollm2-chase, runs/x          a run directory or a shipped keeper's name       kind "run"
    DIR, tiny-raven, tiny-ouro     a native looped model (`workbench.models.native`) kind "native"
    untrained:RUN_DIR              that run's architecture, fresh and untrained      kind "untrained"
    untrained:BASE:A:B             a fresh retrofit of BASE at block A:B            kind "untrained"
    BASE with --block A:B          the same, for the reading commands (`parse_model`)

A keeper's name is resolved to its directory and a native family is read from its config.json here, once;
`workbench.runs.load_checkpoint` loads what the value names without asking again. The precision travels with it:
a native model is loaded and stored in it (`Checkpoint.precision`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from workbench.defaults import EMBEDDED_DEFAULT, resolve_run, shipped_keepers
from workbench.errors import WorkbenchError
from workbench.loop.config import Block
from workbench.models import TINY_CONFIGS
from workbench.models.native import native_family
from workbench.places import RETROFIT
from workbench.precision import PRECISIONS

UNTRAINED = "untrained:"
RUN, NATIVE, FRESH = "run", "native", "untrained"   # a Checkpoint's kinds


@dataclass(frozen=True)
class Checkpoint:
    """What a `--checkpoint` / `--model` spec names, parsed once.

    Attributes:
        given: the spec as written (kind "untrained" of a base: `untrained:BASE:A:B`), what summaries record.
        kind: "run", "native" or "untrained".
        run_dir: the run directory (a run, or the run an untrained control copies), a keeper's name resolved.
        family: a native model's family (its config's model_type).
        base: the base model of an untrained retrofit at `block`.
        block: that retrofit's looped layers.
        precision: "fp32" or "bf16" (`workbench.precision.PRECISIONS`): a native model is stored in it; a retrofit
            is rebuilt in fp32 (exact) and switched to bf16 reads by `workbench.precision.apply_precision` (the
            battery does so once its exact probes ran).
    """

    given: str
    kind: str
    run_dir: Path | None = None
    family: str | None = None
    base: str | None = None
    block: Block | None = None
    precision: str = "fp32"

    def __post_init__(self):
        if self.precision not in PRECISIONS:
            raise WorkbenchError(f"precision '{self.precision}' is not accepted; accepted: {', '.join(PRECISIONS)}")

    @property
    def reads(self) -> Path:
        """The directory loading reads, which no output may replace."""
        return self.run_dir if self.run_dir is not None else Path(self.base or self.given).expanduser()

    @property
    def has_block(self) -> bool:
        """Whether the spec names its own block (a run's, a native model's, an untrained retrofit's)."""
        return self.kind != RUN or (self.run_dir / RETROFIT).is_file()


def parse_checkpoint(spec: str, precision: str = "fp32") -> Checkpoint:
    """Returns the `Checkpoint` a `--checkpoint` spec names (the module docstring's table).

    The kind is told from the spec's text first (`untrained:`, else a native family), then the one directory it
    names is resolved once. Anything that is neither untrained nor native is a run directory; `load_checkpoint`
    refuses one that is not, with its own message.

    Raises:
        WorkbenchError: a malformed `untrained:` spec, an unknown precision, a keeper whose tensors are absent.
    """
    spec = str(spec)
    if not spec.startswith(UNTRAINED):
        family = native_family(spec)
        if family is not None:
            return Checkpoint(spec, NATIVE, family=family, precision=precision)
        return Checkpoint(spec, RUN, run_dir=resolve_run(spec), precision=precision)
    rest = spec.removeprefix(UNTRAINED)
    parts = str(Path(rest).expanduser()).rsplit(":", 2)   # BASE:A:B, as the directory `resolve_run` gives back
    run_dir = resolve_run(rest)
    if (run_dir / RETROFIT).is_file():   # a run's directory wins over a BASE:A:B reading of its name
        return Checkpoint(spec, FRESH, run_dir=run_dir, precision=precision)
    if len(parts) != 3 or not parts[0] or not all(p.isdigit() for p in parts[1:]):
        raise WorkbenchError(f"--checkpoint '{spec}' is not untrained:RUN_DIR or untrained:BASE:A:B "
                             f"(e.g. untrained:{EMBEDDED_DEFAULT}:10:16); shipped keepers (RUN_DIR by name): "
                             f"{', '.join(shipped_keepers())}")
    return Checkpoint(spec, FRESH, base=parts[0], block=Block(int(parts[1]), int(parts[2])), precision=precision)


def parse_model(spec: str, block: str | None = None, precision: str = "fp32") -> Checkpoint:
    """Returns the `Checkpoint` of a reading command's model (`lens`, `generate`): what `parse_checkpoint` takes, or
    a base model (an HF directory, a .gguf, the embedded default, a tiny config) with `block` "A:B": a fresh,
    untrained retrofit of that base looping layers A..B-1.

    Raises:
        WorkbenchError: a base without `block`, a `block` beside a model that has its own, a malformed block.
    """
    spec = str(spec)
    if block is not None:
        looped = _block_option(block)
        checkpoint = parse_checkpoint(spec, precision)
        if checkpoint.has_block:
            raise WorkbenchError(f"--block is for a base model; '{spec}' has its own block (drop --block)")
        base = str(checkpoint.run_dir)
        return Checkpoint(f"{UNTRAINED}{base}:{looped}", FRESH, base=base, block=looped, precision=precision)
    checkpoint = parse_checkpoint(spec, precision)
    if not checkpoint.has_block and _is_base(spec):
        raise WorkbenchError(f"'{spec}' is a base model: give --block A:B to loop its layers A..B-1 "
                             f"(e.g. --block 10:16), or a run directory, keeper or native looped model")
    return checkpoint


def _block_option(text: str) -> Block:
    lo, sep, hi = text.partition(":")
    if not sep or not lo.isdigit() or not hi.isdigit():
        raise WorkbenchError(f"--block '{text}' is not A:B (e.g. 10:16: layers 10..15 looped)")
    return Block(int(lo), int(hi))


def _is_base(spec: str) -> bool:
    path = Path(spec).expanduser()
    return spec in TINY_CONFIGS or spec == EMBEDDED_DEFAULT or path.suffix == ".gguf" or (path / "config.json").is_file()
