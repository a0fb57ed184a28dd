"""Native looped models (transformers' Inkling2Loop and HRM-Text) against transformers' own code.

The reference side of every comparison is transformers alone: `AutoModelForCausalLM` loaded from the
same saved directory, and per-pass states recorded with plain `register_forward_hook`s on its modules
(`_reference_calls`, which imports nothing from the workbench). Its positions are transformers' own too: its
plain forward (which counts padding, so it is read on right-padded or unpadded rows) or, for a left-padded batch,
the position ids transformers' `generate` computes from the mask (`_their_positions`). The adapter side is
`load_looped(dir)`, whose positions come from `workbench.loop.positions`.
"""

import json

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from workbench.errors import WorkbenchError
from workbench.loop.hooks import hook_name, loop_hook_names, stack_loops
from workbench.models import load_looped, load_tokenizer
from workbench.models.native import TINY_NATIVE

FAMILIES = ("tiny-inkling2-loop", "tiny-hrm-text")
PROMPTS = ["The capital of France is", "A -> C\nB -> A\nStart at A.", "Hello there, how are you doing today?"]


def _save(tmp_path, name: str, seed: int) -> str:
    """Saves a tiny random model of family `name` at `seed` (its learned queries off zero) with a tokenizer."""
    tok = load_tokenizer()
    extra = dict(TINY_NATIVE[name])
    model_type = extra.pop("model_type")
    vocab = {"unpadded_vocab_size": len(tok)} if model_type.startswith("inkling") else {}
    if model_type.startswith("inkling"):   # its only absolute-position term (log scaling) starts past position 1,
        extra["log_scaling_n_floor"] = 2   # not past the default 8192: a short prompt's positions then count
    config = AutoConfig.for_model(model_type, vocab_size=len(tok), eos_token_id=tok.eos_token_id,
                                  pad_token_id=tok.pad_token_id, **vocab, **extra)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("query"):
                p.normal_()
    out = tmp_path / f"{name}-{seed}"
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)


def _reference(path: str, dtype=torch.float32):
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="eager")
    return model.eval()


def _reference_calls(model, modules: dict[str, torch.nn.Module], *args, **kwargs) -> dict[str, list]:
    """{name: [output of each call, in order]} of transformers' modules during one plain forward."""
    seen: dict[str, list] = {name: [] for name in modules}
    handles = [m.register_forward_hook(lambda mod, inp, out, name=name: seen[name].append(out.detach().clone()))
               for name, m in modules.items()]
    try:
        with torch.no_grad():
            model(*args, use_cache=False, **kwargs)
    finally:
        for h in handles:
            h.remove()
    return seen


def _batch(tok, side: str = "left"):
    before, tok.padding_side = tok.padding_side, side
    try:
        enc = tok(PROMPTS, return_tensors="pt", padding=True)
    finally:
        tok.padding_side = before
    assert (enc["attention_mask"] == 0).any()  # a padded batch
    assert (enc["attention_mask"][:, 0 if side == "left" else -1] == 0).any()  # padded on that side
    return enc["input_ids"], enc["attention_mask"]


def _their_positions(model, ids, mask):
    """The position ids transformers' `generate` gives a padded batch (its own `_prepare_position_ids_for_generation`):
    a plain transformers forward counts padding as positions, so a left-padded comparison takes these."""
    return model._prepare_position_ids_for_generation(ids, {"attention_mask": mask})


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("native")
    return {(name, seed): _save(root, name, seed) for name in FAMILIES for seed in (0, 1, 2)}


