"""Generation at every loop count: the same prompts continued under loops T = 1, 2, 4, 8, ...

`generate` decodes each prompt once per loop count, greedy by default or sampled with a seeded
private `torch.Generator` (never the global RNG: the same seed gives the same text), and returns a
tidy DataFrame, one row per (prompt, loops):

    prompt_index, prompt, loops, text, tokens, n_tokens, cached, stopped

`text` is the decoded continuation (the end-of-sequence token, when one stopped it, is in `tokens`,
not in `text`); `stopped` is "eos" or "length"; `cached` says whether the step ran on a KV cache.
Every model the workbench loads decodes on one: a retrofit on `LoopedLM.new_cache` (a slot per
(loop, layer) use of the shared layers, loop-time memory included), a native model on transformers'
own cache with one copy of the looped layers per pass (`NativeLoopedLM.new_cache`), at any loop
count 1..max_loops. `cache=False` recomputes the whole sequence each token (the reference the
cached path is tested against: the same tokens, logits within 1e-4). Loop counts past the one a
model was trained at are the same weights applied again (docs/analyses.md, "Passes past the
trained count").

A family whose loop starts from a random initial state (Raven's s_0) takes it per prompt:
`init_state=` gives each prompt's s_0 ([its tokens, d]) and `init_seed=` seeds the positions it does not
give (the new tokens', and every position's when no state is given), so two generations with the same
s_0 agree, cached or recomputed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import pandas as pd
import torch
from tqdm.auto import tqdm

from workbench.devices import device_of
from workbench.errors import WorkbenchError
from workbench.lenses import check_prompts  # one rule for prompts, lens and generate alike
from workbench.loop.positions import position_ids
from workbench.models.native.own import require_initial_state
from workbench.tasks.reader import encode_prompts
from workbench.texts import check_fits, context_limit

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from workbench.loop.looped import LoopedLM
    from workbench.models.native.contract import NativeLoopedLM

COLUMNS = ("prompt_index", "prompt", "loops", "text", "tokens", "n_tokens", "cached", "stopped")
DEFAULT_LOOPS = (1, 2, 4, 8)


def default_loops(model) -> list[int]:
    """1, 2, 4, 8 up to the model's max_loops, and a native model's own pass count."""
    out = {t for t in DEFAULT_LOOPS if t <= int(model.max_loops)}
    native = model.native_loops
    if native is not None:
        out.add(int(native))
    return sorted(out)


def parse_loops(spec: str) -> list[int]:
    """Loop counts from "1,2,4,8" or "1-4" (or a mix: "1-3,8"); a malformed list is a one-line WorkbenchError."""
    out: list[int] = []
    for part in str(spec).split(","):
        text = part.strip()
        lo, dash, hi = text.partition("-")
        try:
            if dash:
                first, last = int(lo), int(hi)
                if first > last:
                    raise ValueError
                out += range(first, last + 1)
            else:
                out.append(int(text))
        except ValueError:
            raise WorkbenchError(f"--loops '{spec}' is not a list of loop counts (e.g. 1,2,4,8 or 1-4)") from None
    return out


def check_loops(model, loops: Sequence[int] | int | None) -> list[int]:
    """`loops` as a list, each an integer in 1..model.max_loops, none twice; None gives `default_loops`."""
    if loops is None:
        return default_loops(model)
    asked = [loops] if isinstance(loops, int) else list(loops)
    limit = int(model.max_loops)
    if not asked:
        raise WorkbenchError("no loop count given (e.g. loops=(1, 2, 4, 8))")
    for t in asked:
        if isinstance(t, bool) or not isinstance(t, int) or not 1 <= t <= limit:
            raise WorkbenchError(f"loops={t!r} is outside 1..{limit} for this model (its max_loops)")
    twice = next((t for i, t in enumerate(asked) if t in asked[:i]), None)
    if twice is not None:
        raise WorkbenchError(f"loops {twice} is given twice")
    return [int(t) for t in asked]


def check_settings(max_new_tokens: int, temperature: float, top_k: int | None, seed: int, batch_size: int) -> None:
    """The decoding settings, each checked (a one-line WorkbenchError)."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise WorkbenchError(f"max_new_tokens={max_new_tokens!r} must be a positive integer")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not math.isfinite(temperature) \
            or temperature <= 0:
        raise WorkbenchError(f"temperature={temperature!r} must be a positive number")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise WorkbenchError(f"top_k={top_k!r} must be a positive integer (or None: the whole vocabulary)")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise WorkbenchError(f"seed={seed!r} must be a non-negative integer")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise WorkbenchError(f"batch_size={batch_size!r} must be a positive integer")


