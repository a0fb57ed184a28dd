"""Native looped models: looped architectures that transformers ships, read with the workbench's looped interface.

`load_looped(spec)` returns `(looped, tokenizer)` for a local Hugging Face directory of a supported family
or a tiny random test model. Each family is one file written to the adapter contract
(`workbench.models.native.contract`, docs/adding-a-looped-architecture.md):

- `inkling`: transformers' Inkling2Loop (`inkling2_loop_text`, or the composite `inkling2_loop`, text only)
- `hrm`: transformers' HRM-Text (`hrm_text`)
- `raven`: Huginn-0125 and every Raven-format checkpoint (`huginn_raven`), written here (no package ships it):
  its directory's config, safetensors and tokenizer are read, its modeling code never (`raven_files`)
- `ouro`: Ouro (`ouro`), written here (`ouro_modules`): no package ships its code, and the directory's is never run

The adapters hold transformers' model by reference and call its own modules; with no hook attached
their logits are bit-identical to `AutoModelForCausalLM`'s (tests/test_native.py).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText, AutoTokenizer
from transformers.utils import logging as hf_logging

from workbench.errors import WorkbenchError, user_files
from workbench.models.bases import load_tokenizer, torch_layers_only
from workbench.models.native import ouro
from workbench.models.native.contract import NativeLoopedLM
from workbench.models.native.hrm import HrmLooped
from workbench.models.native.inkling import InklingLooped
from workbench.models.native.ouro import OuroLooped
from workbench.models.native.raven import RavenLooped, load_raven, tiny_raven
from workbench.models.native.raven_files import RavenConfig

# model_type in config.json -> adapter class
FAMILIES: dict[str, type[NativeLoopedLM]] = {
    "inkling2_loop_text": InklingLooped,
    "inkling2_loop": InklingLooped,
    "hrm_text": HrmLooped,
    "huginn_raven": RavenLooped,
    "ouro": OuroLooped,
}
# families written here rather than read through transformers (their directories' code is never run):
# a raw-model reader wrapped by its FAMILIES adapter (Raven), or a module with `load(path, dtype)` and `tiny(...)`
# returning the adapter itself (Ouro)
OWN_READERS = {"huginn_raven": load_raven}
OWN = {"ouro": ouro}
WRITTEN_HERE = frozenset(OWN_READERS) | frozenset(OWN)
# looped families without an adapter, and why (a config of one of these is refused by name); none today
UNSUPPORTED: dict[str, str] = {}
TINY_SEED = 20260702
TINY_NATIVE: dict[str, dict] = {
    # 4 layers, hidden 64: layer 0 before the loop, layers 1-2 looped 3 times, layer 3 after; both attention kinds
    "tiny-inkling2-loop": dict(
        model_type="inkling2_loop_text", hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, swa_num_attention_heads=4, swa_num_key_value_heads=2, swa_head_dim=16,
        sliding_window_size=8, d_rel=4, rel_extent=16, n_layers_per_attn_res_block=1, moe_intermediate_size=32,
        n_routed_experts=4, num_experts_per_tok=2, loop_layer_index_start=1, loop_layer_index_end=3,
        loop_num_passes=3, loop_gate_rank=8, layer_types=["hybrid_sliding", "hybrid", "hybrid_sliding", "hybrid"],
        max_position_embeddings=1024),
    # 2 layers per stack, hidden 64, 2 H cycles of 2 L cycles each
    "tiny-hrm-text": dict(
        model_type="hrm_text", hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        head_dim=16, H_cycles=2, L_cycles=2, max_position_embeddings=1024),
    # 2 Prelude, 2 recurrent, 2 Coda layers, hidden 64, 8 steps by default (Huginn-0125's shape, shrunk)
    "tiny-raven": dict(
        model_type="huginn_raven", n_embd=64, n_heads=4, intermediate_size=128, block_size=1024,
        n_layers_in_prelude=2, n_layers_in_recurrent_block=2, n_layers_in_coda=2, mean_recurrence=8),
    # 2 layers, hidden 64, the stack looped 4 times; the exit threshold reached at different steps by different tokens
    "tiny-ouro": dict(
        model_type="ouro", hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, total_ut_steps=4, early_exit_threshold=0.6, max_position_embeddings=1024),
}


def native_family(spec: str | os.PathLike) -> str | None:
    """The model_type of a directory's config.json when it is a native looped family, else None (nothing loaded)."""
    if str(spec) in TINY_NATIVE:
        return TINY_NATIVE[str(spec)]["model_type"]
    config = Path(str(spec)).expanduser() / "config.json"
    if not config.is_file():
        return None
    try:
        model_type = json.loads(config.read_text()).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None
    return model_type if model_type in FAMILIES or model_type in UNSUPPORTED else None


