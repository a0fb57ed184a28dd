"""One reader of a user's text: every prompt, row and corpus file a command takes is read here, the same way.

`lens --prompts`, `generate --prompts`, `rows --from`, `probe --rows` (a manifest) and
`select-block --corpus` all read through `read_text`, so the same bytes are the same prompts
everywhere:

- at most `MAX_BYTES` (64 MiB), checked before a byte is read (and again while reading, for a file
  that grows or is not a regular file): a 2 GB file is one line, never a process the kernel kills;
- UTF-8 only: a UTF-16 file (its byte-order mark, or the NUL bytes between its ASCII letters) and bytes
  that are not UTF-8 are refused, naming the line and the byte;
- a UTF-8 byte-order mark is dropped and CRLF (or a lone CR) reads as LF: a file saved on Windows holds
  the same prompts as one saved elsewhere, not prompts ending in '\\r';
- a JSON line is read strictly (`json_line`): a key given twice, NaN, Infinity, a number too large for a
  float and nesting deeper than `MAX_DEPTH` are refused, never silently changed.

A prompt's length is checked against `context_limit`: the smaller of the tokenizer's own maximum (when it
sets a real one) and the model's positions, before any forward.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from workbench.errors import WorkbenchError

MAX_BYTES = 64 * 2**20   # a text file a command reads: far above any prompt set, far below the memory it would take
MAX_DEPTH = 64           # JSON nesting: a row is a few levels deep; Python's parser fails past about a thousand
UNKNOWN_MAX_LENGTH = 10 ** 9  # transformers' stand-in for "no max length" is larger than any real one
UTF16_MARKS = (b"\xff\xfe", b"\xfe\xff")   # also the start of UTF-32 LE's mark


def read_text(path: str | os.PathLike, kind: str) -> str:
    """Returns the text of a user's file: UTF-8, its BOM dropped, every line ending a `\\n`.

    Args:
        path: the file.
        kind: what it is, for the message ("--prompts", "rows file", "corpus").
    Raises:
        WorkbenchError: a missing file, a directory, a file over `MAX_BYTES`, or bytes that are not UTF-8 text.
    """
    path = Path(path)
    where = f"{kind} '{path}'"
    if path.is_dir():
        raise WorkbenchError(f"{where} is a directory, not a file")
    if not path.exists():
        raise WorkbenchError(f"{where} does not exist")
    size = path.stat().st_size
    if size > MAX_BYTES:
        raise WorkbenchError(f"{where} is {size / 2**20:,.0f} MiB, over the {MAX_BYTES >> 20} MiB a text file may "
                             "hold; split it")
    with open(path, "rb") as f:
        data = f.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise WorkbenchError(f"{where} holds more than the {MAX_BYTES >> 20} MiB a text file may hold; split it")
    return decode(data, where)


def decode(data: bytes, where: str) -> str:
    """Returns UTF-8 `data` as text with its BOM dropped and CRLF and CR read as LF; else one line naming the byte."""
    if data.startswith(UTF16_MARKS):
        raise WorkbenchError(f"{where} is UTF-16 text (it starts with a UTF-16 byte-order mark); save it as UTF-8")
    nul = data.find(b"\0")
    if nul >= 0:
        raise WorkbenchError(f"{where} {_at(data, nul)}: a NUL byte, which text does not hold (UTF-16 text?); save it "
                             "as UTF-8")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise WorkbenchError(f"{where} {_at(data, err.start)}: byte 0x{data[err.start]:02x} is not UTF-8; save it "
                             "as UTF-8") from None
    return text.removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n")


def _at(data: bytes, offset: int) -> str:
    """'line L, byte B' of a byte offset, both counted from 1 (B within its line)."""
    line = data.count(b"\n", 0, offset) + 1
    start = data.rfind(b"\n", 0, offset) + 1
    return f"line {line}, byte {offset - start + 1}"


def numbered_lines(text: str) -> list[tuple[int, str]]:
    """(line number from 1, line) of every line holding more than white space.

    Lines end at '\\n' only: a U+2028 inside a prompt or a JSON string is text, not a line break.
    """
    return [(n, line) for n, line in enumerate(text.split("\n"), 1) if line.strip()]


def read_lines(path: str | os.PathLike, kind: str) -> list[tuple[int, str]]:
    """`numbered_lines` of a user's file read by `read_text`."""
    return numbered_lines(read_text(path, kind))