# ----------------------------------------------------------------------------- exactness
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("name", FAMILIES)
def test_logits_equal_transformers_forward_exactly(saved, name, seed, dtype):
    path = saved[(name, seed)]
    looped, tok = load_looped(path, dtype=dtype)
    ref = _reference(path, dtype)
    ids, mask = _batch(tok)
    right_ids, right_mask = _batch(tok, "right")
    pos = _their_positions(ref, ids, mask)
    with torch.no_grad():
        ours = looped(ids, attention_mask=mask).logits
        theirs = ref(ids, attention_mask=mask, position_ids=pos).logits                         # with its KV cache
        theirs_plain = ref(ids, attention_mask=mask, position_ids=pos, use_cache=False).logits
        unpadded = ref(ids[:1, -5:]).logits                                                     # its own positions
        ours_unpadded = looped(ids[:1, -5:]).logits
        real = right_mask.bool()   # right padding: transformers' plain forward counts the real tokens 0, 1, ...
        right = ref(right_ids, attention_mask=right_mask).logits
        ours_right = looped(right_ids, attention_mask=right_mask).logits
        rows = [(ref(ids[i:i + 1, mask[i].bool()]).logits[0], ours[i, mask[i].bool()]) for i in range(len(ids))]
    assert ours.dtype == theirs.dtype
    assert (ours - theirs).abs().max().item() == 0.0
    assert (ours - theirs_plain).abs().max().item() == 0.0
    assert (ours_unpadded - unpadded).abs().max().item() == 0.0
    assert (ours_right[real] - right[real]).abs().max().item() == 0.0
    for i, (alone, in_batch) in enumerate(rows):   # each left-padded row against transformers on its tokens alone
        torch.testing.assert_close(in_batch, alone, msg=lambda m, i=i: f"row {i}: {m}")


def _sites(name, looped, ref):
    """(adapter site, transformers module, call index of pass t) for the per-pass sites with a module twin."""
    inner = ref.model
    if name == "tiny-inkling2-loop":
        mods = {f"layer{i}": inner.layers[i] for i in range(looped.a, looped.b)}
        per_pass = [(lambda t, i=i: hook_name("block_resid", t, i), f"layer{i}", lambda t: t - 1)
                    for i in range(looped.a, looped.b)]
        per_pass.append((lambda t: hook_name("state", t), f"layer{looped.b - 1}", lambda t: t - 1))
        return mods, per_pass
    L = looped.config.L_cycles
    mods = {"H": inner.H_module, "L": inner.L_module,
            **{f"H{i}": inner.H_module.layers[i] for i in range(looped.n_stack)}}
    per_pass = [(lambda t: hook_name("state", t), "H", lambda t: t - 1)]
    per_pass += [(lambda t, i=i: hook_name("block_resid", t, i), f"H{i}", lambda t: t - 1) for i in range(looped.n_stack)]
    per_pass += [(lambda t, c=c: hook_name("low_state", t, cycle=c), "L", lambda t, c=c: (t - 1) * L + c - 1)
                 for c in range(1, L + 1)]
    return mods, per_pass


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("name", FAMILIES)
def test_every_cached_pass_equals_an_independent_recording(saved, name, seed):
    path = saved[(name, seed)]
    looped, tok = load_looped(path)
    ref = _reference(path)
    ids, mask = _batch(tok)
    mods, per_pass = _sites(name, looped, ref)
    recorded = _reference_calls(ref, mods, ids, attention_mask=mask, position_ids=_their_positions(ref, ids, mask))
    T = looped.native_loops
    names = [site(t) for site, _, _ in per_pass for t in range(1, T + 1)]
    with torch.no_grad():
        _, cache = looped.run_with_cache(ids, attention_mask=mask, names_filter=names)
    for site, module, call in per_pass:
        for t in range(1, T + 1):
            assert torch.equal(cache[site(t)], recorded[module][call(t)]), (site(t), module)
    states = stack_loops(cache, "state", T)
    assert not torch.equal(states[0], states[1])  # the passes really differ


@pytest.mark.parametrize("name", FAMILIES)
def test_run_with_cache_keeps_a_planted_pass_difference(name):
    looped, tok = load_looped(name)
    ids, mask = _batch(tok)
    T = looped.native_loops
    layer = looped.a
    planted = hook_name("block_resid", 2, layer)
    names = loop_hook_names("block_resid", T, layer) + loop_hook_names("state", T)

    def plant(x, hook):
        return x + 1.0

    with torch.no_grad():
        _, plain = looped.run_with_cache(ids, attention_mask=mask, names_filter=names)
        with looped.hooks(fwd_hooks=[(planted, plant)]):
            _, cache = looped.run_with_cache(ids, attention_mask=mask, names_filter=names)
    first = hook_name("block_resid", 1, layer)
    assert torch.equal(cache[first], plain[first])                  # pass 1 as it was (no last write wins)
    assert torch.equal(cache[planted], plain[planted] + 1.0)        # pass 2 holds exactly the planted change
    assert torch.equal(cache[hook_name("state", 1)], plain[hook_name("state", 1)])
    assert not torch.equal(cache[hook_name("state", T)], plain[hook_name("state", T)])