def eos_ids(model, tokenizer) -> list[int]:
    """The end-of-sequence ids `generate` stops at: the model's generation config's (as transformers'), else the
    tokenizer's."""
    config = getattr(model.base, "generation_config", None)
    eos = getattr(config, "eos_token_id", None)
    if eos is None:
        eos = tokenizer.eos_token_id
    if eos is None:
        return []
    return [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]


@torch.no_grad()
def generate(model: LoopedLM | NativeLoopedLM, tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str] | str,
             loops: Sequence[int] | int | None = None, max_new_tokens: int = 32, sample: bool = False,
             temperature: float = 1.0, top_k: int | None = None, seed: int = 0, cache: bool = True,
             stop_at_eos: bool = True, batch_size: int = 8, progress: bool = False,
             init_state: Sequence[torch.Tensor] | torch.Tensor | None = None,
             init_seed: int | None = None) -> pd.DataFrame:
    """Continues every prompt under each loop count: one row per (prompt, loops), the columns of the module docstring.

    Args:
        model: a retrofit (`LoopedLM`) or a native looped model (`workbench.models.load_looped`).
        tokenizer: its tokenizer. Prompts are encoded as raw text (no chat template), left padded, batched.
        prompts: one text or several.
        loops: the loop counts (default 1, 2, 4, 8 up to the model's max_loops, and a native model's own count).
        max_new_tokens: tokens generated per prompt at most.
        sample: sample from softmax(logits / temperature) (over the top_k tokens when given), seeded by `seed`
            with a private generator, once per loop count; otherwise greedy (argmax).
        cache: decode on a KV cache (every retrofit and native model has one); False recomputes the sequence.
        stop_at_eos: a row stops at the model's end-of-sequence token; otherwise it runs max_new_tokens.
        batch_size: prompts decoded together.
        init_state: a family with a random initial state (Raven): each prompt's s_0, [its tokens, d] (a list,
            or one [prompts, tokens, d] tensor when the prompts are as long).
        init_seed: that family's seed for the s_0 of the positions `init_state` does not give.
    Returns:
        DataFrame with columns prompt_index, prompt, loops, text, tokens, n_tokens, cached, stopped; `attrs` holds
        the settings and, for a native model, its `native_loops`.
    Raises:
        WorkbenchError: no or an empty prompt, a loop count outside 1..max_loops, a bad setting, a prompt that
            with max_new_tokens is longer than the model's positions, an initial state the model has none of or
            of the wrong shape; all before any model work.
    """
    prompts = check_prompts(prompts)
    asked = check_loops(model, loops)
    check_settings(max_new_tokens, temperature, top_k, seed, batch_size)
    lengths = [len(tokenizer(p)["input_ids"]) for p in prompts]
    check_fits(lengths, context_limit(tokenizer, model.config), added=max_new_tokens,
               extra=f" with max_new_tokens={max_new_tokens}", fix="give a shorter prompt or fewer new tokens")
    states = check_init_state(model, init_state, init_seed, lengths)
    use_cache = bool(cache)
    stops = eos_ids(model, tokenizer) if stop_at_eos else []
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (stops[0] if stops else 0)
    device = device_of(model)
    groups = [list(range(s, min(s + batch_size, len(prompts)))) for s in range(0, len(prompts), batch_size)]
    bar = tqdm(total=len(asked) * len(groups) * max_new_tokens, disable=not progress, desc="generate")
    found: dict[tuple[int, int], tuple[list[int], str]] = {}
    try:
        for T in asked:
            generator = None
            if sample:  # one stream per loop count: a loop count's text does not depend on which others were asked
                generator = torch.Generator(device=device).manual_seed(seed)
            for group in groups:
                enc = encode_prompts(tokenizer, [prompts[i] for i in group])
                start = InitialState(model, init_seed, _left_padded([states[i] for i in group], enc.input_ids.shape[1])
                                     if states is not None else None)
                rows = _decode(model, enc.input_ids.to(device), enc.attention_mask.to(device), T, max_new_tokens,
                               use_cache, stops, pad, sample, temperature, top_k, generator, bar, start)
                for i, row in zip(group, rows):
                    found[(i, T)] = row
    finally:
        bar.close()
    records = []
    for i, text in enumerate(prompts):
        for T in asked:
            tokens, stopped = found[(i, T)]
            shown = tokens[:-1] if stopped == "eos" else tokens
            records.append((i, text, T, tokenizer.decode(shown), tokens, len(tokens), use_cache, stopped))
    frame = pd.DataFrame.from_records(records, columns=list(COLUMNS))
    frame.attrs.update({"loops": asked, "max_new_tokens": max_new_tokens, "sample": bool(sample),
                        "temperature": float(temperature), "top_k": top_k, "seed": seed, "cached": use_cache,
                        "stop_at_eos": bool(stop_at_eos), "max_loops": int(model.max_loops),
                        "native_loops": model.native_loops})
    return frame


