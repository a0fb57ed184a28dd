"""Hook names are a public contract (docs/hooks.md): one hook point per site and loop."""

import ast
import re
from pathlib import Path

import pytest
import torch

from tests.conftest import perturb
from workbench.errors import WorkbenchError
from workbench.loop.config import Block, RetrofitConfig
from workbench.loop.hooks import RETROFIT_SITES, SITES, hook_name, loop_hook_names, stack_loops
from workbench.loop.surgery import retrofit

GOLDEN = [
    "prelude.0.hook_resid_post", "prelude.1.hook_resid_post", "hook_prelude",
    "loop.1.hook_input", "loop.1.hook_state", "loop.1.hook_readout",
    "loop.1.block.2.hook_resid_post", "loop.1.block.2.attn.hook_pattern", "loop.1.block.2.attn.hook_out",
    "loop.1.block.2.mlp.hook_out", "loop.1.block.2.memory.hook_out",
    "loop.1.block.3.hook_resid_post", "loop.1.block.3.attn.hook_pattern", "loop.1.block.3.attn.hook_out",
    "loop.1.block.3.mlp.hook_out", "loop.1.block.3.memory.hook_out",
    "loop.1.coda.4.hook_resid_post", "loop.1.coda.5.hook_resid_post", "loop.1.halt.hook_prob",
    "loop.2.hook_input", "loop.2.hook_state", "loop.2.hook_readout",
    "loop.2.block.2.hook_resid_post", "loop.2.block.2.attn.hook_pattern", "loop.2.block.2.attn.hook_out",
    "loop.2.block.2.mlp.hook_out", "loop.2.block.2.memory.hook_out",
    "loop.2.block.3.hook_resid_post", "loop.2.block.3.attn.hook_pattern", "loop.2.block.3.attn.hook_out",
    "loop.2.block.3.mlp.hook_out", "loop.2.block.3.memory.hook_out",
    "loop.2.coda.4.hook_resid_post", "loop.2.coda.5.hook_resid_post", "loop.2.halt.hook_prob",
    "hook_loops_used",  # adaptive inference's loops per row (a halting head only)
]


def test_golden_hook_names(tiny):
    looped = retrofit(tiny[0], RetrofitConfig(Block(2, 4), memory=True, halting=True, max_loops=2))
    assert list(looped.hook_dict) == GOLDEN


def test_hook_name_builds_every_name_the_model_has(tiny):
    looped = retrofit(tiny[0], RetrofitConfig(Block(2, 4), memory=True, halting=True, max_loops=2))
    layers = {"prelude_resid": range(0, 2), "memory": range(2, 4), "pattern": range(2, 4), "attn_out": range(2, 4),
              "mlp_out": range(2, 4), "block_resid": range(2, 4), "coda_resid": range(4, 6)}
    built = set()
    for site in RETROFIT_SITES:
        pattern = SITES[site]
        loops = range(1, 3) if "{loop}" in pattern else [None]
        built |= {hook_name(site, t, i) for t in loops for i in layers.get(site, [None])}
    assert built == set(GOLDEN) == set(looped.hook_dict)
    assert hook_name("block_resid", 2, 3) == "loop.2.block.3.hook_resid_post"
    assert loop_hook_names("state", 3) == ["loop.1.hook_state", "loop.2.hook_state", "loop.3.hook_state"]


@pytest.mark.parametrize("args, message", [
    (("residual", 1), "unknown hook site 'residual'; accepted: prelude_resid, prelude, input"),
    (("loops_used", 2), "takes no loop"),
    (("state",), "needs a loop"),
    (("block_resid", 1), "needs a layer"),
    (("prelude", 1), "takes no loop"),
    (("state", 1, 3), "takes no layer"),
    (("state", 0), "loop=0 must be an integer >= 1"),
])
def test_hook_name_errors_say_what_the_site_takes(args, message):
    with pytest.raises(WorkbenchError, match=message):
        hook_name(*args)


