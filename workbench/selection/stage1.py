"""Block selection before surgery: angular distance, Kneedle boundaries, window ablation.

Stage 1 (RecurTrace App. B, after Koishekenov et al.): read the residual stream at each
text's final real token entering and leaving every decoder layer and average the angular
distance d(x_l, x_{l+1}) = arccos(cos(x_l, x_{l+1})) / pi over texts. The curve falls across
the early layers, flattens through the middle and rises near the output. Kneedle, fitted
on each side of the minimum separately, puts the Prelude/Block boundary at the falling
side's knee and the Block/Coda boundary at the rising side's knee; the layers between form
the loopable span [prelude_end, coda_start).

Stage 2: every window of k layers inside the span is looped at T = 2 with a fresh split
bridge (an exact identity, so loop 2 applies the window twice) and ranked by the damage
this does to held-out next-token loss (every 4th corpus text, never used for the curve) and
to a small single-token task (by default 32 rows of the arithmetic guardrail battery, which
the base answers well above chance). The least damaged window is recommended.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import json
import math
import time
import warnings
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from kneed import KneeLocator
from tqdm.auto import tqdm

from workbench.devices import device_of
from workbench.errors import WorkbenchError
from workbench.loop.config import Block, RetrofitConfig
from workbench.loop.positions import last_real_token, position_ids
from workbench.loop.surgery import check_block, retrofit
from workbench.models.bases import decoder_layers, weights_sha256
from workbench.tasks.chase import chase_rows
from workbench.tasks.guardrail import guardrail_rows
from workbench.tasks.reader import read_rows
from workbench.texts import numbered_lines, read_text

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

MAX_TOKENS = 128          # texts are truncated to this many tokens (their final token is then the read one)
HELDOUT_EVERY = 4         # every 4th text is held out for the loss; the rest feed the angular curve
MAX_WINDOWS = 8           # the default stride keeps the ablation to about this many windows
FLAT_RANGE = 1e-6         # a side whose values span less than this has no knee
TASKS = ("guardrail", "chase")  # built-in task sets for the accuracy part of the damage
TASK_ROWS = 32                  # rows per built-in task: each window reads them at loops 1 and 2
CHASE_ALPHABET, CHASE_SEED = 8, 20260705


# ------------------------------------------------------------------ the angular curve
def angular_distance_between(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Returns arccos(cos(x, y)) / pi over the last dimension, in [0, 1] (float64: small angles matter)."""
    cos = F.cosine_similarity(x.double(), y.double(), dim=-1)
    return torch.arccos(cos.clamp(-1.0, 1.0)) / math.pi


