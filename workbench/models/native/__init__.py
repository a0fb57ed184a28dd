"""Native looped models: looped architectures the workbench did not build, read with its looped interface.

`load_looped(spec)` returns `(looped, tokenizer)` for a local Hugging Face directory of a supported family
or a tiny random test model. Each family is one file written to the adapter contract
(`workbench.models.native.contract`, docs/adding-a-looped-architecture.md):

- `inkling`: transformers' Inkling2Loop (`inkling2_loop_text`, or the composite `inkling2_loop`, text only)
- `hrm`: transformers' HRM-Text (`hrm_text`)
- the families the workbench implements itself, no package shipping their code (`own.OWN_FAMILIES`, one record
  each): `raven`, Huginn-0125 and every Raven-format checkpoint (`huginn_raven`), and `ouro`, Ouro (`ouro`); their
  directories' config, safetensors and tokenizer are read, their modeling code never

The adapters of transformers' families hold transformers' model by reference and call its own modules; with no
hook attached their logits are bit-identical to `AutoModelForCausalLM`'s (tests/test_native.py).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText, AutoTokenizer
from transformers.utils import logging as hf_logging

from workbench.errors import WorkbenchError, user_files
from workbench.models.bases import SUPPORTED_ARCHITECTURES, load_tokenizer, torch_layers_only
from workbench.models.native.contract import NativeLoopedLM, frozen
from workbench.models.native.hrm import HrmLooped
from workbench.models.native.inkling import InklingLooped
from workbench.models.native.own import OWN_FAMILIES, OWN_TINY, OwnFamily

# model_type in config.json -> adapter class: transformers' families, then those written here (`own`)
FAMILIES: dict[str, type[NativeLoopedLM]] = {
    "inkling2_loop_text": InklingLooped,
    "inkling2_loop": InklingLooped,
    "hrm_text": HrmLooped,
    **{model_type: own.adapter for model_type, own in OWN_FAMILIES.items()},
}
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
    # the families written here: their records' sizes (tiny-raven, tiny-ouro)
    **{own.tiny_name: dict(model_type=model_type, **own.tiny_sizes) for model_type, own in OWN_FAMILIES.items()},
}


def native_family(spec: str | os.PathLike) -> str | None:
    """The model_type of a native looped model (a tiny one's name, or a directory whose config.json names a family
    with an adapter), else None: something else the workbench reads (a base model, a run, a GGUF). Nothing loaded.

    Raises:
        WorkbenchError: a directory whose config.json names an architecture the workbench reads neither as a looped
            family nor as a base to retrofit (every command that takes a directory says so in the same line).
    """
    if str(spec) in TINY_NATIVE:
        return TINY_NATIVE[str(spec)]["model_type"]
    config = Path(str(spec)).expanduser() / "config.json"
    if not config.is_file():
        return None
    try:
        model_type = json.loads(config.read_text()).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None
    if model_type in FAMILIES or model_type in UNSUPPORTED:
        return model_type
    if isinstance(model_type, str) and model_type not in SUPPORTED_ARCHITECTURES:
        raise WorkbenchError(f"model '{spec}' has architecture '{model_type}', which the workbench reads neither as a "
                             f"looped family ({', '.join(FAMILIES)}) nor as a base model to retrofit "
                             f"({', '.join(SUPPORTED_ARCHITECTURES)})")
    return None


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
        own = OWN_TINY.get(spec_str)
        if own is not None:
            return _with_pad(own.tiny(dtype, tok, TINY_SEED, **own.tiny_sizes), tok, spec_str)
        model = _tiny(spec_str, dtype, tok)
        return _with_pad(FAMILIES[model.config.model_type](frozen(torch_layers_only(model))), tok, spec_str)
    path = Path(spec_str).expanduser()
    if not (path / "config.json").is_file():
        raise WorkbenchError(f"native looped model '{spec_str}' is not a directory with config.json "
                             f"(or one of {', '.join(TINY_NATIVE)})")
    family = _model_type(path)
    own = OWN_FAMILIES.get(family)
    if own is not None:
        with user_files(spec_str, own.holds):
            looped, tok = own.load(path, dtype)
    elif family in FAMILIES:
        model, tok = _from_transformers(path, spec_str, family, dtype)
        looped = FAMILIES[model.config.model_type](frozen(torch_layers_only(model)))
    else:
        why = UNSUPPORTED.get(family, "it is not a looped family the workbench has an adapter for")
        raise WorkbenchError(f"model '{spec_str}' has architecture '{family}', which load_looped does not "
                             f"support ({why}); supported: {', '.join(FAMILIES)}")
    check_vocabulary(looped, tok, spec_str)
    return _with_pad(looped, tok, spec_str)


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


def check_vocabulary(looped: NativeLoopedLM, tok, spec: str) -> None:
    """Refuses a directory whose tokenizer has more tokens than the model's embedding has rows: its ids would index
    past the embedding (a crash inside the first forward) and its text is not this checkpoint's."""
    rows = looped.config.vocab_size
    if tok is not None and len(tok) > rows:
        raise WorkbenchError(f"model '{spec}': its tokenizer has {len(tok)} tokens but the model's embedding has "
                             f"{rows} rows (config vocab_size); the tokenizer files are not this checkpoint's")


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
    """A random model of a family transformers ships (`TINY_NATIVE[name]`), over `tok`'s vocabulary."""
    extra = dict(TINY_NATIVE[name])
    model_type = extra.pop("model_type")
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


__all__ = ["FAMILIES", "OWN_FAMILIES", "TINY_NATIVE", "NativeLoopedLM", "OwnFamily", "default_size", "load_looped",
           "native_family", "require_tokenizer"]