def read_json_lines(path: str | os.PathLike, kind: str) -> list[tuple[int, object]]:
    """(line number, value) of every non-blank line of a JSONL file, each read by `json_line`."""
    where = f"{kind} '{path}'"
    return [(n, json_line(line, f"{where} line {n}")) for n, line in read_lines(path, kind)]


class _Refused(ValueError):
    """A JSON value the reader refuses although the parser would take it."""


def json_line(text: str, where: str) -> object:
    """Returns the JSON value of one line, read strictly: no key twice, no NaN or Infinity, at most `MAX_DEPTH` deep.

    Raises:
        WorkbenchError: `where` and what is wrong, in one line.
    """
    try:
        value = json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_no_constant, parse_float=_finite)
        deep = _depth(value) > MAX_DEPTH
    except json.JSONDecodeError as err:
        raise WorkbenchError(f"{where}: not JSON: {err.msg} (column {err.colno})") from None
    except RecursionError:
        raise WorkbenchError(f"{where}: JSON nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as err:   # `_Refused`, or an integer longer than Python converts
        raise WorkbenchError(f"{where}: {str(err).splitlines()[0][:160]}") from None
    if deep:
        raise WorkbenchError(f"{where}: JSON nested deeper than {MAX_DEPTH} levels")
    return value


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    seen: dict = {}
    for key, value in pairs:
        if key in seen:   # json.loads would keep the last value and drop the first without a word
            raise _Refused(f"key {json.dumps(key, ensure_ascii=False)[:60]} is given twice in one object")
        seen[key] = value
    return seen


def _no_constant(name: str):
    raise _Refused(f"{name} is not a JSON number (write null, or a finite number)")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Refused(f"{text} is too large for a number (it reads as infinity)")
    return value


def _depth(value) -> int:
    """Nesting depth: 0 for a scalar, 1 for a flat list or object."""
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


def context_limit(tokenizer, config=None) -> int | None:
    """The most tokens a sequence may hold: the smaller of the tokenizer's `model_max_length` (when it sets a real
    one) and the config's `max_position_embeddings`; None when neither says."""
    limits = [getattr(tokenizer, "model_max_length", None), getattr(config, "max_position_embeddings", None)]
    real = [n for n in limits if isinstance(n, int) and not isinstance(n, bool) and 0 < n < UNKNOWN_MAX_LENGTH]
    return min(real) if real else None


def check_fits(lengths: list[int], limit: int | None, what: str = "prompt", extra: str = "",
               fix: str | None = None, added: int = 0) -> None:
    """Raises a one-line WorkbenchError naming the first of `lengths` (tokens, one per prompt) that is no tokens at all
    (text the tokenizer drops whole, such as control characters) or, with `added`, over `limit`.

    Args:
        lengths: tokens of each prompt (or row), numbered from 1 in the message.
        limit: `context_limit`'s; None checks only that each has a token.
        what: what the lengths count ("prompt", "row").
        extra: what the length includes besides the prompt (" with max_new_tokens=32").
        fix: what to do instead (default: give a shorter one).
        added: tokens each sequence gains besides the prompt (new tokens written), counted against `limit`.
    """
    empty = next((i for i, n in enumerate(lengths) if n == 0), None)
    if empty is not None:
        raise WorkbenchError(f"{what} {empty + 1} encodes to no tokens (the tokenizer drops all of its text); give "
                             "it text the tokenizer reads")
    if limit is None:
        return
    long = next((i for i, n in enumerate(lengths) if n + added > limit), None)
    if long is not None:
        raise WorkbenchError(f"{what} {long + 1} is {lengths[long] + added:,} tokens{extra}, past the {limit:,} the "
                             f"model reads (its positions, or its tokenizer's maximum if smaller); "
                             f"{fix or f'give a shorter {what}'}")
