"""Rows from a user's own file or generator, checked and turned into manifest rows (`workbench rows --from`).

A user's row is a JSON object (one a line of a JSONL file; blank lines are skipped) or a dict
from a generator function named as `module:function` (`task_rows`):

    prompt         str, non-empty: the text read, as given (no template is added)
    answer         str, non-empty, one line: what the model should write after the prompt
    candidates     optional list of distinct non-empty str holding the answer, each one token after the
                   prefix: the answer is then read as one symbol among them (the chase's read)
    depth          optional int >= 1: the number of steps the answer takes
    chain          optional non-empty list of str, the state after each step, ending with the answer
                   (len = depth when both are given; depth = len(chain) when only the chain is)
    id             optional str, unique, one line: the row id (default "user-<line number>")
    answer_prefix  optional str, default " ": the text between the prompt and the answer
    answer_end     optional non-empty str: the text the model must write right after an answer read exactly
                   (e.g. "\n", or "." for a number that "3.5" must not answer as "3"); without it the answer
                   ends where its last word does (`workbench.tasks.reader.writes_answer`: " Paris.",
                   " Paris\n" and " Paris is" answer "Paris"; " Parisian" does not)
    meta           optional JSON object, kept as is (the user's own labels; nothing reads it)
    corrupt        optional {"prompt": str, "answer": str}: a twin of the row that changes one fact the answer
                   depends on, with the same number of tokens and another answer among the candidates: what the
                   patching, attribution and paths probes write the clean run into

Any other field is refused, naming it (a misspelt `candidate` would otherwise be dropped unread).
Each becomes a manifest row: row_id, task "user", prompt, answer, symbols (the candidates, or []
when the answer is read exactly, token by token: `workbench.tasks.reader.read_answers`), depth,
and chain, answer_prefix, answer_end, meta when given.

**Candidates, when no row gives any**: if every answer (and chain entry) is one token after the
prefix and the rows hold at least two distinct answers, every row's candidates are the sorted
distinct answers and chain entries (the sidecar's meta says so); otherwise every answer is read
exactly; so is every answer when a row gives an `answer_end` (it asks for the exact read). Rows that
give candidates hold the same number each; a file gives them on every row or
on none (the readers score one kind of row at a time).

**Depth, when not given**: 0, which means "not given" everywhere: a probe that needs a depth
(the depth matrix, overshoot, splice, ...) is not applicable ("needs depth"), and the others read
to the model's own loop count (`workbench.probes.common.default_loops`) and treat the depth as
unknown, never as a real one (no "past depth" flag, the tuned lens fitted to the last loop).

**Checks**, each stopping at the first bad row with one line naming its line (or, for a
generator, its row number) and what is wrong: JSON, fields and their types, unique ids, then
against the tokenizer: each candidate is one token, the answer is among its candidates, the
answer starts at a token boundary right after the prompt (the tokens of prompt + prefix +
answer begin with exactly the prompt's tokens, and the rest are the tokens the reader scores),
and prompt + answer fit the model's context (`workbench.texts.context_limit`: the smaller of the tokenizer's
own maximum and the config's positions). The file itself is read by `workbench.texts` (BOM, CRLF, UTF-8,
64 MiB, JSON read strictly: no key twice, no NaN).
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from workbench.errors import WorkbenchError
from workbench.io import sha256_file
from workbench.tasks.reader import ANSWER_PREFIX, answer_end, answer_token_ids
from workbench.texts import context_limit, read_json_lines

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedTokenizerBase

FIELDS = ("prompt", "answer", "candidates", "depth", "chain", "id", "answer_prefix", "answer_end", "meta", "corrupt")
TASK_OPTIONS = ("seed", "depths", "per_depth")  # what a generator function may take, by keyword


class Deferred:
    """A tokenizer loaded only when first needed: after every row's form is checked (the CLI's, whose model may be
    large to load), so a malformed file fails at once."""

    def __init__(self, load):
        self.load, self.value = load, None

    def get(self):
        """The tokenizer, loaded on the first call."""
        if self.value is None:
            self.value = self.load()
        return self.value


class UserRows(NamedTuple):
    """Manifest rows made from a user's rows, and what the sidecar's `meta` records about them."""

    rows: list[dict]
    meta: dict


def read_user_rows(path: str | os.PathLike, tokenizer: PreTrainedTokenizerBase,
                   config: PretrainedConfig | None = None) -> UserRows:
    """Returns a user's JSONL file as checked manifest rows (module docstring) and their sidecar meta.

    Args:
        path: the `.jsonl` file: one JSON object a line (`prompt`, `answer`, optional `candidates`, `depth`,
            `chain`, `id`, `answer_prefix`, `meta`).
        tokenizer: the tokenizer of the model that will read the rows; every token check is against it (or a
            `Deferred` one, loaded once every row's form is checked).
        config: that model's config (or a `Deferred` one): its positions bound a row's length with the tokenizer's
            own maximum (`workbench.texts.context_limit`).
    Raises:
        WorkbenchError: one line naming the first bad row's line number and what is wrong.
    """
    path = Path(path)
    records = read_json_lines(path, "rows file")   # the one reader of a user's text: `workbench.texts`
    rows, meta = check_user_rows(records, tokenizer, f"rows file '{path}'", "line", config)
    return UserRows(rows, {"task": "user", "from": str(path), "source_sha256": sha256_file(path), **meta})


def task_rows(spec: str, tokenizer: PreTrainedTokenizerBase, seed: int | None = None, depths: list[int] | None = None,
              per_depth: int | None = None, strict: bool = True, config=None) -> UserRows:
    """Returns the rows of a user's generator function `module:function` (imported by name), checked as a file's.

    The function is called with those of `seed`, `depths`, `per_depth` that are given (not None) and that its
    signature takes; it returns an iterable of dicts in the `read_user_rows` format.

    Args:
        strict: refuse a given option the function does not take (the CLI); else leave it out (`build_rows`).
        config: the model's config, as `read_user_rows`'s.
    Raises:
        WorkbenchError: a malformed spec, a module or function that cannot be had, an option it needs that is
            not given, an error inside it, or a bad row (naming its row number, from 1).
    """
    function = load_task(spec)
    given = {k: v for k, v in {"seed": seed, "depths": depths, "per_depth": per_depth}.items() if v is not None}
    params = inspect.signature(function).parameters
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    for name, p in params.items():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or p.default is not p.empty or name in given:
            continue
        option = f"--{name.replace('_', '-')}"
        raise WorkbenchError(f"task '{spec}' needs {option}" if name in TASK_OPTIONS else
                             f"task '{spec}' takes a parameter '{name}' without a default; a task function takes "
                             f"only {', '.join(TASK_OPTIONS)}")
    unused = [k for k in given if k not in params and not takes_any]
    if unused and strict:
        raise WorkbenchError(f"task '{spec}' takes no {unused[0]} (--{unused[0].replace('_', '-')}); its parameters: "
                             f"{', '.join(params) or 'none'}")
    kwargs = {k: v for k, v in given.items() if k in params or takes_any}
    try:
        made = function(**kwargs)
        if isinstance(made, (str, bytes, dict)) or not hasattr(made, "__iter__"):
            raise WorkbenchError(f"task '{spec}' returned {type(made).__name__}, not an iterable of row dicts")
        made = list(made)
    except WorkbenchError:
        raise
    except Exception as err:  # the user's own code: its error in one line (`workbench --debug` shows the traceback)
        said = (str(err).splitlines() or [""])[0][:200]
        raise WorkbenchError(f"task '{spec}' failed: {type(err).__name__}" + (f": {said}" if said else "")) from err
    rows, meta = check_user_rows(list(enumerate(made, 1)), tokenizer, f"task '{spec}'", "row", config)
    return UserRows(rows, {"task": spec, **kwargs, **meta})


def load_task(spec: str):
    """Returns the function named by `module:function`, imported by name (the module on sys.path / PYTHONPATH)."""
    module, sep, name = spec.partition(":")
    if not sep or not module or not name.isidentifier():
        raise WorkbenchError(f"task '{spec}' is not module:function (e.g. mytasks:capitals)")
    try:
        loaded = importlib.import_module(module)
    except Exception as err:  # ImportError, or an error while the module runs
        raise WorkbenchError(f"task '{spec}': cannot import module '{module}' ({type(err).__name__}: {err}); "
                             "it is imported by name (put its folder on PYTHONPATH)") from None
    function = getattr(loaded, name, None)
    if not callable(function):
        raise WorkbenchError(f"task '{spec}': module '{module}' has no function '{name}'")
    return function


# ----------------------------------------------------------------------------- the checks
def check_user_rows(records: list[tuple[int, Any]], tokenizer, source: str, unit: str = "line",
                    config=None) -> tuple[list[dict], dict]:
    """Returns (manifest rows, meta) from (line number, user row) pairs; raises naming the first bad one.

    The form of every row is checked first (types, fields, ids, candidates across rows), then each row against
    the tokenizer (a `Deferred` one is loaded only then).
    """
    if tokenizer is None:
        raise WorkbenchError(f"{source}: user rows are checked against a tokenizer; none was given")
    if not records:
        raise WorkbenchError(f"{source} holds no rows")

    def bad(n: int, what: str) -> WorkbenchError:
        return WorkbenchError(f"{source} {unit} {n}: {what}")

    lines = [n for n, _ in records]
    rows = [_form(raw, n, bad) for n, raw in records]
    seen: dict[str, int] = {}
    for n, row in zip(lines, rows):
        if row["row_id"] in seen:
            raise bad(n, f"id '{row['row_id']}' repeats {unit} {seen[row['row_id']]}'s")
        seen[row["row_id"]] = n
    given = [i for i, r in enumerate(rows) if r["symbols"] is not None]
    if given:
        lacking = next((i for i, r in enumerate(rows) if r["symbols"] is None), None)
        if lacking is not None:
            raise bad(lines[lacking], f"no candidates, while {unit} {lines[given[0]]} gives some: give candidates on "
                                      "every row or on none")
        size = len(rows[0]["symbols"])
        odd = next((i for i, r in enumerate(rows) if len(r["symbols"]) != size), None)
        if odd is not None:
            raise bad(lines[odd], f"{len(rows[odd]['symbols'])} candidates, while {unit} {lines[0]} has {size}: every "
                                  "row scores the same number")
    tokenizer = tokenizer.get() if isinstance(tokenizer, Deferred) else tokenizer
    if given:
        candidates = "given"
    else:
        shared = _default_candidates(rows, tokenizer)
        for r in rows:
            r["symbols"] = list(shared)
        what = "answers and chain entries" if any("chain" in r for r in rows) else "answers"
        candidates = (f"none given: the {len(shared)} distinct {what} of the rows, sorted, each one token"
                      if shared else "none given: every answer read exactly, token by token")
    limit = context_limit(tokenizer, config.get() if isinstance(config, Deferred) else config)
    for n, row in zip(lines, rows):
        _tokens(row, n, tokenizer, limit, bad)
    missing = sum(r["depth"] == 0 for r in rows)
    meta = {"candidates": candidates,
            "depth": "given" if not missing else f"not given on {missing} of {len(rows)} rows (depth 0)"}
    return [_ordered(r) for r in rows], meta


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _form(raw, n: int, bad) -> dict:
    """The manifest row of one user row, its form checked (tokens come later); `symbols` None when not given."""
    if not isinstance(raw, dict):
        raise bad(n, f"not a JSON object (a {type(raw).__name__})")
    unknown = sorted(str(k) for k in raw if k not in FIELDS)
    if unknown:
        raise bad(n, f"unknown field '{unknown[0]}'; accepted: {', '.join(FIELDS)} (put your own labels under meta)")
    for field in ("prompt", "answer"):
        if field not in raw:
            raise bad(n, f"no {field}")
        if not isinstance(raw[field], str) or not raw[field]:
            raise bad(n, f"{field} must be a non-empty string, got {_shown(raw[field])}")
    if "\n" in raw["answer"]:
        raise bad(n, "answer holds a line break; an answer is read up to the end of its line")
    prefix = raw.get("answer_prefix", ANSWER_PREFIX)
    if not isinstance(prefix, str) or "\n" in prefix:
        raise bad(n, f"answer_prefix must be a string without line breaks, got {_shown(prefix)}")
    end = raw.get("answer_end")
    if "answer_end" in raw and (not isinstance(end, str) or not end):
        raise bad(n, f"answer_end must be a non-empty string, got {_shown(end)} (leave it out to end the answer "
                     "where its last word ends)")
    if "answer_end" in raw and "candidates" in raw:
        raise bad(n, "answer_end is for an answer read exactly; an answer among candidates is read as one token")
    row: dict = {"prompt": raw["prompt"], "answer": raw["answer"], "task": "user"}
    if "id" in raw:
        rid = raw["id"]
        if not isinstance(rid, str) or not rid or not rid.isprintable():
            raise bad(n, f"id must be a non-empty string without line breaks or control characters, got {_shown(rid)}")
        row["row_id"] = rid
    else:
        row["row_id"] = f"user-{n}"
    candidates = raw.get("candidates")
    if "candidates" in raw:
        if not isinstance(candidates, list) or not candidates or not all(isinstance(c, str) and c for c in candidates):
            raise bad(n, f"candidates must be a non-empty list of non-empty strings, got {_shown(candidates)}")
        twice = [c for c, k in Counter(candidates).items() if k > 1]
        if twice:
            raise bad(n, f"candidates repeat '{twice[0]}'")
        if raw["answer"] not in candidates:
            raise bad(n, f"answer '{raw['answer']}' is not among its candidates ({', '.join(candidates)})")
    row["symbols"] = list(candidates) if candidates is not None else None
    depth = raw.get("depth")
    if "depth" in raw and (not _is_int(depth) or depth < 1):
        raise bad(n, f"depth must be an integer >= 1, got {_shown(depth)} (leave it out when there is none)")
    if "chain" in raw:
        chain = raw["chain"]
        if not isinstance(chain, list) or not chain or not all(isinstance(x, str) and x for x in chain):
            raise bad(n, f"chain must be a non-empty list of non-empty strings, got {_shown(chain)}")
        if chain[-1] != raw["answer"]:
            raise bad(n, f"chain ends with '{chain[-1]}', not the answer '{raw['answer']}'")
        if depth is not None and len(chain) != depth:
            raise bad(n, f"chain has {len(chain)} entries but depth is {depth}")
        if candidates is not None and any(x not in candidates for x in chain):
            raise bad(n, f"chain entry '{next(x for x in chain if x not in candidates)}' is not among its candidates")
        row["chain"] = list(chain)
        depth = len(chain)
    row["depth"] = depth if depth is not None else 0
    if "answer_prefix" in raw:
        row["answer_prefix"] = prefix
    if "answer_end" in raw:
        row["answer_end"] = end
    if "corrupt" in raw:
        twin = raw["corrupt"]
        if not isinstance(twin, dict) or sorted(twin) != ["answer", "prompt"] or not all(
                isinstance(twin[k], str) and twin[k] for k in ("prompt", "answer")):
            raise bad(n, f"corrupt must be an object with a non-empty prompt and answer and nothing else, got "
                         f"{_shown(twin)}")
        if twin["answer"] == raw["answer"] or twin["prompt"] == raw["prompt"]:
            raise bad(n, "corrupt must change the prompt and the answer (a twin that changes neither tells nothing)")
        if candidates is not None and twin["answer"] not in candidates:
            raise bad(n, f"corrupt answer '{twin['answer']}' is not among its candidates")
        row["corrupt"] = {"prompt": twin["prompt"], "answer": twin["answer"]}
    if "meta" in raw:
        if not isinstance(raw["meta"], dict):
            raise bad(n, f"meta must be a JSON object, got {_shown(raw['meta'])}")
        try:
            row["meta"] = json.loads(json.dumps(raw["meta"], sort_keys=True, allow_nan=False))   # NaN is not JSON: never written
        except (TypeError, ValueError, RecursionError):
            raise bad(n, "meta holds a value JSON cannot write (NaN, Infinity, or not a JSON type)") from None
    return row


def _default_candidates(rows: list[dict], tokenizer) -> list[str]:
    """The sorted distinct answers and chain entries when every one is a single token after every row's prefix,
    there are at least two distinct answers and no row gives an `answer_end`; else [] (every answer read exactly)."""
    answers = {r["answer"] for r in rows}
    symbols = sorted(answers | {x for r in rows for x in r.get("chain", [])}
                     | {r["corrupt"]["answer"] for r in rows if "corrupt" in r})
    prefixes = {r.get("answer_prefix", ANSWER_PREFIX) for r in rows}
    if len(answers) < 2 or any("answer_end" in r for r in rows) or not all(
            len(tokenizer.encode(p + s, add_special_tokens=False)) == 1 for p in prefixes for s in symbols):
        return []
    return symbols


def _tokens(row: dict, n: int, tokenizer, limit: int | None, bad) -> None:
    """The checks against the tokenizer: single-token candidates, the answer at the read position, the length."""
    prefix = row.get("answer_prefix", ANSWER_PREFIX)
    name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
    for c in row["symbols"]:
        got = tokenizer.encode(prefix + c, add_special_tokens=False)
        if len(got) != 1:
            raise bad(n, f"candidate '{c}' is not one token of tokenizer '{name}' ({prefix + c!r} -> {len(got)} tokens)")
    written = prefix + row["answer"] + (answer_end(row) if not row["symbols"] else "")
    prompt = tokenizer.encode(row["prompt"], add_special_tokens=False)
    if not prompt:
        raise bad(n, f"the prompt encodes to no tokens of tokenizer '{name}' (it drops all of its text); give it text "
                     "the tokenizer reads")
    full = tokenizer.encode(row["prompt"] + written, add_special_tokens=False)
    answer = tokenizer.encode(written, add_special_tokens=False)
    if full[: len(prompt)] != prompt:
        end = tokenizer.decode(prompt[-1:])
        raise bad(n, f"the answer does not start at a token boundary after the prompt: the prompt's last token "
                     f"{end!r} changes when {written!r} follows it; end the prompt where a token ends "
                     "(not inside a word the answer completes)")
    if full[len(prompt):] != answer:
        raise bad(n, f"{written!r} tokenizes differently after the prompt than on its own, so the "
                     "read would score other tokens than the text holds")
    if "corrupt" in row:
        twin = row["corrupt"]
        if not row["symbols"]:
            raise bad(n, "corrupt needs answers read as one token among candidates (the patching probes compare two "
                         "answers' logits); these answers are read exactly")
        if twin["answer"] not in row["symbols"]:
            raise bad(n, f"corrupt answer '{twin['answer']}' is not among the candidates ({', '.join(row['symbols'])})")
        got = len(tokenizer(twin["prompt"])["input_ids"])
        want = len(tokenizer(row["prompt"])["input_ids"])
        if got != want:
            raise bad(n, f"corrupt prompt is {got} tokens and the prompt {want}: a twin keeps every position, so "
                         "change a word for one of the same token count")
    if limit is not None:
        total = len(tokenizer(row["prompt"])["input_ids"]) + len(answer_token_ids(tokenizer, row))
        if total > limit:
            raise bad(n, f"prompt and answer are {total:,} tokens, past the model's context of {limit:,} tokens; give "
                         "a shorter prompt")


def _ordered(row: dict) -> dict:
    """The manifest row with its keys in one order (the JSONL is canonical anyway: sorted keys)."""
    return {k: row[k] for k in ("row_id", "task", "depth", "prompt", "answer", "symbols", "chain", "answer_prefix",
                                "answer_end", "corrupt", "meta") if k in row}


def _shown(value) -> str:
    text = json.dumps(value, ensure_ascii=False, default=repr)
    return text if len(text) <= 40 else text[:37] + "..."