def load_looped(spec: str | os.PathLike, dtype: torch.dtype = torch.float32,
                tokenizer: object | None = None) -> tuple[NativeLoopedLM, object]:
    """Returns `(looped, tokenizer)` for a native looped model, in eval mode, every parameter frozen.

    Args:
        spec: a local Hugging Face directory of a supported family (a Raven-format directory: its config,
            safetensors and tokenizer read, its code never), or `tiny-inkling2-loop` / `tiny-hrm-text` / `tiny-raven`.
        dtype: parameter dtype (fp32 by default; bf16 keeps the modules transformers keeps in fp32).
        tokenizer: the tokenizer of a tiny model (its vocabulary sizes the model; the embedded default's when
            None); a directory has its own.
    Raises:
        WorkbenchError: an unsupported family, a directory whose weights do not match its config, a broken file.
    """
    hf_logging.disable_progress_bar()
    spec_str = str(spec)
    if spec_str in TINY_NATIVE:
        tok = tokenizer if tokenizer is not None else load_tokenizer()
        sizes = dict(TINY_NATIVE[spec_str])
        if sizes["model_type"] in OWN:
            return _with_pad(OWN[sizes.pop("model_type")].tiny(dtype, tok, TINY_SEED, **sizes), tok, spec_str)
        model = _tiny(spec_str, dtype, tok)
    else:
        path = Path(spec_str).expanduser()
        if not (path / "config.json").is_file():
            raise WorkbenchError(f"native looped model '{spec_str}' is not a directory with config.json "
                                 f"(or one of {', '.join(TINY_NATIVE)})")
        family = _model_type(path)
        if family in OWN:
            with user_files(spec_str, f"an {family} checkpoint directory: config.json and safetensors weights"):
                looped, tok = OWN[family].load(path, dtype)
            return _with_pad(looped, tok, spec_str)
        if family not in FAMILIES:
            why = UNSUPPORTED.get(family, "it is not a looped family the workbench has an adapter for")
            raise WorkbenchError(f"model '{spec_str}' has architecture '{family}', which load_looped does not "
                                 f"support ({why}); supported: {', '.join(FAMILIES)}")
        if family in OWN_READERS:
            with user_files(spec_str, "a Raven-format directory: config.json, safetensors, tokenizer files"):
                model, tok = OWN_READERS[family](path, dtype)
        else:
            model, tok = _from_transformers(path, spec_str, family, dtype)
    torch_layers_only(model)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return _with_pad(FAMILIES[model.config.model_type](model), tok, spec_str)


def _from_transformers(path: Path, spec_str: str, family: str, dtype: torch.dtype):
    """(model, tokenizer) of a family transformers ships, its loading info checked."""
    with user_files(spec_str, "native looped models: a directory of " + ", ".join(FAMILIES)):
        auto = AutoModelForImageTextToText if family == "inkling2_loop" else AutoModelForCausalLM  # composite: text read
        model, info = auto.from_pretrained(path, dtype=dtype, attn_implementation="eager",
                                           output_loading_info=True, use_kernels=False)
        bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
        if bad:
            kind, names = next(iter(bad.items()))
            raise WorkbenchError(f"model '{spec_str}': its weights do not match its config ({len(names)} "
                                 f"{kind.replace('_', ' ')}, e.g. {sorted(map(str, names))[0]})")
        return model, AutoTokenizer.from_pretrained(path)


