"""The attention and MLP outputs of every looped layer, per loop (`attn_out`, `mlp_out`; HRM's L stack too).

The reference for each cached value is an independent recording: plain `register_forward_hook`s on the layers'
own `self_attn` / `mlp` modules during a forward with no hook point attached, in call order (one call per loop, or
per L cycle). Patches are checked against recomputing the layer by hand from the cached values.
"""

import pytest
import torch

from tests.conftest import PROMPTS, perturb
from workbench.loop.config import Block, RetrofitConfig
from workbench.loop.hooks import hook_name
from workbench.loop.surgery import attach_lora, retrofit
from workbench.models import load_base, load_looped

KINDS = ("retrofit", "tiny-inkling2-loop", "tiny-hrm-text")


def _model(kind: str):
    """(looped, ids, mask, T): a left-padded batch and a pass count to run (the native count for native models)."""
    if kind == "retrofit":
        base, tok = load_base("tiny-llama")
        looped = retrofit(base, RetrofitConfig(Block(1, 4), max_loops=4))
        perturb(looped.reentry)  # a trained-looking re-entry: later loops differ from loop 1
        T = 3
    else:
        looped, tok = load_looped(kind)
        T = looped.native_loops
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    assert (enc["attention_mask"] == 0).any()
    return looped, enc["input_ids"], enc["attention_mask"], T


def _calls(kind: str, looped, T: int):
    """[(hook name, module, index of its call at that loop / cycle)] for every attn_out / mlp_out site of a T-loop run."""
    out = []
    if kind == "tiny-hrm-text":
        tm, L = looped.text_model, looped.config.L_cycles
        for i in range(looped.n_stack):
            for t in range(1, T + 1):
                high = tm.H_module.layers[i]
                out += [(hook_name("attn_out", t, i), high.self_attn, t - 1), (hook_name("mlp_out", t, i), high.mlp, t - 1)]
                low = tm.L_module.layers[i]
                for c in range(1, L + 1):
                    k = (t - 1) * L + c - 1
                    out += [(hook_name("low_attn_out", t, i, cycle=c), low.self_attn, k),
                            (hook_name("low_mlp_out", t, i, cycle=c), low.mlp, k)]
        return out
    for i in range(looped.a, looped.b):
        layer = looped.layers[i]
        for t in range(1, T + 1):
            out += [(hook_name("attn_out", t, i), layer.self_attn, t - 1), (hook_name("mlp_out", t, i), layer.mlp, t - 1)]
    return out


def _record(modules, run) -> dict[int, list[torch.Tensor]]:
    """{id(module): [its output (a tuple's first element) at each call]} during `run()`, by plain forward hooks."""
    seen = {id(m): [] for m in modules}

    def hook(mod, args, out):
        seen[id(mod)].append((out[0] if isinstance(out, tuple) else out).detach().clone())

    handles = [m.register_forward_hook(hook) for m in {id(m): m for m in modules}.values()]
    try:
        with torch.no_grad():
            run()
    finally:
        for h in handles:
            h.remove()
    return seen


def _component_names(looped) -> list[str]:
    return [n for n in looped.hook_dict if n.endswith((".attn.hook_out", ".mlp.hook_out"))]


def _no_module_hooks_left(looped) -> bool:
    return all(not m._forward_hooks for m in looped.base.modules())


# ----------------------------------------------------------------------------- reading
@pytest.mark.parametrize("kind", KINDS)
def test_cached_component_outputs_equal_an_independent_recording_at_every_loop(kind):
    looped, ids, mask, T = _model(kind)
    calls = _calls(kind, looped, T)
    recorded = _record([m for _, m, _ in calls], lambda: looped(ids, attention_mask=mask, loops=T))
    names = [n for n, _, _ in calls]
    with torch.no_grad():
        out, cache = looped.run_with_cache(ids, attention_mask=mask, loops=T, names_filter=names)
    assert _no_module_hooks_left(looped)  # the per-call forward hooks are gone
    b, s = ids.shape
    d = looped.config.hidden_size
    for name, module, k in calls:
        assert cache[name].shape == (b, s, d), name
        assert torch.equal(cache[name], recorded[id(module)][k]), name
    for name, module, _ in calls:  # each loop's value is its own use of the shared weights
        if name.startswith("loop.1."):
            later = [cache[name.replace("loop.1.", f"loop.{t}.", 1)] for t in range(2, T + 1)]
            values = [cache[name], *later]
            assert all(not torch.equal(x, y) for j, x in enumerate(values) for y in values[j + 1:]), name
    with torch.no_grad():
        assert torch.equal(out.logits, looped(ids, attention_mask=mask, loops=T).logits)