def test_stack_loops_stacks_one_site_over_loops(tiny, batch):
    looped = retrofit(tiny[0], RetrofitConfig(Block(1, 4)))
    perturb(looped.reentry)
    _, cache = looped.run_with_cache(batch.input_ids, attention_mask=batch.attention_mask, loops=3,
                                     names_filter=loop_hook_names("block_resid", 3, 2) + loop_hook_names("state", 2))
    stacked = stack_loops(cache, "block_resid", 3, layer=2)
    assert stacked.shape == (3, *cache["loop.1.block.2.hook_resid_post"].shape)
    for t in (1, 2, 3):
        assert torch.equal(stacked[t - 1], cache[f"loop.{t}.block.2.hook_resid_post"])
    with pytest.raises(WorkbenchError, match="the cache holds no 'loop.3.hook_state' \\(1 of 3 loops missing\\)"):
        stack_loops(cache, "state", 3)


def test_hook_names_without_optional_parts(tiny):
    looped = retrofit(tiny[0], RetrofitConfig(Block(2, 4), max_loops=2))
    assert list(looped.hook_dict) == [n for n in GOLDEN if ".memory." not in n and ".halt." not in n
                                      and n != "hook_loops_used"]


def test_run_with_cache_keeps_every_loop(tiny, batch):
    looped = retrofit(tiny[0], RetrofitConfig(Block(1, 4), memory=True))
    perturb(looped.reentry)
    _, cache = looped.run_with_cache(batch.input_ids, attention_mask=batch.attention_mask, loops=3,
                                     names_filter=lambda n: n.endswith("hook_state") or n.endswith("memory.hook_out"))
    states = stack_loops(cache, "state", 3)
    assert states.shape == (3, 3, batch.input_ids.shape[1], 64)
    assert not torch.equal(states[0], states[1]) and not torch.equal(states[1], states[2])
    assert "loop.1.block.1.memory.hook_out" not in cache  # memory is empty at loop 1
    assert cache["loop.2.block.1.memory.hook_out"].abs().max() > 0


def test_patch_at_loop2_changes_later_loops_only(tiny, batch):
    looped = retrofit(tiny[0], RetrofitConfig(Block(1, 4)))
    perturb(looped.reentry)
    ids, mask = batch.input_ids, batch.attention_mask
    clean = looped.read(ids, mask, loops=3)
    zero = lambda x, hook: torch.zeros_like(x)  # noqa: E731
    with looped.hooks(fwd_hooks=[("loop.2.hook_state", zero)]):
        patched = looped.read(ids, mask, loops=3)
    assert torch.equal(clean.scores[:, 0], patched.scores[:, 0])
    assert not torch.allclose(clean.scores[:, 1], patched.scores[:, 1])
    assert not torch.allclose(clean.scores[:, 2], patched.scores[:, 2])
    out = looped.run_with_hooks(ids, attention_mask=mask, loops=3, fwd_hooks=[("loop.2.hook_state", zero)])
    assert torch.allclose(out.logits[:, -1], patched.scores[:, 2, 0], atol=1e-5)


def test_pattern_hook_reads_probabilities_and_patches(tiny, batch):
    looped = retrofit(tiny[0], RetrofitConfig(Block(1, 4)))
    ids, mask = batch.input_ids, batch.attention_mask
    plain = looped(ids, mask, loops=2).logits
    name = "loop.2.block.2.attn.hook_pattern"
    out, cache = looped.run_with_cache(ids, attention_mask=mask, loops=2, names_filter=[name])
    assert torch.equal(out.logits, plain)  # routing through the hooked path changes nothing
    pattern = cache[name]
    assert pattern.shape == (3, 4, ids.shape[1], ids.shape[1])
    assert torch.allclose(pattern.sum(-1), torch.ones(3, 4, ids.shape[1]), atol=1e-5)
    full = int(mask.sum(-1).argmax())  # an unpadded row
    assert pattern[full, :, 2, 3:].abs().max() == 0  # causal: no weight on the future
    pad = int(mask.sum(-1).argmin())
    assert pattern[pad, :, -1, : int((mask[pad] == 0).sum())].abs().max() == 0  # none on left padding
    uniform = lambda x, hook: torch.where(x > 0, torch.ones_like(x), x) / (x > 0).sum(-1, keepdim=True)  # noqa
    patched = looped.run_with_hooks(ids, attention_mask=mask, loops=2, fwd_hooks=[(name, uniform)]).logits
    assert not torch.allclose(patched, plain)


