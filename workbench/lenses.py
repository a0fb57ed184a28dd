"""A per-loop lens on any text: what every loop of a looped model predicts next, at chosen positions.

`lens(model, tokenizer, prompts, loops=T)` runs each batch of prompts once, to loop T, and reads every
loop 1..T at the asked positions through

    coda   the model's own path: the Coda and final norm on h_t, then the unembedding (at loop T this is
           the model's next-token distribution, exactly what `model(ids, loops=T).logits` gives);
    raw    the final norm and unembedding applied to h_t directly, skipping the Coda;
    tuned  a per-loop affine map fitted beforehand (`fit_tuned_lens`, saved with `save_tuned_lens`) on h_t,
           then the unembedding; only when one is given.

One forward per batch, not one per loop: `LoopedLM.read` decodes every loop from the same pass.

The result is one tidy DataFrame, a row per (prompt, position, loop, lens, listed token):

    prompt_index, position (index into the prompt's own tokens), input_token (the token there),
    loop, lens, kind ("top": the k-th most probable token; "target": a token asked with `targets`),
    k (0..top_k-1, or the target's index), token_id, token, rank (0 = most probable), prob,
    entropy (nats, of that lens's whole distribution), kl_to_last (KL(p_T || q_t) in nats, p_T the coda
    lens at loop T: how far loop t's reading is from what the model finally says)

`frame.attrs` holds loops, the lenses read and the model's kind.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save
from tqdm.auto import tqdm

from workbench.devices import device_of
from workbench.errors import WorkbenchError
from workbench.io import write_bytes_atomic
from workbench.probes.logit_lens import collect, fit_tuned
from workbench.texts import check_fits, context_limit

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from workbench.loop.looped import LoopedLM
    from workbench.models.native.contract import NativeLoopedLM

LENSES = ("coda", "raw", "tuned")
COLUMNS = ("prompt_index", "position", "input_token", "loop", "lens", "kind", "k", "token_id", "token", "rank",
           "prob", "entropy", "kl_to_last")


# ----------------------------------------------------------------------------- inputs
def default_loops(model) -> int:
    """The loop count a reading takes when none is given: a native model's trained pass count, else 8 (or fewer)."""
    native = model.native_loops
    return int(native) if native else min(8, int(model.max_loops))


def check_prompts(prompts: Sequence[str] | str) -> list[str]:
    """The prompts as a list; an empty list, a non-string or an empty prompt is a one-line WorkbenchError."""
    if isinstance(prompts, str):
        prompts = [prompts]
    prompts = list(prompts)
    if not prompts:
        raise WorkbenchError("no prompt given: pass --prompt TEXT (repeatable) or --prompts FILE")
    for i, p in enumerate(prompts):
        if not isinstance(p, str) or not p.strip():
            raise WorkbenchError(f"prompt {i + 1} is empty; every prompt needs some text")
    return prompts


def check_loops(model, loops: int | None) -> int:
    """`loops` checked against the model (1..max_loops), or the default."""
    if loops is None:
        return default_loops(model)
    limit = int(model.max_loops)
    if isinstance(loops, bool) or not isinstance(loops, (int, np.integer)) or not 1 <= loops <= limit:
        raise WorkbenchError(f"loops={loops!r} is outside 1..{limit} for this model (its max_loops)")
    return int(loops)


def parse_positions(spec: str | Sequence[int] | None) -> list[int] | str:
    """Positions from "-1", "0,3,-1", "2-5" or "all" (or a list of ints); default [-1], the last token."""
    if spec is None:
        return [-1]
    if isinstance(spec, str):
        text = spec.strip()
        if text == "all":
            return "all"
        out: list[int] = []
        try:
            for part in text.split(","):
                part = part.strip()
                lo, sep, hi = part[1:].partition("-") if part.startswith("-") else part.partition("-")
                if part.startswith("-") and not sep:
                    out.append(int(part))
                elif sep:
                    first, last = int(part[0] + lo if part.startswith("-") else lo), int(hi)
                    if last < first:
                        raise ValueError
                    out.extend(range(first, last + 1))
                else:
                    out.append(int(part))
        except ValueError:
            raise WorkbenchError(f"--positions '{spec}' is malformed; accepted: 'all', '-1', '0,3,-1' or '2-5'") from None
        spec = out
    spec = list(spec)
    if not spec or not all(isinstance(p, (int, np.integer)) and not isinstance(p, bool) for p in spec):
        raise WorkbenchError(f"positions {spec!r} must be a non-empty list of integers (negative: from the end)")
    return [int(p) for p in spec]


