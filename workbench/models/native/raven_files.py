"""A Raven-format checkpoint directory (Huginn-0125 and McLeish et al.'s retrofits), read as the hub ships it.

The directory holds `config.json` under the reference's field names (`n_embd`, `n_heads`, `n_layers_in_prelude`,
`n_layers_in_recurrent_block`, `n_layers_in_coda`, `mean_recurrence`, `block_size`, `rope_base`, ...), its weights
as safetensors (one file or shards with `model.safetensors.index.json`) under the reference's tensor names
(`transformer.core_block.{i}.attn.Wqkv.weight`, ...), and usually tokenizer files and the modeling code itself
(`raven_modeling_minimal.py`). This module reads the config and the weights; the registry (`own`) reads the
tokenizer and never imports the directory's code (one log line says so: `own.note_code`). Everything is checked
before any tensor is assigned: a config the family cannot run, a shard the index names and the directory lacks
(`workbench.models.weights_check` reads the headers), a tensor whose shape disagrees with the config (named), a
tensor missing or unexpected. Pickled `.bin` weights are refused, never unpickled.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from pathlib import Path

import torch

from workbench.errors import WorkbenchError
from workbench.models.weights_check import FLOATING, INDEX, SINGLE, weights_index

MODEL_TYPE = "huginn_raven"
# what the family implements; a config naming another variant is refused (the value it must have)
VARIANTS = {"block_class_name": "SandwichBlock", "norm_class_name": "RMSNorm_llama", "mlp_class_name": "GatedMLP",
            "nonlin_name": "SiLU", "injection_type": "linear"}


@dataclass(frozen=True)
class RavenConfig:
    """The sizes a Raven model is built from, under the reference config's names (defaults: Huginn-0125's)."""

    n_embd: int = 5280
    n_heads: int = 55
    intermediate_size: int = 17920
    vocab_size: int = 65536
    block_size: int = 4096
    n_layers_in_prelude: int = 2
    n_layers_in_recurrent_block: int = 4
    n_layers_in_coda: int = 2
    mean_recurrence: int = 32
    norm_eps: float = 1e-6
    rope_base: float = 50_000.0
    qk_bias: bool = True
    bias: bool = False
    tie_embeddings: bool = True
    model_type: str = MODEL_TYPE

    # the names the rest of the workbench reads (transformers' spelling)
    @property
    def hidden_size(self) -> int:
        return self.n_embd

    @property
    def num_attention_heads(self) -> int:
        return self.n_heads

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_heads

    @property
    def max_position_embeddings(self) -> int:
        return self.block_size

    @property
    def num_hidden_layers(self) -> int:
        return self.n_layers_in_prelude + self.n_layers_in_recurrent_block + self.n_layers_in_coda

    @property
    def embed_scale(self) -> float:
        """The Prelude multiplies the embeddings by sqrt(n_embd)."""
        return math.sqrt(self.n_embd)

    @property
    def init_std(self) -> float:
        """The standard deviation of the initial state before the embedding scale: sqrt(2 / (5 n_embd))."""
        return math.sqrt(2 / (5 * self.n_embd))

    def get_text_config(self) -> RavenConfig:
        return self


def read_config(path: Path) -> RavenConfig:
    """The directory's config.json as a RavenConfig, every size checked.

    Raises:
        WorkbenchError: an unreadable file, another architecture, a variant the family does not implement,
            a size that is not a positive integer, heads that do not divide n_embd, test-time noise.
    """
    try:
        raw = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as err:
        raise WorkbenchError(f"model '{path}': config.json cannot be read ({type(err).__name__})") from None
    if not isinstance(raw, dict) or raw.get("model_type") != MODEL_TYPE:
        found = raw.get("model_type") if isinstance(raw, dict) else None
        raise WorkbenchError(f"model '{path}' has model_type {found!r}, not the Raven format's '{MODEL_TYPE}'")
    for key, wanted in VARIANTS.items():
        if raw.get(key, wanted) != wanted:
            raise WorkbenchError(f"model '{path}': config {key}={raw[key]!r}; the raven family implements {wanted} only")
    if raw.get("test_time_noise", 0):
        raise WorkbenchError(f"model '{path}': config test_time_noise={raw['test_time_noise']!r}; the raven family "
                             "reads the noiseless recurrence only (set it to 0)")
    if raw.get("num_key_value_heads", raw.get("n_heads")) != raw.get("n_heads"):
        raise WorkbenchError(f"model '{path}': num_key_value_heads must equal n_heads in the Raven format")
    values = {}
    for f in fields(RavenConfig):
        if f.name not in raw:
            continue
        value = raw[f.name]
        if f.type == "int" and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise WorkbenchError(f"model '{path}': config {f.name}={value!r} must be a positive integer")
        if f.type == "float" and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
            raise WorkbenchError(f"model '{path}': config {f.name}={value!r} must be a positive number")
        if f.type == "bool" and not isinstance(value, bool):
            raise WorkbenchError(f"model '{path}': config {f.name}={value!r} must be true or false")
        values[f.name] = value
    config = RavenConfig(**values)
    if config.n_embd % config.n_heads or config.head_dim % 2:
        raise WorkbenchError(f"model '{path}': n_embd={config.n_embd} is not n_heads={config.n_heads} heads of an "
                             "even size")
    return config


def read_weights(path: Path, expected: dict[str, torch.Size], optional: frozenset[str],
                 dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Every tensor of the directory, its headers checked against the shapes the config implies first, in `dtype`.

    Args:
        path: the checkpoint directory (model.safetensors, or the shards model.safetensors.index.json names).
        expected: tensor name -> shape, from the model built on the meta device from the config.
        optional: names that may be absent (the tied head, the stored RoPE table).
        dtype: floating tensors are cast to it; the RoPE table stays fp32.
    Raises:
        WorkbenchError: only pickled .bin weights; a shard missing or not safetensors (`weights_index`); a tensor
            missing, unexpected, not floating, or of a shape the config disagrees with (named).
    """
    from safetensors.torch import load_file  # noqa: PLC0415 - loaded with the model readers only

    if not (path / SINGLE).is_file() and not (path / INDEX).is_file() and any(path.glob("*.bin")):
        raise WorkbenchError(f"model '{path}' has only pickled .bin weights; the workbench reads safetensors only "
                             "(it never unpickles a file); convert them with safetensors")
    headers = weights_index(path)
    for name, entry in headers.items():
        if name not in expected:
            raise WorkbenchError(f"model '{path}': tensor {name} is not part of a Raven model of this config")
        if tuple(entry["shape"]) != tuple(expected[name]):
            raise WorkbenchError(f"model '{path}': tensor {name} has shape {tuple(entry['shape'])} but the config "
                                 f"implies {tuple(expected[name])}")
        if entry["dtype"] not in FLOATING:
            raise WorkbenchError(f"model '{path}': tensor {name} is stored as {entry['dtype']}; accepted: "
                                 f"{', '.join(FLOATING)}")
    missing = sorted(set(expected) - set(headers) - optional)
    if missing:
        raise WorkbenchError(f"model '{path}': tensor {missing[0]} is missing ({len(missing)} missing)")
    if (path / SINGLE).is_file():
        files = [path / SINGLE]
    else:
        files = [path / f for f in sorted(set(json.loads((path / INDEX).read_text())["weight_map"].values()))]
    found: dict[str, torch.Tensor] = {}
    for file in files:
        for name, tensor in load_file(file).items():
            found[name] = tensor.float() if name == "freqs_cis" else tensor.to(dtype)
    return found
