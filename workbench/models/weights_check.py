"""A model directory's weights checked against its config before anything is allocated.

`check_hf_weights(path, config)` reads the safetensors headers (the 8-byte length and the JSON
index; no tensor data), builds the model the config describes on the meta device (no memory),
and compares: every tensor the model expects is in the files, with the shape it expects and a
floating dtype, and every tensor's byte range lies inside its file. A weights file holding none
of the model's tensors, a config for a model other than the one saved, an 84-byte file under a
3 GB config, or a pickle renamed to .safetensors is a one-line `WorkbenchError`, not a random
model or minutes of allocation.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from workbench.errors import WorkbenchError

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
HEADER_MAX = 100 << 20  # a safetensors header beyond 100 MB is not one
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
               "F8_E4M3": 1, "F8_E5M2": 1}
FLOATING = ("F64", "F32", "F16", "BF16")


def read_safetensors_index(path: str | Path) -> dict[str, dict]:
    """Returns {tensor name: {"dtype", "shape", "data_offsets"}} from a safetensors file's header, checked.

    Raises:
        WorkbenchError: the file is not safetensors (a pickle, a text file, cut short), or a tensor's
            byte range does not match its shape and dtype or lies outside the file.
    """
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise WorkbenchError(f"'{path}' is not a safetensors file ({size} bytes)")
        n = struct.unpack("<Q", head)[0]
        if n > min(HEADER_MAX, size - 8):
            raise WorkbenchError(f"'{path}' is not a safetensors file (its header length {n} exceeds the file)")
        raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise WorkbenchError(f"'{path}' is not a safetensors file (its header is not JSON; a pickle renamed?)") from None
    if not isinstance(header, dict):
        raise WorkbenchError(f"'{path}' is not a safetensors file (its header is not an object)")
    data = size - 8 - n
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (start, end) = entry["dtype"], [int(d) for d in entry["shape"]], entry["data_offsets"]
            expected = DTYPE_BYTES[dtype]
            for d in shape:
                expected *= d
            ok = 0 <= int(start) <= int(end) <= data and int(end) - int(start) == expected and min(shape, default=0) >= 0
        except (KeyError, TypeError, ValueError):
            ok = False
        if not ok:
            raise WorkbenchError(f"'{path}': tensor '{name}' has a malformed or out-of-file entry in the header "
                                 "(file cut short or edited)")
        tensors[name] = {"dtype": dtype, "shape": shape}
    return tensors


def weights_index(folder: str | Path) -> dict[str, dict]:
    """The tensor index of a model directory: model.safetensors, or the shards its index JSON names."""
    folder = Path(folder)
    if (folder / SINGLE).is_file():
        return read_safetensors_index(folder / SINGLE)
    if (folder / INDEX).is_file():
        try:
            weight_map = json.loads((folder / INDEX).read_text())["weight_map"]
            shards = sorted(set(weight_map.values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError):
            raise WorkbenchError(f"'{folder / INDEX}' is not a safetensors index (no weight_map)") from None
        tensors = {}
        for shard in shards:
            shard_path = folder / str(shard)
            if Path(str(shard)).is_absolute() or ".." in Path(str(shard)).parts or not shard_path.is_file():
                raise WorkbenchError(f"'{folder / INDEX}' names shard {shard!r}, which is not a file in '{folder}'")
            tensors.update(read_safetensors_index(shard_path))
        return tensors
    raise WorkbenchError(f"model directory '{folder}' holds no {SINGLE} (or {INDEX}); the workbench loads "
                         "safetensors weights only")


def expected_tensors(config) -> dict[str, tuple[int, ...]]:
    """{name: shape} of every tensor the model of `config` saves, from a model built on the meta device."""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    shapes["__prefix__"] = getattr(model, "base_model_prefix", "") or ""  # a base model's file names lack it
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if getattr(text, "tie_word_embeddings", False) or getattr(config, "tie_word_embeddings", False):
        shapes.pop("lm_head.weight", None)  # saved once, as the embedding
    return shapes


def check_hf_weights(folder: str | Path, config, expected: dict[str, tuple[int, ...]] | None = None) -> None:
    """Refuses a model directory whose weights do not hold the tensors its config describes (nothing allocated).

    `expected` ({name: shape}) replaces `expected_tensors(config)` for a family the workbench writes itself.

    Raises:
        WorkbenchError: missing tensors, a shape that differs from the config's, a non-floating dtype, or
            weights files that are not safetensors.
    """
    folder = Path(folder)
    found = weights_index(folder)
    expected = expected_tensors(config) if expected is None else dict(expected)
    prefix = expected.pop("__prefix__", "") + "."
    for name in list(expected):  # a file saved from the base model (no "model." prefix) loads the same way
        bare = name.removeprefix(prefix)
        if name not in found and bare != name and bare in found:
            found[name] = found[bare]
    missing = [k for k in expected if k not in found]
    if missing:
        have = len(expected) - len(missing)
        raise WorkbenchError(f"model '{folder}': its weights lack {len(missing)} of the {len(expected)} tensors its "
                             f"config describes (first: '{missing[0]}'; {have} present); the weights are not this "
                             "config's model")
    for name, shape in expected.items():
        entry = found[name]
        if tuple(entry["shape"]) != shape:
            raise WorkbenchError(f"model '{folder}': tensor '{name}' is {tuple(entry['shape'])} in the weights, the "
                                 f"config describes {shape}; config.json does not match the weights")
        if entry["dtype"] not in FLOATING:
            raise WorkbenchError(f"model '{folder}': tensor '{name}' is stored as {entry['dtype']}; accepted: "
                                 f"{', '.join(FLOATING)}")
