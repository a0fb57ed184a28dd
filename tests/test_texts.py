"""One reader of a user's text (issue 55): the same bytes are the same prompts and rows in every command.

Each case of the issue's list is one test here, through the CLI in-process (`invoke`): a BOM or CRLF that
changed prompts, UTF-16 that read as text, bytes named without their line, a 2 GB file, a duplicate key, NaN in
`meta`, a prompt past the model's context, a directory called missing, a raw rows file given to `probe`,
sampling options without `--sample`, and anything but the JSON object on stdout under `--json`.
"""

import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_cli_errors import assert_clean_error, invoke
from workbench.errors import WorkbenchError
from workbench.texts import MAX_BYTES, context_limit, json_line, read_text

ROOT = Path(__file__).resolve().parents[1]
TINY = ("tiny-llama", "--block", "2:4", "--loops", "1")
PROMPTS = ["The capital of France is", "One, two, three,"]


@pytest.fixture(scope="module")
def tiny():
    """The tiny retrofit every reading command here loads, built once (`workbench.runs.load_checkpoint`'s value)."""
    from workbench.checkpoints import parse_model
    from workbench.runs import load_checkpoint

    return load_checkpoint(parse_model("tiny-llama", "2:4"))


@pytest.fixture
def loaded(tiny, monkeypatch):
    monkeypatch.setattr("workbench.runs.load_checkpoint", lambda checkpoint: tiny)
    return tiny


def reading(capsys, monkeypatch, command: str, path: Path, *extra) -> list[str]:
    """The prompts `command` read from the file at `path`, as its --json result says."""
    more = ("--max-new-tokens", "1") if command == "generate" else ()
    code, out, err = invoke(capsys, monkeypatch, command, *TINY, "--prompts", path, "--json", *more, *extra)
    assert code == 0, err
    return json.loads(out)["prompts"]


# ----------------------------------------------------------------------------- bytes and lines
@pytest.mark.parametrize("command", ["lens", "generate"])
@pytest.mark.parametrize("ending", ["\r\n", "\r"])
def test_a_bom_and_crlf_leave_the_prompts_as_written(capsys, monkeypatch, tmp_path, loaded, command, ending):
    """A Windows file read '\\r' as each prompt's last token and the BOM as three more."""
    path = tmp_path / "p.txt"
    path.write_bytes(b"\xef\xbb\xbf" + ending.join(PROMPTS).encode() + ending.encode())
    assert reading(capsys, monkeypatch, command, path) == PROMPTS


def test_rows_and_corpus_read_the_same_text(tmp_path):
    from workbench.selection.stage1 import load_corpus

    path = tmp_path / "c.txt"
    path.write_bytes(b"\xef\xbb\xbf" + "\r\n".join(f"text {i}" for i in range(12)).encode())
    assert load_corpus(path) == [f"text {i}" for i in range(12)]


@pytest.mark.parametrize("data, fragment", [
    ("hi\nthere\n".encode("utf-16"), "is UTF-16 text"),
    ("hi\nthere\n".encode("utf-16-le"), "line 1, byte 2: a NUL byte"),   # no mark: read as 'h\0i\0' before
    (b"fine\nalso fine\ncaf\xe9\n", "line 3, byte 4: byte 0xe9 is not UTF-8"),
])
def test_bytes_that_are_not_utf8_are_named_by_line_and_byte(capsys, monkeypatch, tmp_path, data, fragment):
    path = tmp_path / "p.txt"
    path.write_bytes(data)
    code, out, err = invoke(capsys, monkeypatch, "lens", *TINY, "--prompts", path)
    assert_clean_error(code, err, f"--prompts '{path}'", fragment)
    assert out == ""


@pytest.mark.parametrize("command", [("lens", *TINY, "--prompts"), ("rows", "--out", "OUT", "--from")])
def test_a_2gb_file_is_refused_before_it_is_read(capsys, monkeypatch, tmp_path, command):
    """Before: `lens --prompts` was killed by the kernel at 23 GB resident; now the size is read, not the bytes."""
    path = tmp_path / "big.txt"
    with open(path, "wb") as f:
        f.truncate(2 * 2**30)   # sparse: no disk used
    args = [str(tmp_path / "out.jsonl") if a == "OUT" else a for a in command]
    code, out, err = invoke(capsys, monkeypatch, *args, path)
    assert_clean_error(code, err, "2,048 MiB, over the 64 MiB a text file may hold")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.txt"]


