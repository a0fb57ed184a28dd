"""A decoder layer's attention and MLP outputs as hook points, routed for one layer call at a time.

transformers' decoder layers add `self_attn`'s and `mlp`'s outputs into the residual stream inside their own
forward, so the workbench cannot put a HookPoint between them without copying the layer. `component_hooks(layer,
site)` instead routes, for the duration of one layer call,

    layer.self_attn's output (its first return: attention returns (output, weights))  through site.attn.hook_out
    layer.mlp's output                                                               through site.mlp.hook_out

each by a plain `register_forward_hook` on that module, added only when its hook point has a hook attached and
removed when the call ends (whatever happens). With nothing attached nothing is registered, so the layer call is
exactly transformers' own (bit-identical logits). The retrofit (`LoopedLM`) and every native adapter share it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch import nn
from transformer_lens.hook_points import HookPoint


def hooked(point: HookPoint) -> bool:
    """Whether a hook point has a hook attached (the adapters take a hooked path only then)."""
    return bool(point.fwd_hooks or point.bwd_hooks)


def _through(point: HookPoint):
    def hook(module, args, output):
        if isinstance(output, tuple):  # attention's (output, weights): only the output passes the hook point
            return (point(output[0]), *output[1:])
        return point(output)
    return hook


@contextlib.contextmanager
def output_hook(module: nn.Module, point: HookPoint) -> Iterator[None]:
    """For the duration: `module`'s output (a tuple's first element) passes `point`, when `point` is hooked."""
    handle = module.register_forward_hook(_through(point)) if hooked(point) else None
    try:
        yield
    finally:
        if handle is not None:
            handle.remove()


@contextlib.contextmanager
def component_hooks(layer: nn.Module, site: nn.Module) -> Iterator[None]:
    """For one call of a decoder `layer`: its `self_attn` output passes `site.attn.hook_out` and its `mlp` output
    `site.mlp.hook_out`, each only when that hook point is hooked (`output_hook`)."""
    with output_hook(layer.self_attn, site.attn.hook_out), output_hook(layer.mlp, site.mlp.hook_out):
        yield