def final_token_states(model, input_ids: torch.Tensor, attention_mask: torch.Tensor):
    """Returns (x_in, x_out), each [batch, n_layers, d_model]: every decoder layer's input and output
    residual stream at each row's last real token.

    The layers are hooked directly because `output_hidden_states` in transformers 5.x puts the
    final norm into its last element (checked on 5.24); the curve must not see that norm.
    """
    layers = decoder_layers(model)
    rows = torch.arange(input_ids.shape[0], device=input_ids.device)
    last = last_real_token(attention_mask)
    x_in, x_out = [None] * len(layers), [None] * len(layers)

    def hook(i):
        def read(module, args, kwargs, output):
            h = args[0] if args else kwargs["hidden_states"]
            out = output[0] if isinstance(output, tuple) else output
            x_in[i], x_out[i] = h[rows, last], out[rows, last]
        return read

    handles = [layer.register_forward_hook(hook(i), with_kwargs=True) for i, layer in enumerate(layers)]
    try:
        with torch.no_grad():  # the body only: the LM head is not needed
            model.model(input_ids=input_ids, attention_mask=attention_mask,
                        position_ids=position_ids(attention_mask), use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    return torch.stack(x_in, dim=1), torch.stack(x_out, dim=1)


def _batches(tokenizer, texts: list[str], batch_size: int, max_tokens: int, device="cpu"):
    for i in range(0, len(texts), batch_size):
        yield tokenizer(texts[i:i + batch_size], return_tensors="pt", padding=True,
                        truncation=True, max_length=max_tokens).to(device)


def angular_distances(model, tokenizer, texts: list[str], batch_size: int = 8,
                      max_tokens: int = MAX_TOKENS, progress: bool = True) -> list[float]:
    """Returns one value per layer l: the mean over texts of arccos(cos(x_l, x_{l+1})) / pi.

    x_l enters layer l and x_{l+1} leaves it, both at the text's final real token, before the
    final norm. Padding side, padding length and batch size do not change the result.
    """
    if not texts:
        raise WorkbenchError("angular_distances needs at least one text; got none")
    total = torch.zeros(len(decoder_layers(model)), dtype=torch.float64)
    bar = tqdm(total=len(texts), desc="angular distance", unit="text", disable=not progress)
    for enc in _batches(tokenizer, texts, batch_size, max_tokens, device_of(model)):
        x_in, x_out = final_token_states(model, enc.input_ids, enc.attention_mask)
        total += angular_distance_between(x_in, x_out).sum(dim=0).cpu()
        bar.update(enc.input_ids.shape[0])
    bar.close()
    return (total / len(texts)).tolist()


# ------------------------------------------------------------------ Kneedle boundaries
@dataclass
class Knee:
    """A boundary found by Kneedle on one side of the curve: `layer` is None when there is none."""

    layer: int | None
    reason: str


def find_knee(layers: list[int], values: list[float], curve: str, direction: str, side: str) -> Knee:
    """Returns the Kneedle knee of one monotone side of the curve, or None with the reason.

    A knee at an endpoint of the side is rejected: Kneedle returns an endpoint when the
    curvature does not match `curve=`, and such a "knee" is an artefact, not a boundary.
    """
    where = f"the {side} side (layers {layers[0]}-{layers[-1]})" if layers else f"the {side} side"
    if len(layers) < 3:
        return Knee(None, f"no knee: {where} has {len(layers)} layer(s); Kneedle needs at least 3")
    if max(values) - min(values) < FLAT_RANGE:
        return Knee(None, f"no knee: {where} is flat (range {max(values) - min(values):.2g})")
    with warnings.catch_warnings():  # kneed warns "No knee/elbow found"; we report it instead
        warnings.simplefilter("ignore")
        knee = KneeLocator(layers, values, curve=curve, direction=direction).knee
    if knee is None:
        return Knee(None, f"no knee: Kneedle ({curve}, {direction}) found none on {where}")
    knee = int(round(knee))
    if knee in (layers[0], layers[-1]):
        return Knee(None, f"no knee: Kneedle ({curve}, {direction}) returned endpoint layer {knee} "
                          f"of {where}; an endpoint is rejected")
    return Knee(knee, f"Kneedle ({curve}, {direction}) knee at layer {knee} on {where}")


def find_boundaries(curve: list[float]) -> tuple[Knee, Knee]:
    """Returns (prelude knee, coda knee): each side of the curve's minimum fitted on its own.

    The falling side (layer 0 to the minimum) is convex decreasing; the rising side (the
    minimum to the last layer) is convex increasing.
    """
    m = min(range(len(curve)), key=curve.__getitem__)
    left = find_knee(list(range(m + 1)), curve[:m + 1], "convex", "decreasing", "falling")
    right = find_knee(list(range(m, len(curve))), curve[m:], "convex", "increasing", "rising")
    return left, right


# ------------------------------------------------------------------ window ablation
def default_window(n_layers: int) -> int:
    """Returns max(2, round(n_layers / 5)): 6 of 30 for SmolLM2, 5 of 24, 6 of 28.

    A fifth of the depth sits between RecurTrace's 3 of 28 and the retrofit paper's 12 of 24:
    wide enough that looping it is real extra compute, narrow enough that several windows
    fit inside the span and the ablation has something to choose from.
    """
    return max(2, round(n_layers / 5))


def candidate_windows(span: tuple[int, int], k: int, stride: int) -> list[tuple[int, int]]:
    """Returns windows (a, a + k) inside span every `stride` layers, always including the last one."""
    lo, hi = span
    starts = list(range(lo, hi - k + 1, stride))
    if starts and starts[-1] != hi - k:
        starts.append(hi - k)
    return [(a, a + k) for a in starts]


def split_texts(texts: list[str]) -> tuple[list[str], list[str]]:
    """Returns (angular texts, held-out texts): every HELDOUT_EVERY-th text is held out."""
    held = [t for i, t in enumerate(texts) if i % HELDOUT_EVERY == HELDOUT_EVERY - 1]
    rest = [t for i, t in enumerate(texts) if i % HELDOUT_EVERY != HELDOUT_EVERY - 1]
    return rest, held


def next_token_loss(looped, encodings: list, loops: int) -> float:
    """Returns the mean next-token NLL (nats per token) over real tokens of `encodings` at loop `loops`."""
    nll, count = 0.0, 0
    with torch.no_grad():
        for enc in encodings:
            logits = looped(enc.input_ids, enc.attention_mask, loops=loops).logits[:, :-1]
            target, mask = enc.input_ids[:, 1:], enc.attention_mask[:, 1:].bool() & enc.attention_mask[:, :-1].bool()
            losses = F.cross_entropy(logits.transpose(1, 2), target, reduction="none")
            nll += losses[mask].double().sum().item()
            count += int(mask.sum())
    return nll / count


def task_rows(tokenizer, task: str = "guardrail", n: int = TASK_ROWS) -> list[dict]:
    """Returns n rows of a built-in task for the accuracy part of the damage.

    "guardrail": the first n rows of the single-digit arithmetic battery
    (`workbench.tasks.guardrail`), which base SmolLM2 answers well above chance (38/64 against
    1 in 10), so a drop is signal. "chase": n function-table chase rows at depth 1 over 8
    letters; base SmolLM2 is at chance on it (5/32 against 1 in 8), so it ranks windows only
    for bases that can read a table.
    """
    if task == "guardrail":
        return guardrail_rows()[:n]
    if task == "chase":
        return chase_rows(CHASE_ALPHABET, [1], n, CHASE_SEED, tokenizer=tokenizer)
    raise WorkbenchError(f"task '{task}' is unknown; accepted: {', '.join(TASKS)}")


def task_accuracy(looped, tokenizer, rows: list[dict], loops: int, batch_size: int = 16) -> list[float]:
    """Returns, for t = 1..`loops`, the fraction of rows whose loop-t prediction is the row's answer.

    Read through the workbench reader. The answer is compared at every loop (the reader's
    own frame leaves loops past a row's depth ungraded; here loop 2 of a depth-1 row is the
    point: does applying the window twice still give the answer?).
    """
    predicted = read_rows(looped, tokenizer, rows, loops=loops, batch_size=batch_size).predicted_symbols()
    return [sum(p[t] == r["answer"] for p, r in zip(predicted, rows)) / len(rows) for t in range(loops)]


def window_ablation(model, tokenizer, windows: list[tuple[int, int]], heldout: list[str], rows: list[dict],
                    batch_size: int = 8, max_tokens: int = MAX_TOKENS, progress: bool = True) -> list[dict]:
    """Returns one dict per window, ranked by damage (lowest first).

    damage = (loss at loop 2 - loss at loop 1) / loss at loop 1 + (accuracy at loop 1 - accuracy
    at loop 2): the relative increase of held-out next-token loss plus the task accuracy lost
    when the window is applied twice. Loop 1 is the base model (the fresh bridge is an identity).
    """
    if not windows:
        raise WorkbenchError("window_ablation needs at least one window; got none")
    encodings = list(_batches(tokenizer, heldout, batch_size, max_tokens, device_of(model)))
    results = []
    base_loss = None
    for a, b in tqdm(windows, desc="window ablation", unit="window", disable=not progress):
        looped = retrofit(model, RetrofitConfig(Block(a, b), reentry="bridge", max_loops=2))
        if base_loss is None:
            base_loss = next_token_loss(looped, encodings, loops=1)
        loss = next_token_loss(looped, encodings, loops=2)
        acc1, acc2 = task_accuracy(looped, tokenizer, rows, loops=2)
        results.append(dict(block=[a, b], damage=(loss - base_loss) / base_loss + (acc1 - acc2),
                            loss_loop1=base_loss, loss_loop2=loss, loss_increase=loss - base_loss,
                            accuracy_loop1=acc1, accuracy_loop2=acc2, accuracy_drop=acc1 - acc2))
    results.sort(key=lambda r: (r["damage"], r["block"][0]))
    for rank, r in enumerate(results, start=1):
        r["rank"] = rank
    return results


# ------------------------------------------------------------------ the selection
@dataclass
class BlockSelection:
    """What `select_block` returns: the curve, the span, the ranked windows, the recommendation.

    Its `to_dict()` is block_selection.json; the figure and tables are drawn from that record by
    `workbench.plots.selection` (computation never draws).
    """

    model: str
    n_layers: int
    angular_distance: list[float]
    prelude_end: int
    coda_start: int
    knees: dict
    window: int
    stride: int
    windows: list[dict]
    recommended: Block
    data: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        """Returns a JSON-ready dict (the keys of block_selection.json)."""
        d = asdict(self)
        d["recommended"] = list(self.recommended)
        return d

    def to_json(self, **kwargs) -> str:
        """Returns `to_dict()` as JSON text."""
        return json.dumps(self.to_dict(), indent=kwargs.pop("indent", 2), **kwargs)



def load_corpus(path=None) -> list[str]:
    """Returns the texts of a corpus file, one per non-empty line; default the built-in corpus."""
    if path is None:
        text = importlib.resources.files("workbench").joinpath("data/corpus.txt").read_text(encoding="utf-8")
    else:
        text = read_text(path, "corpus")   # the one reader of a user's text: a BOM dropped, CRLF read as LF
    texts = [line.strip() for _, line in numbered_lines(text)]
    if len(texts) < HELDOUT_EVERY:
        raise WorkbenchError(f"corpus '{path or 'built-in'}' has {len(texts)} texts; need at least {HELDOUT_EVERY}")
    return texts


def _span(knees: tuple[Knee, Knee], n_layers: int) -> tuple[int, int]:
    # Without a knee the span runs to the model's edge on that side; the reason records why.
    left, right = knees
    return (0 if left.layer is None else left.layer, n_layers if right.layer is None else right.layer)


def _window_size(window: int | None, span: tuple[int, int], n_layers: int) -> int:
    width = span[1] - span[0]
    if window is None:
        return min(default_window(n_layers), width)
    if not isinstance(window, int) or not 1 <= window <= width:
        raise WorkbenchError(f"window={window!r} does not fit the span {span[0]}:{span[1]} "
                             f"({width} layers); accepted: 1..{width}")
    return window


def select_block(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, texts: list[str] | None = None,
                 window: int | None = None, stride: int | None = None, batch_size: int = 8, max_tokens: int = MAX_TOKENS,
                 task: str = "guardrail", rows: list[dict] | None = None, progress: bool = True) -> BlockSelection:
    """Returns the BlockSelection for `model`: angular curve, Kneedle span, ranked windows.

    Args:
        texts: the corpus (default: the built-in one); every 4th text is held out for the loss.
        window: k, the number of layers to loop (default `default_window`, clipped to the span).
        stride: distance between ablated window starts (default: about MAX_WINDOWS windows).
        task: the built-in task for the accuracy part of the damage (see `task_rows`).
        rows: task rows to use instead of a built-in task.
    """
    for name, value in (("window", window), ("stride", stride)):
        if value is not None and (not isinstance(value, int) or value < 1):
            raise WorkbenchError(f"{name}={value!r} is not accepted; give an integer >= 1 or leave it unset")
    texts = load_corpus() if texts is None else list(texts)
    curve_texts, heldout = split_texts(texts)
    if not heldout:
        raise WorkbenchError(f"need at least {HELDOUT_EVERY} texts so that some are held out; got {len(texts)}")
    task = task if rows is None else "given rows"
    rows = task_rows(tokenizer, task) if rows is None else rows
    n_layers = len(decoder_layers(model))
    curve = angular_distances(model, tokenizer, curve_texts, batch_size, max_tokens, progress)
    knees = find_boundaries(curve)
    span = _span(knees, n_layers)
    k = _window_size(window, span, n_layers)
    n_candidates = span[1] - span[0] - k + 1
    stride = stride or max(1, math.ceil(n_candidates / MAX_WINDOWS))
    ranked = window_ablation(model, tokenizer, candidate_windows(span, k, stride), heldout, rows,
                             batch_size, max_tokens, progress)
    return BlockSelection(
        model=str(getattr(model, "workbench_spec", type(model).__name__)), n_layers=n_layers,
        angular_distance=curve, prelude_end=span[0], coda_start=span[1],
        knees={"prelude_end": asdict(knees[0]), "coda_start": asdict(knees[1])},
        window=k, stride=stride, windows=ranked, recommended=Block(*ranked[0]["block"]),
        data=dict(n_texts=len(texts), n_angular_texts=len(curve_texts), n_heldout_texts=len(heldout),
                  max_tokens=max_tokens, task=task, task_rows=len(rows)),
    )


def selection_record(model, tokenizer, spec: str, texts: list[str], corpus: str, window: int | None = None,
                     progress: bool = True) -> dict:
    """block_selection.json's record: `select_block` on a loaded base, with what identifies its inputs (the spec,
    the weights' sha256, the corpus and its sha256) and the seconds it took (`device` is the caller's to add)."""
    start = time.perf_counter()
    selection = select_block(model, tokenizer, texts=texts, window=window, progress=progress)
    return {**selection.to_dict(), "model": spec, "weights_sha256": weights_sha256(model), "corpus": corpus,
            "corpus_sha256": corpus_sha256(texts), "seconds": round(time.perf_counter() - start, 1)}


def corpus_sha256(texts: list[str]) -> str:
    """The identity of a corpus as Stage 1 read it (its texts, one per line)."""
    return hashlib.sha256("\n".join(texts).encode()).hexdigest()


def check_reuse(record: dict, source, model, texts: list[str], window: int | None) -> None:
    """Refuses to reuse a Stage 1 `record` (read from `source`) for another model's weights, another corpus or
    another window size: a reused selection must be the one this call would compute."""
    if "angular_distance" not in record or "windows" not in record:
        raise WorkbenchError(f"{source}: not a block selection written by `workbench select-block`")
    digest = weights_sha256(model)
    if record.get("weights_sha256") != digest:
        raise WorkbenchError(f"{source} was computed on weights {str(record.get('weights_sha256'))[:12]}..., "
                             f"'{getattr(model, 'workbench_spec', 'the model')}' has {digest[:12]}...; compute "
                             "Stage 1 again (drop --stage1)")
    if record.get("corpus_sha256") != corpus_sha256(texts):
        raise WorkbenchError(f"{source} was computed on another corpus; give the same --corpus or drop --stage1")
    if window is not None and record.get("window") != window:
        raise WorkbenchError(f"{source} ranked windows of {record.get('window')} layers, not --window {window}")


def resolve_block(model, tokenizer, block: str | Block) -> tuple[Block, dict]:
    """Returns (block, record) for a recipe's `block`: "auto", "A:B" or a `Block`.

    "auto" runs `select_block` with its defaults and returns the recommended window; the
    record (for retrofit.json) then holds the whole selection.
    """
    n_layers = len(decoder_layers(model))
    if isinstance(block, str) and block.strip().lower() == "auto":
        selection = select_block(model, tokenizer)
        return selection.recommended, {"source": "auto", "block": list(selection.recommended),
                                       "selection": selection.to_dict()}
    if isinstance(block, str) and len(block.split(":")) != 2:
        raise WorkbenchError(f"block '{block}' is neither 'auto' nor of the form A:B (e.g. 10:16)")
    a, b = check_block(Block.parse(block) if isinstance(block, str) else block, n_layers)
    return Block(a, b), {"source": "given", "block": [a, b]}