def test_a_file_that_grows_past_the_limit_while_read_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr("workbench.texts.MAX_BYTES", 8)
    path = tmp_path / "p.txt"
    path.write_text("12345678")
    assert read_text(path, "--prompts") == "12345678"
    path.write_text("123456789")
    with pytest.raises(WorkbenchError, match="over the 0 MiB"):
        read_text(path, "--prompts")


# ----------------------------------------------------------------------------- JSON read strictly
@pytest.mark.parametrize("line, fragment", [
    ('{"prompt": "a", "answer": "b", "answer": "c"}', 'key "answer" is given twice'),
    ('{"prompt": "a", "meta": {"x\\ny": 1, "x\\ny": 2}}', 'key "x\\ny" is given twice'),   # one line still
    ('{"prompt": "a", "answer": "b", "meta": {"x": NaN}}', "NaN is not a JSON number"),
    ('{"prompt": "a", "answer": "b", "meta": {"x": -Infinity}}', "-Infinity is not a JSON number"),
    ('{"prompt": "a", "answer": "b", "meta": {"x": 1e999}}', "too large for a number"),
    ('{"prompt": "a", "meta": ' + "[" * 65 + "]" * 65 + "}", "nested deeper than 64"),
    ('{"prompt": "a", "meta": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested deeper than 64"),  # past recursion
])
def test_json_lines_are_read_strictly(line, fragment):
    with pytest.raises(WorkbenchError, match=re.escape(fragment)) as err:
        json_line(line, "rows file 'f' line 3")
    assert str(err.value).startswith("rows file 'f' line 3: ") and "\n" not in str(err.value)


@pytest.mark.parametrize("fragment, line", [
    ('key "answer" is given twice', '{"prompt": "The capital of France is", "answer": "Paris", "answer": "Rome"}'),
    ("NaN is not a JSON number", '{"prompt": "The capital of France is", "answer": "Paris", "meta": {"x": NaN}}'),
])
def test_rows_from_refuses_a_duplicate_key_and_nan_and_writes_nothing(capsys, monkeypatch, tmp_path, fragment, line):
    """Before: the last 'answer' won silently, and NaN was written into the manifest as non-standard JSON."""
    source, out = tmp_path / "mine.jsonl", tmp_path / "out.jsonl"
    source.write_text('{"prompt": "The capital of Italy is", "answer": "Rome"}\n' + line + "\n")
    code, stdout, err = invoke(capsys, monkeypatch, "rows", "--from", source, "--out", out)
    assert_clean_error(code, err, f"rows file '{source}' line 2: ", fragment)
    assert stdout == "" and sorted(p.name for p in tmp_path.iterdir()) == ["mine.jsonl"]


def test_a_generator_functions_nan_meta_is_refused(capsys, monkeypatch, tmp_path):
    folder = tmp_path / "mods"
    folder.mkdir()
    (folder / "wb_nan_rows.py").write_text(
        "def rows():\n    return [{'prompt': 'The capital of France is', 'answer': 'Paris', 'meta': {'x': float('nan')}},\n"
        "            {'prompt': 'The capital of Italy is', 'answer': 'Rome'}]\n")
    monkeypatch.syspath_prepend(str(folder))
    out = tmp_path / "out.jsonl"
    code, _, err = invoke(capsys, monkeypatch, "rows", "--task", "wb_nan_rows:rows", "--out", out)
    sys.modules.pop("wb_nan_rows", None)
    assert_clean_error(code, err, "row 1: meta holds a value JSON cannot write (NaN")
    assert not out.exists()


# ----------------------------------------------------------------------------- where a rows file is wrong
def test_a_directory_given_as_a_rows_file_is_named_a_directory(capsys, monkeypatch, tmp_path):
    folder = tmp_path / "rows.jsonl"
    folder.mkdir()
    code, _, err = invoke(capsys, monkeypatch, "rows", "--from", folder, "--out", tmp_path / "out.jsonl")
    assert_clean_error(code, err, f"rows file '{folder}' is a directory, not a file")


def test_probe_on_a_raw_rows_file_says_how_to_freeze_it(capsys, monkeypatch, tmp_path):
    raw = tmp_path / "mine.jsonl"
    raw.write_text('{"prompt": "The capital of France is", "answer": "Paris"}\n')
    code, _, err = invoke(capsys, monkeypatch, "probe", "--checkpoint", "untrained:tiny-llama:2:4", "--rows", raw,
                          "--out", tmp_path / "res")
    assert_clean_error(code, err, "not a frozen manifest", f"workbench rows --from {raw} --out ")
    assert not (tmp_path / "res").exists()


# ----------------------------------------------------------------------------- the model's context
def test_the_context_is_the_smaller_of_the_tokenizers_and_the_configs():
    from types import SimpleNamespace as NS

    assert context_limit(NS(model_max_length=10 ** 30), NS(max_position_embeddings=8192)) == 8192   # SmolLM2's
    assert context_limit(NS(model_max_length=512), NS(max_position_embeddings=8192)) == 512
    assert context_limit(NS(model_max_length=10 ** 30), None) is None


@pytest.mark.parametrize("command", ["lens", "generate"])
def test_a_prompt_past_the_tokenizers_maximum_is_refused_before_any_forward(capsys, monkeypatch, tmp_path, loaded,
                                                                            command):
    """The tiny model has 1024 positions; its tokenizer says 8: the smaller bounds a prompt (before: the config's)."""
    looped, tok, _ = loaded
    monkeypatch.setattr(tok, "model_max_length", 8)
    monkeypatch.setattr(type(looped), "forward", lambda *a, **k: pytest.fail("a forward ran"))
    code, _, err = invoke(capsys, monkeypatch, command, *TINY, "-p", "one two three four five six seven eight nine")
    assert_clean_error(code, err, "prompt 1 is ", "past the 8 the model reads")


def test_probe_refuses_a_long_row_anywhere_before_any_probe(capsys, monkeypatch, tmp_path):
    """A row past the context, seventh of its manifest, is found before the first probe reads a row."""
    from workbench.tasks.manifest import write_manifest

    rows = [{"row_id": f"r{i}", "task": "user", "depth": 0, "prompt": f"The capital of France is{' ' * i}",
             "answer": "Paris", "symbols": []} for i in range(9)]
    rows[6]["prompt"] = "word " * 1100 + "The capital of France is"
    manifest = tmp_path / "rows.jsonl"
    write_manifest(rows, manifest)
    monkeypatch.setattr("workbench.probes.battery.run_probe", lambda *a, **k: pytest.fail("a probe ran"))
    code, _, err = invoke(capsys, monkeypatch, "probe", "--checkpoint", "untrained:tiny-llama:2:4", "--rows",
                          manifest, "--only", "loop_accuracy", "--out", tmp_path / "res")
    assert_clean_error(code, err, f"'{manifest}'", "tokens")   # the battery's own check (issue 55 item 2) names it
    assert not (tmp_path / "res").exists()


# ----------------------------------------------------------------------------- the smaller list
@pytest.mark.parametrize("given", [("--temperature", "0.7"), ("--top-k", "5"), ("--temperature", "1.0")])
def test_sampling_options_without_sample_are_refused(capsys, monkeypatch, loaded, given):
    code, out, err = invoke(capsys, monkeypatch, "generate", *TINY, "-p", "hi", *given)
    assert_clean_error(code, err, f"{given[0]} shapes sampling; add --sample")
    assert out == ""


def test_sampling_options_with_sample_are_taken(capsys, monkeypatch, loaded):
    code, out, err = invoke(capsys, monkeypatch, "generate", *TINY, "-p", "hi", "--sample", "--temperature", "0.7",
                            "--top-k", "5", "--max-new-tokens", "2", "--json")
    assert code == 0, err
    assert {k: json.loads(out)["settings"][k] for k in ("temperature", "top_k")} == {"temperature": 0.7, "top_k": 5}


# ----------------------------------------------------------------------------- --json: stdout holds the object only
def test_json_stdout_holds_only_the_object_whatever_a_library_prints(capsys, monkeypatch, tiny):
    """DeepSpeed makes its logger on a model's first load, bound to the sys.stdout of that moment, and logs its
    accelerator line there: that printed line (and a plain print) must land on stderr."""
    def noisy_load(checkpoint):
        handler = logging.StreamHandler(sys.stdout)   # as deepspeed.utils.logging makes its handler
        noisy = logging.getLogger("wb-test-noisy")
        noisy.addHandler(handler)
        noisy.warning("Setting accelerator to CPU.")
        noisy.removeHandler(handler)
        print("a library's print")
        return tiny

    monkeypatch.setattr("workbench.runs.load_checkpoint", noisy_load)
    code, out, err = invoke(capsys, monkeypatch, "lens", *TINY, "-p", "hi", "--json")
    assert code == 0, err
    assert json.loads(out)["prompts"] == ["hi"]
    assert "Setting accelerator to CPU." in err and "a library's print" in err


def test_the_gguf_bar_is_drawn_on_terminals_only(capsys):
    """transformers' GGUF conversion bar went to stderr even when stderr was a file."""
    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    from workbench.models.bases import _bar_on_terminals_only

    with _bar_on_terminals_only():
        for _ in gguf_utils.tqdm(range(3), desc="Converting and de-quantizing GGUF tensors..."):
            pass
    assert capsys.readouterr().err == ""


@pytest.mark.slow  # a fresh process converts the 135M GGUF into a fresh cache (about 30 s)
def test_json_on_a_fresh_cache_is_only_json_and_draws_no_bar(tmp_path):
    env = {**os.environ, "WORKBENCH_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "workbench", "lens", "smollm2-135m-instruct", "--block", "10:16",
                           "--loops", "2", "-p", "The capital of France is", "--json"], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["prompts"] == ["The capital of France is"]   # the whole stdout is the object
    assert "Converting" not in done.stderr and "it/s" not in done.stderr


@pytest.mark.slow  # a fresh process: the old code hung here until killed
@pytest.mark.parametrize("browser", ["/nonexistent/chromium", "/bin/false"])
def test_figures_png_without_a_browser_ends_in_one_line(tmp_path, browser):
    """No browser at all, and one that exits at once (kaleido's own thread dies): one line, exit 2, never a hang."""
    sys.path.insert(0, str(ROOT / "tests" / "plots"))
    import synthetic

    results = synthetic.write_results(tmp_path / "run1")
    env = {**os.environ, "BROWSER_PATH": browser, "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "workbench", "figures", "--results", str(results), "--format", "png",
                           "--out", str(tmp_path / "figs")], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: static export (pdf, svg, png) needs Chromium"), done.stderr
    assert "make browser" in lines[0] and not (tmp_path / "figs").exists()


@pytest.mark.slow  # a fresh process waits out START_S, set to 3 s here
def test_a_browser_that_never_answers_is_given_up_on_and_the_process_ends(tmp_path):
    """A browser that starts and never answers: kaleido's threads would wait on it forever, and hold the exit."""
    hang = tmp_path / "chromium"
    hang.write_text("#!/bin/sh\nexec sleep 90\n")   # ends by itself, after the 60 s a held exit would take
    hang.chmod(0o755)
    script = ("import workbench.plots.browser as b\nb.START_S = 3\ntry:\n    b.Browser().__enter__()\n"
              "except Exception as err:\n    print(err)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "BROWSER_PATH": str(hang), "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0 and "could not start (no image within 3 s)" in done.stdout, done.stderr


def test_the_limit_is_stated_in_the_docs():
    assert MAX_BYTES == 64 * 2**20
    assert "64 MiB" in (ROOT / "docs" / "cli.md").read_text()