def resolve_positions(positions: list[int] | str, n_tokens: int, prompt_index: int) -> list[int]:
    """Each asked position as an index into one prompt's `n_tokens` tokens, in order, each once."""
    if positions == "all":
        return list(range(n_tokens))
    out = []
    for p in positions:
        q = p + n_tokens if p < 0 else p
        if not 0 <= q < n_tokens:
            raise WorkbenchError(f"position {p} is out of range for prompt {prompt_index + 1}, which has {n_tokens} "
                                 f"tokens (0..{n_tokens - 1}, or -1..-{n_tokens} from the end)")
        if q not in out:
            out.append(q)
    return out


def target_ids(tokenizer, targets: Sequence[str] | str | None) -> list[int]:
    """The token id of each target text; a text that is not exactly one token is a one-line WorkbenchError."""
    if targets is None:
        return []
    if isinstance(targets, str):
        targets = [targets]
    ids = []
    for text in targets:
        if not isinstance(text, str) or not text:
            raise WorkbenchError(f"--target {text!r} is empty; give one token's text (e.g. ' Paris')")
        tokens = tokenizer.encode(text, add_special_tokens=False)
        if len(tokens) != 1:
            hint = ""
            spaced = " " + text.lstrip()
            if spaced != text and len(tokenizer.encode(spaced, add_special_tokens=False)) == 1:
                hint = f"; {spaced!r} is one token"
            raise WorkbenchError(f"--target {text!r} is {len(tokens)} tokens of this tokenizer, not one{hint}")
        ids.append(tokens[0])
    return ids


# ----------------------------------------------------------------------------- the lens
def lens(model: LoopedLM | NativeLoopedLM, tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str] | str,
         loops: int | None = None, positions: str | Sequence[int] | None = None, top_k: int = 5,
         targets: Sequence[str] | str | None = None,
         tuned: Mapping[int, tuple] | str | os.PathLike | None = None, batch_size: int = 8,
         progress: bool = False) -> pd.DataFrame:
    """Reads every loop 1..T of `model` on `prompts` at `positions`: the tidy DataFrame of the module docstring.

    Args:
        model: a retrofit (`LoopedLM`) or a native looped model (`workbench.models.load_looped`).
        tokenizer: its tokenizer. Prompts are encoded as raw text (no chat template), left padded.
        prompts: one text or several.
        loops: T (default: a native model's pass count, else 8 or the model's max_loops if fewer).
        positions: "all", or indices into each prompt's tokens (negative from the end); default the last.
        top_k: the most probable tokens listed per (position, loop, lens).
        targets: token texts (each exactly one token) whose rank and probability are listed too.
        tuned: a tuned lens, `{loop: (x mean, W, y mean)}` (`fit_tuned_lens`) or the path of a saved one.
    Raises:
        WorkbenchError: an empty prompt, loops or positions out of range, a target that is not one token,
            a tuned lens of another width.
    """
    prompts = check_prompts(prompts)
    T = check_loops(model, loops)
    asked = parse_positions(positions)
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise WorkbenchError(f"top_k must be a positive integer, got {top_k!r}")
    if batch_size < 1:
        raise WorkbenchError(f"batch_size must be >= 1, got {batch_size}")
    wanted = target_ids(tokenizer, targets)
    maps = load_tuned_lens(tuned) if isinstance(tuned, (str, os.PathLike)) else tuned
    if maps is not None:
        _check_tuned(maps, model)
    tokens = [tokenizer(p)["input_ids"] for p in prompts]
    check_fits([len(ids) for ids in tokens], context_limit(tokenizer, model.config))
    where = [resolve_positions(asked, len(ids), i) for i, ids in enumerate(tokens)]
    records: list[tuple] = []
    order = sorted(range(len(prompts)), key=lambda i: (len(where[i]), len(tokens[i])))
    groups = [order[s:s + batch_size] for s in range(0, len(order), batch_size)]
    for group in tqdm(groups, disable=not progress, desc="lens"):
        by_count: dict[int, list[int]] = {}
        for i in group:
            by_count.setdefault(len(where[i]), []).append(i)
        for idx in by_count.values():
            records += _read_batch(model, tokenizer, prompts, tokens, where, idx, T, top_k, wanted, maps)
    frame = pd.DataFrame.from_records(records, columns=list(COLUMNS))
    frame = frame.sort_values(["prompt_index", "position", "loop", "lens", "kind", "k"],
                              key=_sort_key, kind="stable")
    frame = frame.reset_index(drop=True)
    frame.attrs.update({"loops": T, "lenses": [n for n in LENSES if n != "tuned" or maps is not None],
                        "prompts": prompts, "kind": "retrofit" if model.native_loops is None else "native"})
    return frame


