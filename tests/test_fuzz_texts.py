"""A generator of prompt and rows files through `lens`, `generate` and `rows --from` (issue 55).

`hypothesis` writes each file as a user might: encodings (UTF-8 with and without a BOM, UTF-16 with and
without its mark, Latin-1), line endings (LF, CRLF, CR), blank lines, sizes on both sides of the limit,
prompts past the model's context, and for rows: fields of every JSON type, keys given twice, repeated
ids, NaN, nesting. Each case knows what it wrote, so the outcome is held to it: exit 0 and exactly the
prompts or rows written, or exit 2 with one line and nothing written. Never a traceback (it would
escape `invoke`), never a kill.

`WORKBENCH_FUZZ_CASES` sets the fast tier's budget (default 25 a test); the `slow` tests run 120 or
that budget, whichever is larger.
"""

import json
import os
from dataclasses import dataclass, field
from functools import cache

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from tests.test_cli_errors import invoke
from tests.test_texts import tiny  # noqa: F401  (the module fixture: the tiny retrofit, built once)
from tests.test_user_rows import CAPITALS
from workbench.models import load_tokenizer
from workbench.tasks.manifest import read_manifest

CASES = int(os.environ.get("WORKBENCH_FUZZ_CASES", "25"))
FAST = settings(max_examples=CASES, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
SLOW = settings(FAST, max_examples=max(CASES, 120))
LIMIT = 64 * 2**10            # the reader's size limit during these tests: sizes on both sides cost no disk
LONG = "word " * 1100         # past the tiny model's 1024 positions
ENDINGS = ["\n", "\r\n", "\r"]
text = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\n\r\x00"), max_size=30)
# control characters alone: a tokenizer may drop them all (SmolLM2's drops '\x06'), leaving a prompt of no tokens
control = st.text(st.characters(categories=("Cc",), exclude_characters="\n\r\x00"), min_size=1, max_size=3)


@dataclass
class File:
    """A file as written: its lines (what a reader must find), how they were encoded, and what must refuse it."""

    lines: list[str]
    ending: str = "\n"
    encoding: str = "utf-8"
    padding: int = 0                          # a blank line of this many spaces, to move the size
    refused: list[str] = field(default_factory=list)   # fragments of the one-line refusal, when refused

    def bytes(self) -> bytes:
        lines = [*self.lines, " " * self.padding] if self.padding else self.lines
        body = self.ending.join(lines) + self.ending
        if self.encoding == "latin-1":   # ends in 0xe9 0x20, never UTF-8; a letter Latin-1 lacks becomes '?'
            return (body + "é ").encode("latin-1", errors="replace")
        return body.encode(self.encoding)


@st.composite
def encoded(draw, lines: list[str], refused: list[str]) -> File:
    """`lines` with an encoding, a line ending and a size drawn; `refused` gains what the bytes alone refuse."""
    file = File(lines, draw(st.sampled_from(ENDINGS)),
                draw(st.sampled_from(["utf-8"] * 4 + ["utf-8-sig", "utf-16", "utf-16-le", "latin-1"])),
                draw(st.sampled_from([0, 0, 0, LIMIT - 200, LIMIT + 1])), list(refused))
    size = len(file.bytes())
    if size > LIMIT:
        file.refused = ["a text file may hold"]
    elif file.encoding == "utf-16":
        file.refused = ["is UTF-16 text"]
    elif file.encoding == "utf-16-le":    # every line ending holds a NUL byte
        file.refused = ["a NUL byte"]
    elif file.encoding == "latin-1":      # not UTF-8 (or, starting 'ÿþ', taken for UTF-16's mark)
        file.refused = ["UTF-", "save it as UTF-8"]
    return file


@cache
def tokenizer():
    """The tiny models' tokenizer: a prompt of characters it drops whole (control characters) is no tokens."""
    return load_tokenizer("tiny-llama")


@st.composite
def prompt_files(draw) -> tuple[File, list[str]]:
    """A prompts file and the prompts it holds (`\\n` in a line is a newline; blank lines are skipped)."""
    lines = draw(st.lists(text | control | st.sampled_from(["The capital of France is", " \t", "", "A -> B\\nStart at A.",
                                                            LONG]), max_size=5))
    prompts = [line.replace("\\n", "\n") for line in lines if line.strip()]
    refused = (["no prompt given"] if not prompts else ["is empty"] if any(not p.strip() for p in prompts)
               else ["encodes to no tokens"] if any(not tokenizer()(p)["input_ids"] for p in prompts)
               else ["past the 1,024 the model reads"] if any(p == LONG for p in prompts) else [])
    return draw(encoded(lines, refused)), prompts


def _value(draw, good: str):
    """A field's value: the good string, or another JSON type, or an empty string."""
    return draw(st.just(good) | st.none() | st.booleans() | st.integers(-2, 3) | st.floats(-2, 2)
                | st.lists(st.text(max_size=3), max_size=2) | st.just(""))


@st.composite
def rows_files(draw) -> tuple[File, list[tuple]]:
    """A rows file and the rows (prompt, answer, meta) it must freeze to, in order."""
    lines, rows, refused = [], [], []
    for n in range(draw(st.integers(1, 4))):
        country, city = CAPITALS[draw(st.integers(0, len(CAPITALS) - 1))]
        row = {"prompt": f"The capital of {country} is", "answer": city}
        change = draw(st.sampled_from(["none"] * 6 + ["prompt", "answer", "depth", "meta", "nested", "nan",
                                                      "twice", "id", "long", "unknown"]))
        line = None
        if change in ("prompt", "answer"):
            good = row[change]
            row[change] = _value(draw, good)
            ok = row[change] == good
        elif change == "depth":
            row["depth"] = draw(st.integers(-2, 3) | st.booleans() | st.floats(-2, 3) | st.text(max_size=2))
            ok = type(row["depth"]) is int and row["depth"] >= 1
        elif change == "meta":
            row["meta"] = draw(st.dictionaries(st.text(max_size=4), st.integers() | st.text(max_size=4), max_size=3)
                               | st.lists(st.integers(), max_size=2))
            ok = isinstance(row["meta"], dict)
        elif change == "nested":
            k = draw(st.integers(1, 200))
            row["meta"] = json.loads('{"x": ' + "[" * k + "]" * k + "}")
            ok = 2 + k <= 64
        elif change == "nan":
            line = json.dumps(row)[:-1] + ', "meta": {"x": NaN}}'
            ok = False
        elif change == "twice":
            line = json.dumps(row)[:-1] + f', "answer": "{city}"}}'
            ok = False
        elif change == "id":
            row["id"] = "same"
            ok = sum(r.get("id") == "same" for r in rows) == 0
        elif change == "long":
            row["prompt"] = LONG + row["prompt"]
            ok = False
        elif change == "unknown":
            row["candidate"] = [city]
            ok = False
        else:
            ok = True
        if not ok:
            refused = ["line "]
        rows.append(row)
        lines.append(line or json.dumps(row))
        if draw(st.booleans()):
            lines.append(draw(st.sampled_from(["", "  ", "\t"])))
    return draw(encoded(lines, refused)), [(r["prompt"], r["answer"], r.get("meta")) for r in rows]


# ----------------------------------------------------------------------------- the runs (`tiny`: test_texts')
@pytest.fixture
def quick(tiny, monkeypatch):  # noqa: F811  (the fixture imported above)
    """The tiny model loaded once, the reader's limit at `LIMIT`: each case reads a file, not a model."""
    monkeypatch.setattr("workbench.runs.load_checkpoint", lambda checkpoint: tiny)
    monkeypatch.setattr("workbench.commands.rows._tokenizer_and_config", lambda spec: (tiny[1], tiny[0].config))
    monkeypatch.setattr("workbench.texts.MAX_BYTES", LIMIT)
    return tiny


def refused_in_one_line(code, out, err, file: File, where) -> None:
    event(f"refused: {file.refused[0]}")
    assert code == 2, (file, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert all(f in lines[0] for f in file.refused), (file.refused, lines[0])
    assert out == "" and sorted(p.name for p in where.iterdir()) == ["in.txt"]


def check_prompts(capsys, monkeypatch, folder, command, case) -> None:
    file, prompts = case
    path = folder / "in.txt"
    path.write_bytes(file.bytes())
    more = ["--max-new-tokens", "1"] if command == "generate" else []
    code, out, err = invoke(capsys, monkeypatch, command, "tiny-llama", "--block", "2:4", "--loops", "1", "--prompts",
                            path, "--json", *more)
    if file.refused:
        refused_in_one_line(code, out, err, file, folder)
    else:
        event("read")
        assert code == 0, (file, err)
        assert json.loads(out)["prompts"] == prompts


def check_rows(capsys, monkeypatch, folder, case) -> None:
    file, rows = case
    path, out = folder / "in.txt", folder / "out.jsonl"
    path.write_bytes(file.bytes())
    code, stdout, err = invoke(capsys, monkeypatch, "rows", "--from", path, "--out", out, "--json")
    if file.refused:
        refused_in_one_line(code, stdout, err, file, folder)
    else:
        event("read")
        assert code == 0, (file, err)
        got = read_manifest(out).rows
        assert [(r["prompt"], r["answer"], r.get("meta")) for r in got] == rows
        assert json.loads(stdout)["rows"] == len(rows)


NO_TOKENS = (File(["\x06"], refused=["encodes to no tokens"]), ["\x06"])   # the search found it once; every run tries it


@FAST
@given(case=prompt_files(), command=st.sampled_from(["lens", "generate"]))
@example(case=NO_TOKENS, command="lens")
@example(case=NO_TOKENS, command="generate")
def test_prompt_files(capsys, monkeypatch, tmp_path_factory, quick, case, command):
    check_prompts(capsys, monkeypatch, tmp_path_factory.mktemp("p"), command, case)


@FAST
@given(case=rows_files())
def test_rows_files(capsys, monkeypatch, tmp_path_factory, quick, case):
    check_rows(capsys, monkeypatch, tmp_path_factory.mktemp("r"), case)


@pytest.mark.slow  # a longer search
@SLOW
@given(case=prompt_files(), command=st.sampled_from(["lens", "generate"]))
def test_prompt_files_longer(capsys, monkeypatch, tmp_path_factory, quick, case, command):
    check_prompts(capsys, monkeypatch, tmp_path_factory.mktemp("p"), command, case)


@pytest.mark.slow  # a longer search
@SLOW
@given(case=rows_files())
def test_rows_files_longer(capsys, monkeypatch, tmp_path_factory, quick, case):
    check_rows(capsys, monkeypatch, tmp_path_factory.mktemp("r"), case)