def test_lora_wrapped_attention_is_hooked_too():
    base, tok = load_base("tiny-llama")
    # LoRA inside self_attn
    looped = attach_lora(retrofit(base, RetrofitConfig(Block(1, 4), max_loops=3)), init_lora_weights=False)
    perturb(looped.reentry)
    enc = tok(PROMPTS, return_tensors="pt", padding=True)
    ids, mask = enc["input_ids"], enc["attention_mask"]
    calls = _calls("retrofit", looped, 2)
    recorded = _record([m for _, m, _ in calls], lambda: looped(ids, attention_mask=mask, loops=2))
    with torch.no_grad():
        _, cache = looped.run_with_cache(ids, attention_mask=mask, loops=2, names_filter=[n for n, _, _ in calls])
    for name, module, k in calls:
        assert torch.equal(cache[name], recorded[id(module)][k]), name


@pytest.mark.parametrize("kind", ("retrofit", "tiny-hrm-text"))
def test_block_output_is_its_input_plus_attention_plus_mlp(kind):
    """A pre-norm layer adds exactly these two terms: resid_post = resid_in + attn_out + mlp_out, at every loop."""
    looped, ids, mask, T = _model(kind)
    hrm = kind == "tiny-hrm-text"
    layers = range(looped.n_stack) if hrm else range(looped.a, looped.b)
    with torch.no_grad():
        _, cache = looped.run_with_cache(ids, attention_mask=mask, loops=T)
    stacks = [("block_resid", "attn_out", "mlp_out", lambda t: hook_name("input", t), {})]
    if hrm:
        stacks += [("low_resid", "low_attn_out", "low_mlp_out", lambda t, c=c: hook_name("low_input", t, cycle=c),
                    {"cycle": c}) for c in range(1, looped.config.L_cycles + 1)]
    checked = 0
    for resid, attn, mlp, first_input, kw in stacks:
        for t in range(1, T + 1):
            resid_in = cache[first_input(t)]
            for i in layers:
                resid_post = cache[hook_name(resid, t, i, **kw)]
                parts = resid_in + cache[hook_name(attn, t, i, **kw)] + cache[hook_name(mlp, t, i, **kw)]
                torch.testing.assert_close(resid_post, parts, atol=1e-5, rtol=0)
                resid_in = resid_post
                checked += 1
    assert checked == len(stacks) * T * len(layers)


# ----------------------------------------------------------------------------- patching
@pytest.mark.parametrize("kind", KINDS)
def test_identity_hooks_on_the_component_outputs_keep_the_logits_bit_identical(kind):
    looped, ids, mask, T = _model(kind)
    names = _component_names(looped)
    assert len(names) == 2 * looped.max_loops * (looped.b - looped.a) * (1 + (looped.config.L_cycles if
                                                                              kind == "tiny-hrm-text" else 0))
    with torch.no_grad():
        plain = looped(ids, attention_mask=mask, loops=T).logits
        with looped.hooks(fwd_hooks=[(n, lambda x, hook: x.clone()) for n in names]):
            hooked = looped(ids, attention_mask=mask, loops=T).logits
            read = looped.read(ids, attention_mask=mask, loops=T)
    assert torch.equal(hooked, plain)
    with torch.no_grad():
        assert torch.equal(read.scores, looped.read(ids, attention_mask=mask, loops=T).scores)
    assert _no_module_hooks_left(looped)


@pytest.mark.parametrize("kind", KINDS)
def test_zeroing_mlp_out_changes_the_output_only_at_a_loop_that_runs(kind):
    looped, ids, mask, T = _model(kind)
    zero = lambda x, hook: torch.zeros_like(x)  # noqa: E731
    layer = looped.a
    with torch.no_grad():
        plain = looped(ids, attention_mask=mask, loops=T).logits
        at_2 = looped.run_with_hooks(ids, attention_mask=mask, loops=T,
                                     fwd_hooks=[(hook_name("mlp_out", 2, layer), zero)]).logits
        beyond = looped.run_with_hooks(ids, attention_mask=mask, loops=T,
                                       fwd_hooks=[(hook_name("mlp_out", T + 1, layer), zero)]).logits
    assert not torch.allclose(at_2, plain)
    assert torch.equal(beyond, plain)  # loop T + 1 never ran: its hook never fired
    if kind == "tiny-hrm-text":
        with torch.no_grad():
            low = looped.run_with_hooks(ids, attention_mask=mask, loops=T,
                                        fwd_hooks=[(hook_name("low_mlp_out", 2, 0, cycle=1), zero)]).logits
        assert not torch.allclose(low, plain)


def _by_hand(layer, resid_in, attn):
    """A pre-norm (Llama / HRM) layer's output from its input and a given attention output: transformers' own ops."""
    h = resid_in + attn
    return h + layer.mlp(layer.post_attention_layernorm(h))


