"""The looped families the workbench implements itself: one record each, the one registry every reader asks.

No installable package ships Raven's (Huginn-0125) or Ouro's modeling code: it sits beside the weights as remote
code, which the workbench never runs. For each such family a record says how its directory is recognised (its
config.json's `model_type`), how the directory is read (config, safetensors and tokenizer files; the `.py` files
never imported, and one log line says so), how its tiny random model is built, and what it offers beyond every
step hooked (an initial state, exits of its own). `load_looped`, the CLI's checkpoint resolution
(`native_family`), `workbench identity`, the docs and the tests read this registry; nothing else lists them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from workbench.errors import WorkbenchError
from workbench.models.native import ouro, raven
from workbench.models.native.contract import NativeLoopedLM
from workbench.models.native.ouro import OuroLooped
from workbench.models.native.raven import RavenLooped

log = logging.getLogger(__name__)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")


@dataclass(frozen=True)
class OwnFamily:
    """A looped family written here: recognised by `model_type`, read by `read`, built tiny by `tiny`."""

    name: str                # the family's short name (docs, messages)
    model_type: str          # config.json's model_type: how its directory is recognised
    adapter: type[NativeLoopedLM]
    read: Callable[[Path, torch.dtype], NativeLoopedLM]   # the directory's config and weights, strictly checked
    tiny: Callable[..., NativeLoopedLM]     # (dtype, tokenizer, seed, **tiny_sizes): a random model, eval, frozen
    tiny_name: str           # the spec of the tiny random model (`load_looped("tiny-raven")`)
    tiny_sizes: dict = field(hash=False)    # config.json fields of the tiny model (the tokenizer sizes its vocabulary)
    checkpoints: str         # the released checkpoints its directories hold
    holds: str               # what its directory holds: how a broken one's one-line error ends
    exits: str               # its own exits, as the papers use them
    fixture: str             # the reference's committed numbers on a tiny checkpoint (tests/fixtures/)

    @property
    def initial_state(self) -> bool:
        """Whether its loop starts from a state of its own (Raven's s_0): `init_state=` / `init_seed=` apply."""
        return self.adapter.has_initial_state

    def load(self, path: Path, dtype: torch.dtype) -> tuple[NativeLoopedLM, object]:
        """(looped, tokenizer or None) from a directory of this family: its code named in a log line, never run."""
        note_code(path)
        return self.read(path, dtype), read_tokenizer(path)


def note_code(path: Path) -> None:
    """One log line (a warning: the CLI prints it) when the directory carries modeling code: it is never imported."""
    code = sorted(p.name for p in path.glob("*.py"))
    if code:
        log.warning("model '%s' carries modeling code (%s); the workbench reads its config and weights only and "
                    "never imports that code", path, ", ".join(code))


def read_tokenizer(path: Path):
    """The directory's tokenizer (transformers' fast tokenizer, no remote code), or None when it has no files."""
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        log.info("model '%s' has no tokenizer files: loaded weights only (tokenizer None)", path)
        return None
    from transformers import AutoTokenizer, PreTrainedTokenizerFast  # noqa: PLC0415 - with the model readers only

    if (path / "tokenizer.json").is_file():  # the hub's fast tokenizer (AutoTokenizer would read config.json too)
        return PreTrainedTokenizerFast.from_pretrained(path)
    return AutoTokenizer.from_pretrained(path, trust_remote_code=False)


OWN_FAMILIES: dict[str, OwnFamily] = {f.model_type: f for f in (
    OwnFamily(
        name="raven", model_type="huginn_raven", adapter=RavenLooped, read=raven.load, tiny=raven.tiny,
        tiny_name="tiny-raven",
        # 2 Prelude, 2 recurrent, 2 Coda layers, hidden 64, 8 steps by default (Huginn-0125's shape, shrunk)
        tiny_sizes=dict(n_embd=64, n_heads=4, intermediate_size=128, block_size=1024, n_layers_in_prelude=2,
                        n_layers_in_recurrent_block=2, n_layers_in_coda=2, mean_recurrence=8),
        checkpoints="Huginn-0125 and every Raven-format checkpoint (McLeish et al.'s retrofitted TinyLlama, OLMo, "
                    "Llama)",
        holds="a Raven-format directory: config.json, safetensors, tokenizer files",
        exits="Huginn's zero-shot exits (KL between successive steps, latent difference, entropy difference, argmax "
              "stability, cosine) at the reference's default thresholds",
        fixture="tests/fixtures/raven"),
    OwnFamily(
        name="ouro", model_type="ouro", adapter=OuroLooped, read=ouro.load, tiny=ouro.tiny, tiny_name="tiny-ouro",
        # 2 layers, hidden 64, the stack looped 4 times; the exit threshold reached at different steps by different
        # tokens
        tiny_sizes=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, total_ut_steps=4, early_exit_threshold=0.6,
                        max_position_embeddings=1024),
        checkpoints="Ouro-1.4B and Ouro-2.6B",
        holds="an ouro checkpoint directory: config.json and safetensors weights",
        exits="the learned exit gate: each token exits at the first step whose cumulative exit probability reaches "
              "early_exit_threshold (the CDF rule; exit_at_step = loops - 1)",
        fixture="tests/fixtures/ouro"),
)}
OWN_TINY: dict[str, OwnFamily] = {f.tiny_name: f for f in OWN_FAMILIES.values()}


def require_initial_state(model, option: str, who: str) -> None:
    """The one-line refusal of an initial state (`option`) given to `model` (named `who`) when its loop does not start
    from a state of its own."""
    if not model.has_initial_state:
        having = ", ".join(f.name for f in OWN_FAMILIES.values() if f.initial_state)
        raise WorkbenchError(f"{option}: only a family whose loop starts from a state of its own ({having}) takes "
                             f"one; {who} has none")


def seed_initial_state(model, init_seed: int | None, who: str) -> None:
    """Sets the seed every read of `model` draws s_0 from when a call gives none (`--init-seed`; None: the model's
    default, 0); refuses a model without an initial state."""
    if init_seed is None:
        return
    require_initial_state(model, "--init-seed", who)
    model.init_seed = init_seed
