"""Eager attention with its probabilities passed through a hook point, for `attn.hook_pattern`.

transformers' eager attention discards the probabilities inside the decoder layer, so a
hook there could only read them. Routing one layer call through this function (the same
ops as `eager_attention_forward`, so the output is bit-identical) makes the pattern a real
hook site: a patch at `loop.{t}.block.{i}.attn.hook_pattern` changes what the layer computes.
"""

from __future__ import annotations

import contextlib
from contextvars import ContextVar

import torch
from torch import nn
from transformers import AttentionInterface

HOOKED_EAGER = "workbench_hooked_eager"
_pattern_hook: ContextVar = ContextVar("workbench_pattern_hook", default=None)


def _repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    b, h, s, d = x.shape
    if n_rep == 1:
        return x
    return x[:, :, None, :, :].expand(b, h, n_rep, s, d).reshape(b, h * n_rep, s, d)


def hooked_eager_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """Eager attention; probabilities [batch, head, q_pos, k_pos] pass through the active hook."""
    key_states = _repeat_kv(key, module.num_key_value_groups)
    value_states = _repeat_kv(value, module.num_key_value_groups)
    attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
    hook = _pattern_hook.get()
    if hook is not None:
        attn_weights = hook(attn_weights)
    attn_weights = nn.functional.dropout(attn_weights, p=dropout, training=module.training)
    attn_output = torch.matmul(attn_weights, value_states).transpose(1, 2).contiguous()
    return attn_output, attn_weights


AttentionInterface.register(HOOKED_EAGER, hooked_eager_attention)


@contextlib.contextmanager
def pattern_hook(config, hook_point):
    """Route attention of layers sharing `config` through the hooked eager path for one call."""
    saved = config._attn_implementation
    token = _pattern_hook.set(hook_point)
    config._attn_implementation = HOOKED_EAGER
    try:
        yield
    finally:
        config._attn_implementation = saved
        _pattern_hook.reset(token)