@torch.no_grad()
def _read_batch(model, tokenizer, prompts, tokens, where, idx, T, top_k, wanted, maps) -> list[tuple]:
    """One forward for the prompts `idx` (all with the same number of read positions): their records."""
    device = device_of(model)
    enc = tokenizer([prompts[i] for i in idx], return_tensors="pt", padding=True, padding_side="left").to(device)
    width = enc["input_ids"].shape[1]
    read_at = torch.tensor([[width - len(tokens[i]) + q for q in where[i]] for i in idx], device=device)
    r = model.read(enc["input_ids"], attention_mask=enc["attention_mask"], loops=T, positions=read_at,
                   return_states=True)
    logps = {"coda": torch.log_softmax(r.scores.double(), dim=-1)}          # [B, T, P, V]
    vectors = {"raw": _final_norm(model)(r.states.to(_head_dtype(model)))}  # [B, T, P, D]
    if maps is not None:
        tuned = torch.full_like(r.states.double(), float("nan"))
        for t, (mx, W, my) in maps.items():
            if t <= T:
                x = r.states[:, t - 1].double().cpu().numpy()
                tuned[:, t - 1] = torch.as_tensor((x - mx) @ W + my, dtype=torch.float64)
        vectors["tuned"] = tuned
    for name, v in vectors.items():
        logps[name] = torch.log_softmax(_unembed(model, v), dim=-1)
    final = logps["coda"][:, -1:]                                          # [B, 1, P, V]
    p_final = final.exp()
    records = []
    want = torch.tensor(wanted, dtype=torch.long) if wanted else None
    for name, lp in logps.items():
        lp = lp.cpu()
        p = lp.exp()
        entropy = -(torch.nan_to_num(p * lp)).sum(-1)                       # [B, T, P]
        kl = (p_final.cpu() * (final.cpu() - lp)).sum(-1)                  # KL(p_T || q_t)
        top_p, top_i = p.topk(top_k, dim=-1)                               # [B, T, P, k]
        if want is not None:
            tp = p[..., want]                                              # [B, T, P, n]
            trank = (p.unsqueeze(-1) > tp.unsqueeze(-2)).sum(-2)           # tokens strictly more probable
        valid = ~torch.isnan(lp[..., 0])                                   # a tuned loop without a map: none
        for b, i in enumerate(idx):
            for t in range(T):
                for j, pos in enumerate(where[i]):
                    if not bool(valid[b, t, j]):
                        continue
                    head = (i, pos, tokenizer.decode([tokens[i][pos]]), t + 1, name)
                    h, d = float(entropy[b, t, j]), max(float(kl[b, t, j]), 0.0)
                    for k in range(top_k):
                        tid = int(top_i[b, t, j, k])
                        records.append((*head, "top", k, tid, tokenizer.decode([tid]), k, float(top_p[b, t, j, k]), h, d))
                    for k, tid in enumerate(wanted):
                        records.append((*head, "target", k, tid, tokenizer.decode([tid]), int(trank[b, t, j, k]),
                                        float(tp[b, t, j, k]), h, d))
    return records


def _sort_key(column: pd.Series) -> pd.Series:
    """Lenses in `LENSES` order and the top tokens before the targets; the other columns as they are."""
    if column.name == "lens":
        return column.map(LENSES.index)
    return column.map({"top": 0, "target": 1}) if column.name == "kind" else column


def _final_norm(model):
    return model.final_norm  # HRM: the norm that ends its H stack


def _head_dtype(model) -> torch.dtype:
    return model.base.lm_head.weight.dtype


def _unembed(model, vectors: torch.Tensor) -> torch.Tensor:
    """Logits over the vocabulary of vectors [..., D] (float64), after a native family's logit transform."""
    head = model.base.lm_head
    out = vectors.to(head.weight.dtype).to(head.weight.device) @ head.weight.T
    if head.bias is not None:
        out = out + head.bias
    return model.logit_transform(out).double()  # Inkling's softcap