@pytest.mark.parametrize("name", FAMILIES)
def test_identity_hooks_on_every_site_keep_the_logits_exact(name):
    """The hooked paths (patterns, gates, message attention) are the same ops: identity hooks change nothing."""
    looped, tok = load_looped(name)
    ids, mask = _batch(tok)
    with torch.no_grad():
        plain = looped(ids, attention_mask=mask).logits
        every = [(n, lambda x, hook: x.clone()) for n in looped.hook_dict]
        with looped.hooks(fwd_hooks=every):
            hooked = looped(ids, attention_mask=mask).logits
    assert (hooked - plain).abs().max().item() == 0.0


@pytest.mark.parametrize("name", FAMILIES)
def test_generate_matches_transformers_token_for_token(saved, name):
    path = saved[(name, 0)]
    looped, tok = load_looped(path)
    ref = _reference(path)
    for ids, mask in [(_batch(tok)[0][:1, -6:], None), _batch(tok)]:
        kw = dict(max_new_tokens=8, do_sample=False, pad_token_id=tok.pad_token_id)
        with torch.no_grad():
            theirs = ref.generate(ids, attention_mask=mask, **kw)
            seen = []
            with looped.hooks(fwd_hooks=[(hook_name("state", looped.native_loops), lambda x, hook: seen.append(1))]):
                ours = looped.generate(ids, attention_mask=mask, **kw)
        assert torch.equal(ours, theirs)
        assert len(seen) == 8  # the adapter's passes ran at every decoding step (prefill + 7)


# ----------------------------------------------------------------------------- reads and passes
@pytest.mark.parametrize("name", FAMILIES)
def test_read_decodes_every_pass_as_the_model_at_that_pass_count(name):
    looped, tok = load_looped(name)
    ids, mask = _batch(tok)
    cands = torch.tensor([5, 17, 300, 4000])
    with torch.no_grad():
        r = looped.read(ids, attention_mask=mask, loops=looped.max_loops, candidates=cands, return_states=True)
        full = looped.read(ids, attention_mask=mask, loops=2)
        for t in range(1, looped.max_loops + 1):
            final = looped.read_final(ids, attention_mask=mask, loops=t, candidates=cands)
            assert torch.equal(final, r.scores[:, t - 1])
            logits = looped(ids, attention_mask=mask, loops=t).logits[:, -1].float()
            assert torch.allclose(r.scores[:, t - 1, 0], logits[:, cands], atol=1e-5, rtol=0)
    assert r.scores.shape == (3, looped.max_loops, 1, 4) and r.states.shape[:3] == (3, looped.max_loops, 1)
    assert full.scores.shape == (3, 2, 1, looped.config.vocab_size if name.startswith("tiny-hrm")
                                 else looped.base.lm_head.out_features)
    assert not torch.equal(r.scores[:, 0], r.scores[:, 1])


@pytest.mark.parametrize("name", FAMILIES)
def test_nnsight_reads_and_patches_one_pass(name):
    looped, tok = load_looped(name)
    nnsight_reads_and_patches_one_pass(looped, _batch(tok)[0][:1, -6:])