def test_nnsight_reads_and_patches_per_loop_state(tiny, batch):
    from nnsight import NNsight

    looped = retrofit(tiny[0], RetrofitConfig(Block(1, 4)))
    perturb(looped.reentry)
    ids = batch.input_ids[:1]
    ref = looped.read(ids, loops=3, return_states=True)
    wrapped = NNsight(looped)
    with wrapped.trace(ids, loops=3):
        s1 = wrapped.loop["1"].hook_state.output.save()
        s3 = wrapped.loop["3"].hook_state.output.save()
    assert torch.equal(s1[0, -1], ref.states[0, 0, 0]) and torch.equal(s3[0, -1], ref.states[0, 2, 0])
    with wrapped.trace(ids, loops=3):
        wrapped.loop["2"].hook_state.output[:] = 0
        logits = wrapped.output.logits.save()
    with looped.hooks(fwd_hooks=[("loop.2.hook_state", lambda x, hook: torch.zeros_like(x))]):
        expected = looped(ids, loops=3).logits
    assert torch.allclose(logits, expected, atol=1e-6)
    assert not torch.allclose(logits, looped(ids, loops=3).logits)


# ----------------------------------------------------------------------------- names come from hooks.py only
ROOT = Path(__file__).resolve().parents[1]
PLACEHOLDER = r"(?:\d+|\w+|\{[^{}]*\})"  # a number, a gate letter, or an f-string / str.format field
HAND_WRITTEN = re.compile("|".join(
    r"(?<![\w.])" + re.sub(r"\\\{\w+\\\}", lambda _: PLACEHOLDER, re.escape(pattern)) + r"(?![\w])"
    for pattern in SITES.values()))


def _code_strings(source: str):
    """(line, text) of every string literal that is not a docstring; an f-string's fields read as "{}"."""
    tree = ast.parse(source)
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                skip.add(id(first.value))
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            skip.update(id(v) for v in node.values)
            yield node.lineno, "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            yield node.lineno, node.value


def hand_written_hook_names(source: str) -> list[tuple[int, str]]:
    """(line, name) of every hook name spelled out in code: what `hook_name` should have built."""
    return [(line, m.group(0)) for line, text in _code_strings(source) for m in HAND_WRITTEN.finditer(text)]


def test_the_scan_finds_hand_written_hook_names():
    source = ('def f(t, model):\n    """Reads loop.{t}.hook_state (a docstring may say it)."""\n'
              '    a = [(f"loop.{t}.halt.hook_prob", g) for t in range(3)]\n'
              '    b = "loop.1.block.3.attn.hook_pattern"\n'
              '    c = "loop.{}.hook_readout".format(t)\n'
              '    return hook_name("state", t), "hook_state"  # a module attribute name is no hook name\n')
    assert hand_written_hook_names(source) == [(3, "loop.{}.halt.hook_prob"), (4, "loop.1.block.3.attn.hook_pattern"),
                                              (5, "loop.{}.hook_readout")]


def test_no_hook_name_is_spelled_by_hand_outside_hooks_py():
    """Every hook name in the library, the benchmarks and the scripts is built by `hook_name` (docs/hooks.md)."""
    files = [f for f in [*ROOT.glob("workbench/**/*.py"), *ROOT.glob("benchmarks/*.py"), *ROOT.glob("scripts/*.py")]
             if f != ROOT / "workbench" / "loop" / "hooks.py"]
    assert len(files) > 100
    found = [f"{f.relative_to(ROOT)}:{line}: {name}" for f in files for line, name in hand_written_hook_names(f.read_text())]
    assert found == []