# ----------------------------------------------------------------------------- tuned lens
def fit_tuned_lens(model, tokenizer, rows: list[dict], loops: int | None = None, ridge: float = 0.1,
                   batch_size: int = 8, progress: bool = False) -> dict[int, tuple]:
    """Fits a tuned lens on manifest rows: per loop t, a ridge map from h_t to the Coda readout at the row's
    final loop (loop = depth, or T for rows without a depth), as the logit_lens probe fits it; returns
    {loop: (x mean [D], W [D, D], y mean [D])}."""
    T = check_loops(model, loops if loops is not None else max([r["depth"] for r in rows if r.get("depth")] or
                                                              [default_loops(model)]))
    states, readouts = collect(model, tokenizer, rows, T, batch_size, progress)
    depths = np.array([min(r.get("depth") or T, T) for r in rows])
    return fit_tuned(states, readouts[np.arange(len(rows)), depths - 1], depths, ridge)


def save_tuned_lens(maps: Mapping[int, tuple], path: str | os.PathLike) -> Path:
    """Writes a tuned lens as safetensors (`loop.<t>.x_mean`, `.W`, `.y_mean`), atomically; returns the path."""
    if not maps:
        raise WorkbenchError("the tuned lens has no loop maps (fit it on rows with at least two per depth)")
    tensors = {}
    for t, (mx, W, my) in maps.items():
        for key, value in (("x_mean", mx), ("W", W), ("y_mean", my)):
            tensors[f"loop.{int(t)}.{key}"] = torch.as_tensor(np.asarray(value), dtype=torch.float64).contiguous()
    path = Path(path)
    write_bytes_atomic(path, save(tensors, metadata={"format": "workbench tuned lens"}))
    return path


def load_tuned_lens(path: str | os.PathLike) -> dict[int, tuple]:
    """Reads `save_tuned_lens`'s file; a missing or foreign file is a one-line WorkbenchError."""
    path = Path(path)
    if not path.is_file():
        raise WorkbenchError(f"tuned lens '{path}' does not exist (write one with workbench.lenses.save_tuned_lens)")
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as err:
        raise WorkbenchError(f"tuned lens '{path}' is not a safetensors file ({err})") from None
    maps: dict[int, tuple] = {}
    try:
        loops = sorted({int(k.split(".")[1]) for k in tensors})
        for t in loops:
            maps[t] = tuple(tensors[f"loop.{t}.{key}"].numpy() for key in ("x_mean", "W", "y_mean"))
    except (KeyError, IndexError, ValueError):
        raise WorkbenchError(f"tuned lens '{path}' does not hold loop.<t>.x_mean / W / y_mean tensors") from None
    return maps


def _check_tuned(maps: Mapping[int, tuple], model) -> None:
    d = model.config.hidden_size
    for t, (mx, W, my) in maps.items():
        if np.shape(W) != (d, d) or np.shape(mx) != (d,) or np.shape(my) != (d,):
            raise WorkbenchError(f"the tuned lens's loop {t} map is {np.shape(W)}, not ({d}, {d}): it was fitted "
                                 "on another model")


# ----------------------------------------------------------------------------- views
def loop_table(frame: pd.DataFrame, prompt_index: int, position: int, top: int = 3) -> pd.DataFrame:
    """One (prompt, position)'s reading as a loop-by-lens summary: the rows the terminal table prints."""
    part = frame[(frame.prompt_index == prompt_index) & (frame.position == position)]
    out = []
    for t, by_loop in part.groupby("loop", sort=True):
        rec: dict = {"loop": int(t)}
        for name, g in by_loop.groupby("lens", sort=False):
            tops = g[g.kind == "top"].sort_values("k").head(top)
            rec[f"{name}_top"] = list(zip(tops.token, tops.prob))
            rec[f"{name}_entropy"] = float(g.entropy.iloc[0])
            rec[f"{name}_kl"] = float(g.kl_to_last.iloc[0])
            for _, row in g[g.kind == "target"].iterrows():
                rec[f"{name}_rank:{row.token}"] = int(row["rank"])
        out.append(rec)
    return pd.DataFrame(out)


__all__ = ["LENSES", "fit_tuned_lens", "lens", "load_tuned_lens", "loop_table", "save_tuned_lens"]