def nnsight_reads_and_patches_one_pass(looped, ids):
    """nnsight reads passes 1 and 3 by name (equal to the model's own states) and zeroing pass 2's state through it
    equals the same patch through the workbench's hooks (and changes the logits). Also run on the families written
    here (tests/test_ecosystem.py)."""
    from nnsight import NNsight

    ref = looped.read(ids, loops=3, return_states=True)
    wrapped = NNsight(looped)
    with wrapped.trace(ids, loops=3):
        s1 = wrapped.loop["1"].hook_state.output.save()
        s3 = wrapped.loop["3"].hook_state.output.save()
    assert torch.equal(s1[0, -1].float(), ref.states[0, 0, 0]) and torch.equal(s3[0, -1].float(), ref.states[0, 2, 0])
    with wrapped.trace(ids, loops=3):
        wrapped.loop["2"].hook_state.output[:] = 0
        logits = wrapped.output.logits.save()
    with looped.hooks(fwd_hooks=[("loop.2.hook_state", lambda x, hook: torch.zeros_like(x))]):
        expected = looped(ids, loops=3).logits
    assert torch.equal(logits, expected) and not torch.equal(logits, looped(ids, loops=3).logits)


def test_family_sites_fire_and_patch():
    ink, tok = load_looped("tiny-inkling2-loop")
    ids, mask = _batch(tok)
    names = [hook_name("message", 2, 1), hook_name("message_pattern", 2, 2), hook_name("forget_gate", 2, 1, gate="q"),
             hook_name("message_gate", 3, 2, gate="mlp"), hook_name("pattern", 2, 2)]
    _, cache = ink.run_with_cache(ids, attention_mask=mask, names_filter=names)
    b, s = ids.shape
    assert cache[names[0]].shape == (b, s, 4, 64)                         # q, k, v, mlp messages
    assert cache[names[1]].shape[:3] == (b, s, 4)                         # 4 pass queries over pass 1's blocks
    assert torch.allclose(cache[names[1]].sum(-1), torch.ones(b, s, 4))
    assert cache[names[2]].shape == (b, s, 64) and cache[names[2]].abs().max() <= 1
    assert cache[names[4]].shape == (b, 4, s, s)
    plain = ink(ids, attention_mask=mask).logits
    closed = ink.run_with_hooks(ids, attention_mask=mask, fwd_hooks=[(names[2], lambda x, hook: torch.ones_like(x))]).logits
    assert not torch.equal(plain, closed)                                 # a patched forget gate changes the output
    hrm, _ = load_looped("tiny-hrm-text")
    _, cache = hrm.run_with_cache(ids, attention_mask=mask, names_filter=[hook_name("low_state", 2, cycle=2),
                                                                           hook_name("low_input", 1, cycle=1)])
    assert cache[hook_name("low_state", 2, cycle=2)].shape == (b, s, 64)


# ----------------------------------------------------------------------------- bad input
def test_bad_pass_counts_and_site_names_are_one_line_errors():
    ink, tok = load_looped("tiny-inkling2-loop")
    hrm, _ = load_looped("tiny-hrm-text")
    ids = _batch(tok)[0][:1]
    with pytest.raises(WorkbenchError, match=r"loops=0 is outside 1\.\.6 for this inkling2_loop model"):
        ink.read(ids, loops=0)
    with pytest.raises(WorkbenchError, match=r"loops=5 is outside 1\.\.4 for this hrm_text model \(native 2"):
        hrm(ids, loops=5)
    with pytest.raises(WorkbenchError, match="hook 'loop.1.low.1.hook_state' does not exist on this inkling2_loop"):
        ink.run_with_cache(ids, names_filter=[hook_name("low_state", 1, cycle=1)])
    with pytest.raises(WorkbenchError, match="hook 'loop.2.block.0.hook_message' does not exist on this hrm_text"):
        hrm.run_with_hooks(ids, fwd_hooks=[(hook_name("message", 2, 0), lambda x, hook: x)])
    with pytest.raises(WorkbenchError, match="hook 'loop.1.block.1.hook_message' does not exist"):  # pass 1 has none
        with ink.hooks(fwd_hooks=[(hook_name("message", 1, 1), lambda x, hook: x)]):
            pass