def check_init_state(model, init_state, init_seed, lengths: list[int]) -> list[torch.Tensor] | None:
    """Each prompt's s_0 [tokens, d] from `init_state`, checked against the model and the prompts' token counts."""
    if init_state is None and init_seed is None:
        return None
    require_initial_state(model, "init_state / init_seed", "this model")
    if init_seed is not None and (isinstance(init_seed, bool) or not isinstance(init_seed, int) or init_seed < 0):
        raise WorkbenchError(f"init_seed={init_seed!r} must be a non-negative integer")
    if init_state is None:
        return None
    states = [torch.as_tensor(s) for s in init_state]
    if len(states) != len(lengths):
        raise WorkbenchError(f"init_state gives {len(states)} states for {len(lengths)} prompts")
    d = model.config.n_embd
    for i, (s, n) in enumerate(zip(states, lengths)):
        if tuple(s.shape) != (n, d):
            raise WorkbenchError(f"init_state of prompt {i + 1} has shape {tuple(s.shape)}; its s_0 is [tokens, d] = "
                                 f"{(n, d)}")
    return states


def _left_padded(states: list[torch.Tensor], width: int) -> torch.Tensor:
    """[b, width, d]: each [tokens, d] state behind zeros where the batch is left padded (no real token reads them)."""
    return torch.stack([torch.cat([s.new_zeros(width - len(s), s.shape[1]), s]) for s in states])


class InitialState:
    """The s_0 keywords of one batch's forwards: the given prompt states, the seeded draw for the positions after."""

    def __init__(self, model, seed: int | None, given: torch.Tensor | None):
        self.model, self.seed, self.given = model, seed, given

    def __call__(self, ids: torch.Tensor, mask: torch.Tensor, cached: bool) -> dict:
        """Keywords for a forward over `ids` ([b, s], `mask` over every token so far); a cache's decoding steps draw
        theirs from the seed."""
        if self.seed is None and self.given is None:
            return {}
        if cached or self.given is None:
            return {"init_seed": self.seed}
        given = self.given.to(ids.device)
        if ids.shape[1] > given.shape[1]:   # recomputing: the new tokens' s_0, drawn as a cache's steps draw it
            seed = self.model.init_seed if self.seed is None else self.seed
            new = position_ids(mask)[:, given.shape[1]:]   # where the model puts them: counted over real tokens
            given = torch.cat([given, self.model.draw_state(new, seed, given.dtype)], 1)
        return {"init_state": given, "init_seed": self.seed}


def _decode(model, ids, mask, T, n, use_cache, stops, pad, sample, temperature, top_k, generator, bar, start):
    """One batch at T loops: [(tokens, "eos" | "length")] per row."""
    b = ids.shape[0]
    kv = model.new_cache(T) if use_cache else None
    logits = model(ids, mask, loops=T, cache=kv, **start(ids, mask, False)).logits[:, -1]
    eos = torch.tensor(stops, dtype=torch.long, device=ids.device)
    done = torch.zeros(b, dtype=torch.bool, device=ids.device)
    out: list[list[int]] = [[] for _ in range(b)]
    stopped = ["length"] * b
    for step in range(n):
        chosen = _choose(logits.float(), sample, temperature, top_k, generator)
        chosen = torch.where(done, torch.full_like(chosen, pad), chosen)   # finished rows: padding, as transformers
        hit = ~done & torch.isin(chosen, eos)
        for r in (~done).nonzero().squeeze(1).tolist():
            out[r].append(int(chosen[r]))
            if hit[r]:
                stopped[r] = "eos"
        done |= hit
        bar.update(1)
        if bool(done.all()) or step == n - 1:
            bar.update(n - 1 - step)
            break
        mask = torch.cat([mask, mask.new_ones(b, 1)], dim=1)
        if use_cache:
            logits = model(chosen.unsqueeze(1), mask, loops=T, cache=kv, **start(chosen, mask, True)).logits[:, -1]
        else:
            ids = torch.cat([ids, chosen.unsqueeze(1)], dim=1)
            logits = model(ids, mask, loops=T, **start(ids, mask, False)).logits[:, -1]
    return list(zip(out, stopped))


def _choose(logits: torch.Tensor, sample: bool, temperature: float, top_k: int | None, generator) -> torch.Tensor:
    """[b, vocab] fp32 logits -> [b] token ids: argmax, or a draw from the tempered (top-k) softmax."""
    if not sample:
        return logits.argmax(-1)
    scaled = logits / temperature
    if top_k is not None and top_k < scaled.shape[-1]:
        kth = scaled.topk(top_k, dim=-1).values[:, -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = scaled.softmax(-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(1)