@pytest.mark.parametrize("kind", KINDS)
def test_patching_attn_out_from_a_cache_replaces_what_the_layer_adds(kind):
    looped, ids, mask, T = _model(kind)
    t, i = 2, looped.a
    attn, resid = hook_name("attn_out", t, i), hook_name("block_resid", t, i)
    resid_in = hook_name("input", t)  # layer a's input at loop t (the H stack's input for HRM)
    with torch.no_grad():
        plain, own = looped.run_with_cache(ids, attention_mask=mask, loops=T, names_filter=[attn])
        same = looped.run_with_hooks(ids, attention_mask=mask, loops=T,
                                     fwd_hooks=[(attn, lambda x, hook: own[attn].clone())]).logits
        other_ids, other_mask = ids.roll(1, 0), mask.roll(1, 0)  # every row gets another prompt's value
        _, other = looped.run_with_cache(other_ids, attention_mask=other_mask, loops=T, names_filter=[attn])
        patch = [(attn, lambda x, hook: other[attn])]
        with looped.hooks(fwd_hooks=patch):
            patched, cache = looped.run_with_cache(ids, attention_mask=mask, loops=T,
                                                   names_filter=[attn, resid, resid_in])
    assert torch.equal(same, plain.logits)  # its own value back: nothing changes
    assert not torch.allclose(patched.logits, plain.logits)
    assert torch.equal(cache[attn], other[attn])
    layer = looped.text_model.H_module.layers[i] if kind == "tiny-hrm-text" else looped.layers[i]
    if kind == "tiny-inkling2-loop":  # the patched value is what the post-attention convolution reads at pass t
        seen = []
        hook = layer.post_attention_convolution.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
        try:
            with torch.no_grad(), looped.hooks(fwd_hooks=patch):
                looped(ids, attention_mask=mask, loops=T)
        finally:
            hook.remove()
        assert len(seen) == T and torch.equal(seen[t - 1], other[attn])
    else:
        with torch.no_grad():
            expected = _by_hand(layer, cache[resid_in], other[attn])
        assert torch.equal(cache[resid], expected)


def test_module_hooks_are_removed_when_a_hook_raises():
    looped, ids, mask, T = _model("retrofit")

    def boom(x, hook):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        looped.run_with_hooks(ids, attention_mask=mask, loops=2, fwd_hooks=[(hook_name("attn_out", 2, 2), boom)])
    assert _no_module_hooks_left(looped)
    with torch.no_grad():
        assert torch.equal(looped(ids, attention_mask=mask, loops=2).logits,
                           looped.run_with_hooks(ids, attention_mask=mask, loops=2).logits)


# ----------------------------------------------------------------------------- HRM: every cycle with grad
def _grad_at(looped, ids, mask, loops, name, v=None, eps=0.0):
    """(logits, d sum(last logits) / d value at `name`) with the value made a leaf; `v`, `eps` move it first."""
    leaf = {}

    def grab(x, hook):
        leaf["x"] = x.detach().clone().requires_grad_(True)
        return leaf["x"] if v is None else leaf["x"] + eps * v

    logits = looped.run_with_hooks(ids, attention_mask=mask, loops=loops, fwd_hooks=[(name, grab)]).logits
    loss = logits[:, -1].sum()
    (grad,) = torch.autograd.grad(loss, leaf["x"], allow_unused=True) if loss.requires_grad else (None,)
    return logits.detach(), loss.detach(), grad


def test_hrm_all_cycles_with_grad_reaches_every_cycle_and_keeps_the_logits():
    looped, ids, mask, _ = _model("tiny-hrm-text")
    assert looped.all_cycles_grad is False
    assert looped.text_model.L_bp_cycles_padded[0] < looped.config.L_cycles  # H cycle 1's L cycle 1 runs under no_grad
    early = hook_name("low_input", 1, cycle=1)
    logits, _, grad = _grad_at(looped, ids, mask, 2, early)
    assert grad is None  # transformers' default: nothing flows back into the no_grad cycle
    with looped.all_cycles_with_grad():
        assert looped.all_cycles_grad is True
        logits_all, _, grad_all = _grad_at(looped, ids, mask, 2, early)
    assert looped.all_cycles_grad is False  # restored
    assert torch.equal(logits_all, logits)
    assert grad_all is not None and grad_all.abs().max() > 0

    # an early H cycle's state, read at pass 3 (its L cycle 1 under no_grad by default): the opt-in gradient is
    # the whole one, as a central finite difference along a random direction confirms
    state = hook_name("state", 1)
    v = torch.randn(ids.shape[0], ids.shape[1], looped.config.hidden_size, generator=torch.Generator().manual_seed(0))
    _, _, partial = _grad_at(looped, ids, mask, 3, state)
    with looped.all_cycles_with_grad():
        _, _, whole = _grad_at(looped, ids, mask, 3, state)
        with torch.no_grad():
            _, up, _ = _grad_at(looped, ids, mask, 3, state, v, 1e-2)
            _, down, _ = _grad_at(looped, ids, mask, 3, state, v, -1e-2)
    assert partial.abs().max() > 0 and not torch.allclose(whole, partial)
    fd = float((up - down) / 2e-2)
    assert abs(float((whole * v).sum()) - fd) < 0.05 * abs(fd)
    assert abs(float((whole * v).sum()) - fd) < abs(float((partial * v).sum()) - fd)