def test_unsupported_family_and_mismatched_weights_are_refused(tmp_path, saved):
    ouro = tmp_path / "ouro"
    ouro.mkdir()
    (ouro / "config.json").write_text(json.dumps({"model_type": "ouro"}))
    with pytest.raises(WorkbenchError, match="holds no model.safetensors"):   # Ouro is read; here, with no weights
        load_looped(ouro)
    llama = tmp_path / "llama"
    llama.mkdir()
    (llama / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(WorkbenchError, match="architecture 'llama', which load_looped does not support"):
        load_looped(llama)
    # weights of seed 0 under a config with more layers per stack: missing keys, refused (not random-filled)
    bad = tmp_path / "mismatch"
    bad.mkdir()
    src = saved[("tiny-hrm-text", 0)]
    import shutil

    for f in ("model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(f"{src}/{f}", bad / f)
    config = json.loads(open(f"{src}/config.json").read())
    config["num_layers_per_stack"] = 3
    config["num_hidden_layers"] = 3 * 2 * 3
    (bad / "config.json").write_text(json.dumps(config))
    with pytest.raises(WorkbenchError, match="weights do not match its config"):
        load_looped(bad)
    with pytest.raises(WorkbenchError, match="not a directory with config.json"):
        load_looped(tmp_path / "nowhere")


@pytest.mark.parametrize("name", FAMILIES)
def test_every_pass_count_equals_transformers_run_at_that_count(saved, name):
    """Reading pass t is the model at t passes: transformers with loop_num_passes / H_cycles = t, 1..2 x native."""
    path = saved[(name, 1)]
    looped, tok = load_looped(path)
    ref = _reference(path)
    ids, mask = _batch(tok)
    count = "loop_num_passes" if name == "tiny-inkling2-loop" else "H_cycles"
    pos = _their_positions(ref, ids, mask)
    with torch.no_grad():
        r = looped.read(ids, attention_mask=mask, loops=looped.max_loops)
        for t in range(1, looped.max_loops + 1):
            setattr(ref.config, count, t)
            theirs = ref(ids, attention_mask=mask, position_ids=pos, use_cache=False).logits
            ours = looped(ids, attention_mask=mask, loops=t).logits
            assert (ours - theirs).abs().max().item() == 0.0, t
            assert torch.allclose(r.scores[:, t - 1, 0], theirs[:, -1].float(), atol=1e-5, rtol=0)


def test_the_composite_inkling_config_reads_its_text_model_exactly(tmp_path):
    """The released Inkling2Loop is composite (vision + text, model_type inkling2_loop): its text model is read."""
    from transformers import AutoModelForImageTextToText, Inkling2LoopConfig

    tok = load_tokenizer()
    text = {k: v for k, v in TINY_NATIVE["tiny-inkling2-loop"].items() if k != "model_type"}
    text["log_scaling_n_floor"] = 2   # positions count (see `_save`)
    config = Inkling2LoopConfig(
        text_config=dict(vocab_size=len(tok), unpadded_vocab_size=len(tok), eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id, **text),
        vision_config=dict(model_type="inkling2_vision", hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                           patch_size=4, projection_hidden_dim=32, text_hidden_size=64, posemb_grid_size=4))
    torch.manual_seed(3)
    model = AutoModelForImageTextToText.from_config(config, attn_implementation="eager")
    model.save_pretrained(tmp_path / "composite")
    tok.save_pretrained(tmp_path / "composite")
    looped, _ = load_looped(tmp_path / "composite")
    ref = AutoModelForImageTextToText.from_pretrained(tmp_path / "composite", attn_implementation="eager").eval()
    ids, mask = _batch(tok)
    with torch.no_grad():
        ours = looped(ids, attention_mask=mask).logits
        theirs = ref(input_ids=ids, attention_mask=mask, position_ids=_their_positions(ref, ids, mask),
                     use_cache=False).logits
    assert looped.family == "inkling2_loop" and looped.native_loops == 3
    assert (ours - theirs).abs().max().item() == 0.0


@pytest.mark.parametrize("name", FAMILIES)
def test_a_loaded_native_model_keeps_transformers_torch_layers(tmp_path, name):
    """As a base (tests/test_models.py): no hub kernels in a native model read from a directory, after .train()."""
    looped, _ = load_looped(_save(tmp_path, name, 0))
    looped.base.train()
    assert not looped.base.use_kernels and looped.base.kernels_mode is None
