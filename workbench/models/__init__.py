"""The model room: what the workbench reads a model from.

- `bases`: a base decoder (a local Hugging Face directory, a `.gguf` file, the embedded default, a tiny config)
  and its tokenizer, `decoder_layers`, `weights_sha256`;
- `weights_check` and `gguf_header`: a directory's or a GGUF file's header checked before anything is allocated;
- `native`: looped models the workbench did not build (transformers' Inkling2Loop, HRM-Text), one adapter per
  family, and the one `load_looped`;
- `looped`: `LoopedModel`, what every looped model offers the probes (a retrofit or a native family).

This face hands on the names a user imports (`from workbench.models import load_base, load_looped`).
"""

from workbench.models.bases import TINY_CONFIGS, decoder_layers, load_base, load_tokenizer, weights_sha256
from workbench.models.native import TINY_NATIVE, load_looped, native_family

__all__ = ["TINY_CONFIGS", "TINY_NATIVE", "decoder_layers", "load_base", "load_looped", "load_tokenizer",
           "native_family", "weights_sha256"]