def require_tokenizer(tok, spec: str):
    """`tok`, or the one-line refusal of a text command on a weights-only directory (no tokenizer files)."""
    if tok is None:
        raise WorkbenchError(f"model '{spec}' has no tokenizer files (weights only), so a command that reads text "
                             "cannot run on it; add the checkpoint's tokenizer files (tokenizer.json, "
                             "tokenizer_config.json) to the directory, or read it from Python with token ids")
    return tok
def _with_pad(looped: NativeLoopedLM, tok, spec: str) -> tuple[NativeLoopedLM, object]:
    """`looped` ready as `load_looped` returns it: eval mode, its spec, a left-padding tokenizer (None: weights only)."""
    looped.eval()
    looped.base.workbench_spec = spec
    if tok is not None:
        if tok.pad_token_id is None:
            tok.pad_token = tok.eos_token
        tok.padding_side = "left"
    return looped, tok


def default_size(model_type: str) -> dict:
    """Parameters and bf16 weight bytes of a family at transformers' config defaults (built on the meta device).

    transformers documents those defaults as the released checkpoint's (`thinkingmachines/Inkling-2-Mini`,
    `sapientinc/HRM-Text-1B`), so this is what reading the real model needs for its weights, allocating nothing.
    Returns {"model_type", "checkpoint", "params", "bf16_gib", "loops"}.
    """
    if model_type not in ("inkling2_loop_text", "hrm_text"):
        raise WorkbenchError(f"default_size knows inkling2_loop_text and hrm_text, not '{model_type}'")
    config = AutoConfig.for_model(model_type)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    params = sum(p.numel() for p in model.parameters())
    loops = config.loop_num_passes if model_type.startswith("inkling") else config.H_cycles
    checkpoint = "thinkingmachines/Inkling-2-Mini" if model_type.startswith("inkling") else "sapientinc/HRM-Text-1B"
    return {"model_type": model_type, "checkpoint": checkpoint, "params": params,
            "bf16_gib": round(2 * params / 2**30, 1), "loops": loops}


def _model_type(path: Path) -> str:
    try:
        model_type = json.loads((path / "config.json").read_text()).get("model_type")
    except (OSError, ValueError, AttributeError) as err:
        raise WorkbenchError(f"model '{path}': config.json cannot be read ({type(err).__name__})") from None
    return str(model_type)


def _tiny(name: str, dtype: torch.dtype, tok):
    extra = dict(TINY_NATIVE[name])
    model_type = extra.pop("model_type")
    if model_type == "huginn_raven":
        return tiny_raven(RavenConfig(vocab_size=len(tok), **extra), TINY_SEED, dtype)
    vocab = {"unpadded_vocab_size": len(tok)} if model_type.startswith("inkling") else {}
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    config = AutoConfig.for_model(model_type, vocab_size=len(tok), bos_token_id=tok.bos_token_id,
                                  eos_token_id=tok.eos_token_id, pad_token_id=pad,
                                  **vocab, **extra)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(TINY_SEED)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="eager")
        with torch.no_grad():  # transformers initialises the learned residual queries at zero (uniform attention)
            for name_, p in model.named_parameters():  # and its gates near zero: passes would barely differ
                if name_.endswith("query"):
                    p.normal_(0.0, 1.0)
                elif name_.endswith(("forget_gate_proj.weight", "message_gate_proj.weight")):
                    p.normal_(0.0, 1.0)
    return model


__all__ = ["FAMILIES", "TINY_NATIVE", "NativeLoopedLM", "default_size", "load_looped", "native_family",
           "require_tokenizer"]
