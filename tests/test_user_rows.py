"""Rows from a user's own file or generator (`workbench rows --from`, `--task module:function`), and probes that
say which row fields they need (`ProbeSpec.needs`): the battery runs what the rows allow and names what is missing.
"""

from __future__ import annotations

import json
import sys

import pandas as pd
import pytest

import workbench as wb
from tests.test_cli_errors import assert_clean_error, invoke  # the in-process CLI runner
from workbench.errors import WorkbenchError
from workbench.models import load_tokenizer
from workbench.probes import PROBES, NotApplicable, get_probe
from workbench.probes.battery import battery_rows, run_battery, run_probe
from workbench.probes.common import select_rows
from workbench.probes.spec import lacks
from workbench.tasks import build_rows
from workbench.tasks.manifest import read_manifest

UNTRAINED = "untrained:tiny-llama:2:4"
CAPITALS = [("France", "Paris"), ("Italy", "Rome"), ("Germany", "Berlin"), ("Spain", "Madrid"), ("England", "London"),
            ("Japan", "Tokyo"), ("Portugal", "Lisbon"), ("Austria", "Vienna"), ("Egypt", "Cairo"), ("Canada", "Ottawa"),
            ("Australia", "Canberra"), ("Russia", "Moscow"), ("China", "Beijing"), ("Greece", "Athens"),
            ("Norway", "Oslo"), ("Ireland", "Dublin"), ("Poland", "Warsaw"), ("Czechia", "Prague"), ("Korea", "Seoul"),
            ("India", "Delhi"), ("Peru", "Lima"), ("Kenya", "Nairobi"), ("Belgium", "Brussels"), ("Finland", "Helsinki")]
FOUR = ["Berlin", "Madrid", "Paris", "Rome"]   # the first four capitals' answers, as a candidate set
TRUSTED = ("loop_accuracy", "logit_lens", "lens_agreement", "dynamics", "exit_rules")


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


def capital(i: int, **extra) -> dict:
    country, city = CAPITALS[i]
    return {"prompt": f"The capital of {country} is", "answer": city, **extra}


def write_jsonl(path, lines) -> None:
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))


# ----------------------------------------------------------------------------- a good file
def test_a_plain_file_round_trips_with_its_candidates_defaulted(capsys, monkeypatch, tmp_path):
    source, out = tmp_path / "capitals.jsonl", tmp_path / "rows" / "capitals.jsonl"
    write_jsonl(source, [capital(i) for i in range(len(CAPITALS))] + [""])   # a blank line is skipped
    code, stdout, err = invoke(capsys, monkeypatch, "rows", "--from", source, "--out", out, "--json")
    assert code == 0, err
    manifest = read_manifest(out)                     # the sidecar verifies against the rows
    assert json.loads(stdout)["rows_sha256"] == manifest.digest
    rows, meta = manifest.rows, manifest.sidecar["meta"]
    answers = sorted(city for _, city in CAPITALS)
    assert [r["row_id"] for r in rows] == [f"user-{n}" for n in range(1, 25)]
    assert all(r["task"] == "user" and r["depth"] == 0 and r["symbols"] == answers and "chain" not in r for r in rows)
    assert "24 distinct answers" in meta["candidates"] and "not given on 24 of 24" in meta["depth"]
    assert meta["from"] == str(source) and meta["tokenizer"] == "smollm2-135m-instruct"
    assert manifest.sidecar["depth_counts"] == {"0": 24}
    before = out.read_bytes()                         # the same file freezes to the same bytes
    code, _, err = invoke(capsys, monkeypatch, "rows", "--from", source, "--out", out, "--overwrite", "--quiet")
    assert code == 0 and out.read_bytes() == before, err


def test_every_optional_field_is_kept(capsys, monkeypatch, tmp_path):
    source, out = tmp_path / "mine.jsonl", tmp_path / "out.jsonl"
    write_jsonl(source, [capital(i, candidates=FOUR, id=f"cap-{i}", depth=1, meta={"continent": "Europe"})
                         for i in range(3)] + [capital(3, candidates=FOUR, chain=["Berlin", "Madrid"], id="two-step")])
    code, _, err = invoke(capsys, monkeypatch, "rows", "--from", source, "--out", out)
    assert code == 0, err
    manifest = read_manifest(out)
    rows = {r["row_id"]: r for r in manifest.rows}
    assert rows["cap-0"]["symbols"] == FOUR and rows["cap-0"]["depth"] == 1 and rows["cap-0"]["meta"] == {
        "continent": "Europe"}
    assert rows["two-step"]["chain"] == ["Berlin", "Madrid"] and rows["two-step"]["depth"] == 2  # depth = len(chain)
    assert manifest.sidecar["meta"]["candidates"] == "given" and manifest.sidecar["meta"]["depth"] == "given"


def test_answers_that_are_not_single_tokens_are_read_exactly(tok, tmp_path):
    source = tmp_path / "sums.jsonl"
    write_jsonl(source, [{"prompt": f"{a} + {b} =", "answer": str(a + b)} for a, b in ((2, 2), (7, 5), (10, 3))])
    rows, meta = wb.read_user_rows(source, tok)
    assert all(r["symbols"] == [] for r in rows) and "read exactly" in meta["candidates"]   # the multi-token reader


# ----------------------------------------------------------------------------- bad rows: one line, exit 2, nothing
def base(n: int = 4, **extra) -> list:
    return [capital(i, **extra) for i in range(n)]


def with_line3(row, **extra) -> list:
    lines = base(**extra)
    lines[2] = row
    return lines


BAD_ROWS = {   # the file's lines, and what the one-line error must say; the bad row is on line 3 unless named
    "bad JSON": (with_line3('{"prompt": "The capital of Germany is", '), "not JSON: "),
    "not an object": (with_line3("[1, 2]"), "not a JSON object (a list)"),
    "no answer": (with_line3({"prompt": "The capital of Germany is"}), ": no answer"),
    "prompt not a string": (with_line3({"prompt": 7, "answer": "Berlin"}), "prompt must be a non-empty string"),
    "empty answer": (with_line3(capital(2, answer="")), "answer must be a non-empty string"),
    "answer over two lines": (with_line3(capital(2, answer="Ber\nlin")), "line break"),
    "unknown field": (with_line3(capital(2, candidate=FOUR)), "unknown field 'candidate'"),
    "depth a string": (with_line3(capital(2, depth="2")), "depth must be an integer >= 1"),
    "depth a bool": (with_line3(capital(2, depth=True)), "depth must be an integer >= 1"),
    "depth 0": (with_line3(capital(2, depth=0)), "depth must be an integer >= 1"),
    "chain a string": (with_line3(capital(2, chain="Berlin")), "chain must be a non-empty list"),
    "chain not ending with the answer": (with_line3(capital(2, chain=["Berlin", "Paris"])), "not the answer"),
    "chain longer than the depth": (with_line3(capital(2, chain=["Paris", "Berlin"], depth=1)), "depth is 1"),
    "id not a string": (with_line3(capital(2, id=3)), "id must be a non-empty string"),
    "id with a line break": (with_line3(capital(2, id="a\nb")), "id must be"),
    "duplicate id": ([capital(0, id="cap"), capital(1), capital(2, id="cap"), capital(3)], "repeats line 1"),
    "id that a generated one repeats": ([capital(0, id="user-3"), capital(1), capital(2)], "repeats line 1"),
    "meta not an object": (with_line3(capital(2, meta=[1])), "meta must be a JSON object"),
    "candidates a string": (with_line3(capital(2, candidates="Berlin"), candidates=FOUR),
                            "candidates must be a non-empty list"),
    "candidates repeat": (with_line3(capital(2, candidates=["Berlin", "Berlin", "Paris", "Rome"]), candidates=FOUR),
                          "candidates repeat 'Berlin'"),
    "answer not among its candidates": (with_line3(capital(2, candidates=["Oslo", "Madrid", "Paris", "Rome"]),
                                                   candidates=FOUR), "is not among its candidates"),
    "a candidate that is not one token": (with_line3(capital(2, candidates=["Berlin", "Madrid", "Paris", "Ankara"]),
                                                     candidates=FOUR), "candidate 'Ankara' is not one token"),
    "chain entry not a candidate": (with_line3(capital(2, candidates=FOUR, chain=["Oslo", "Berlin"]), candidates=FOUR),
                                    "chain entry 'Oslo' is not among its candidates"),
    "fewer candidates than the others": (with_line3(capital(2, candidates=["Berlin", "Paris"]), candidates=FOUR),
                                         "2 candidates, while line 1 has 4"),
    "candidates on some rows only": (with_line3(capital(2), candidates=FOUR), "no candidates, while line 1 gives some"),
    "answer not at the read position": (with_line3({"prompt": "The capital of Germany is Ber", "answer": "lin",
                                                    "answer_prefix": ""}), "does not start at a token boundary"),
    "prompt of no tokens": (with_line3({"prompt": "\x06\x06", "answer": "Berlin"}), "the prompt encodes to no tokens"),
    "corrupt a string": (with_line3(capital(2, corrupt="The capital of Spain is")), "corrupt must be an object"),
    "corrupt without an answer": (with_line3(capital(2, corrupt={"prompt": "The capital of Spain is"})),
                                  "corrupt must be an object"),
    "corrupt with another field": (with_line3(capital(2, corrupt={"prompt": "The capital of Spain is", "answer": "Madrid",
                                                                  "depth": 1})), "corrupt must be an object"),
    "corrupt that keeps the answer": (with_line3(capital(2, corrupt={"prompt": "The capital of Spain is",
                                                                     "answer": "Berlin"})), "must change the prompt and"),
    "corrupt answer not a candidate": (with_line3(capital(2, corrupt={"prompt": "The capital of Spain is",
                                                                      "answer": "Oslo"}, candidates=FOUR),
                                                  candidates=FOUR), "corrupt answer 'Oslo' is not among"),
    "corrupt prompt of another length": (with_line3(capital(2, corrupt={"prompt": "The capital city of Spain is",
                                                                        "answer": "Madrid"})),
                                         "corrupt prompt is 6 tokens and the prompt 5"),
}


@pytest.mark.parametrize("case", sorted(BAD_ROWS))
def test_a_bad_row_is_one_line_naming_its_line_and_nothing_is_written(capsys, monkeypatch, tmp_path, case):
    lines, fragment = BAD_ROWS[case]
    source, out = tmp_path / "mine.jsonl", tmp_path / "out.jsonl"
    write_jsonl(source, lines)
    code, stdout, err = invoke(capsys, monkeypatch, "rows", "--from", source, "--out", out)
    assert_clean_error(code, err, f"rows file '{source}' line 3: ", fragment)
    assert stdout == "" and sorted(p.name for p in tmp_path.iterdir()) == ["mine.jsonl"]   # no manifest, no sidecar


@pytest.mark.parametrize("tokenizer_max, positions", [(16, None), (16, 4096), (10 ** 30, 16)])
def test_a_prompt_past_the_models_context_is_refused(capsys, monkeypatch, tmp_path, tok, tokenizer_max, positions):
    """The smaller of the tokenizer's own maximum and the config's positions bounds a row; a tokenizer that sets no
    maximum (transformers' 1e30) leaves the positions to say (issue 55: 20,005 tokens passed against 8,192)."""
    from types import SimpleNamespace

    monkeypatch.setattr(tok, "model_max_length", tokenizer_max)
    config = SimpleNamespace(max_position_embeddings=positions)
    monkeypatch.setattr("workbench.commands.rows._tokenizer_and_config", lambda spec: (tok, config))
    source, out = tmp_path / "mine.jsonl", tmp_path / "out.jsonl"
    long = "Of all the great old cities of central Europe, the largest and the capital of Germany is"
    write_jsonl(source, with_line3(capital(2, prompt=long)))
    code, _, err = invoke(capsys, monkeypatch, "rows", "--from", source, "--out", out)
    assert_clean_error(code, err, "line 3: ", "past the model's context of 16 tokens")
    assert not out.exists()


@pytest.mark.parametrize("args, fragment", [
    (["--from", "{source}", "--task", "chase"], "not both"),
    (["--from", "{source}", "--depths", "1-3"], "--depths is an option of the built-in tasks"),
    (["--from", "{source}", "--alphabet", "8"], "--alphabet is an option of the built-in tasks"),
    (["--from", "{missing}"], "does not exist"),
    (["--from", "{empty}"], "holds no rows"),
    (["--task", "state", "--seed", "1"], "--task state needs --depths"),
    (["--depths", "1-3"], "--task chase needs --seed"),
])
def test_the_options_that_go_together(capsys, monkeypatch, tmp_path, args, fragment):
    source, empty, out = tmp_path / "mine.jsonl", tmp_path / "empty.jsonl", tmp_path / "out.jsonl"
    write_jsonl(source, base())
    empty.write_text("\n")
    args = [a.format(source=source, missing=tmp_path / "nope.jsonl", empty=empty) for a in args]
    code, _, err = invoke(capsys, monkeypatch, "rows", *args, "--out", out)
    assert_clean_error(code, err, fragment)
    assert not out.exists()


# ----------------------------------------------------------------------------- a generator function
TASKS_MODULE = '''
CAPITALS = {capitals!r}


def capitals(seed, per_depth=3):
    order = sorted(range(len(CAPITALS)), key=lambda i: (i * 7 + seed) % len(CAPITALS))
    for i in order[:per_depth * 2]:
        country, city = CAPITALS[i]
        yield {{"prompt": f"The capital of {{country}} is", "answer": city, "id": f"cap-{{i}}"}}


def repeated():
    return [{{"prompt": "a", "answer": "b", "id": "x"}}, {{"prompt": "c", "answer": "d"}}, {{"prompt": "e", "answer": "f",
            "id": "x"}}]


def broken(depths):
    raise ValueError("no rows at depths " + str(depths))


def not_rows():
    return 5
'''


@pytest.fixture
def tasks_module(tmp_path, monkeypatch):
    folder = tmp_path / "mods"
    folder.mkdir()
    (folder / "wb_user_tasks.py").write_text(TASKS_MODULE.format(capitals=CAPITALS))
    monkeypatch.syspath_prepend(str(folder))
    yield "wb_user_tasks"
    sys.modules.pop("wb_user_tasks", None)


def test_a_generator_function_gets_the_same_manifest_and_checks(capsys, monkeypatch, tmp_path, tasks_module, tok):
    out = tmp_path / "gen.jsonl"
    code, _, err = invoke(capsys, monkeypatch, "rows", "--task", f"{tasks_module}:capitals", "--seed", "4",
                          "--per-depth", "5", "--out", out)
    assert code == 0, err
    manifest = read_manifest(out)
    assert len(manifest.rows) == 10 and all(r["row_id"].startswith("cap-") and r["depth"] == 0 for r in manifest.rows)
    assert manifest.sidecar["meta"]["task"] == f"{tasks_module}:capitals" and manifest.sidecar["meta"]["seed"] == 4
    assert len(manifest.rows[0]["symbols"]) == 10     # candidates defaulted to the 10 distinct answers
    same = build_rows(f"{tasks_module}:capitals", [1], 5, 4, tokenizer=tok)   # the API takes the same name
    assert same == manifest.rows


@pytest.mark.parametrize("function, args, fragment", [
    ("repeated", [], "row 3: id 'x' repeats row 1's"),
    ("capitals", [], "needs --seed"),
    ("repeated", ["--seed", "1"], "takes no seed"),
    ("broken", ["--depths", "1-2"], "failed: ValueError: no rows at depths [1, 2]"),
    ("not_rows", [], "returned int, not an iterable of row dicts"),
    ("missing", [], "has no function 'missing'"),
])
def test_a_generator_functions_bad_rows_and_options(capsys, monkeypatch, tmp_path, tasks_module, function, args,
                                                     fragment):
    out = tmp_path / "gen.jsonl"
    code, _, err = invoke(capsys, monkeypatch, "rows", "--task", f"{tasks_module}:{function}", *args, "--out", out)
    assert_clean_error(code, err, fragment)
    assert not out.exists() and not out.with_suffix(".manifest.json").exists()


def test_a_module_that_cannot_be_imported_is_one_line(capsys, monkeypatch, tmp_path):
    code, _, err = invoke(capsys, monkeypatch, "rows", "--task", "no_such_module_here:rows", "--out",
                          tmp_path / "o.jsonl")
    assert_clean_error(code, err, "cannot import module 'no_such_module_here'")


# ----------------------------------------------------------------------------- probes say what they need
def test_every_shipped_probe_declares_the_fields_it_needs():
    for name in PROBES:
        fields = get_probe(name).fields
        assert fields and "prompt" in fields, name
        assert set(fields) <= {"prompt", "answer", "symbols", "chain", "depth", "table", "start"}, name


def test_the_shipped_rows_meet_every_probes_needs(tok):
    """Nothing changes for the built-in tasks: a chase row has every field any probe reads, a state row every one
    but the function table's."""
    chase = build_rows("chase", [1, 2], 2, 0, alphabet=8, tokenizer=tok)
    state = build_rows("state", [1, 2], 2, 0)
    assert {n: get_probe(n).lacking(chase) for n in PROBES} == {n: [] for n in PROBES}
    lacking = {n: get_probe(n).lacking(state) for n in PROBES if get_probe(n).lacking(state)}
    assert {tuple(v) for v in lacking.values()} == {("table",)}, lacking  # a state row lacks the function table only
    assert {"overshoot", "splice", "heads", "linear_probe", "gradient_audit"} <= set(lacking)


def test_a_row_lacks_a_field_when_absent_null_or_a_depth_of_zero():
    row = {"prompt": "p", "answer": "a", "symbols": [], "depth": 0, "chain": None}
    assert [f for f in ("prompt", "answer", "symbols", "depth", "chain", "table") if lacks(row, f)] == [
        "depth", "chain", "table"]
    assert not lacks({**row, "depth": 3}, "depth")


def test_a_probe_whose_rows_lack_a_field_is_not_applicable_naming_it(tok):
    rows = [{"row_id": f"r{i}", "task": "user", "depth": 2, "prompt": f"The capital of {c} is", "answer": a,
             "symbols": FOUR} for i, (c, a) in enumerate(CAPITALS[:4])]
    with pytest.raises(NotApplicable, match="^needs chain$"):        # checked before the probe runs: no model needed
        run_probe("depth_matrix", None, tok, rows, {}, {})
    with pytest.raises(NotApplicable, match="^needs chain, table, start$"):
        wb.probe("overshoot", None, tok, rows)
    with pytest.raises(NotApplicable, match="^needs depth, table, start$"):
        run_probe("splice", None, tok, [{**r, "depth": 0} for r in rows], {}, {})


def test_the_battery_runs_what_a_prompt_and_answer_file_allows(capsys, monkeypatch, tmp_path):
    """24 capital-city prompts with one-token answers, nothing else: the five probes that need only prompt, answer
    and candidates produce their tables at the model's own loop count; overshoot and splice say what they need."""
    source, manifest = tmp_path / "capitals.jsonl", tmp_path / "capitals_rows.jsonl"
    write_jsonl(source, [capital(i) for i in range(len(CAPITALS))])
    code, _, err = invoke(capsys, monkeypatch, "rows", "--from", source, "--out", manifest)
    assert code == 0, err
    battery = tmp_path / "user.toml"
    options = {"lens_agreement": "max_causal = 8\n", "dynamics": "loops = 6\n"}   # fewer splices and passes: time
    battery.write_text("[battery]\nbatch_size = 8\n" + "".join(f"[probes.{n}]\n{options.get(n, '')}"
                                                                for n in (*TRUSTED, "overshoot", "splice")))
    out = tmp_path / "r"
    summary = run_battery(checkpoint=UNTRAINED, battery=battery, out=out, rows=str(manifest), progress=False)
    probes = summary["probes"]
    for name in TRUSTED:
        assert "status" not in probes[name] and probes[name]["headline"]["numbers"], name
        assert (out / f"{name}.parquet").is_file() and summary["probe_runs"][name]["rows"]["n"] == 24
    assert probes["overshoot"] == {"status": "not_applicable", "reason": "needs chain, depth, table, start"}
    assert probes["splice"] == {"status": "not_applicable", "reason": "needs depth, table, start"}
    assert not (out / "overshoot.parquet").exists() and not (out / "splice.parquet").exists()

    accuracy = pd.read_parquet(out / "loop_accuracy.parquet")
    assert set(accuracy["loop"]) == set(range(1, 9)) and set(accuracy["depth"]) == {0}  # 8 loops: min(8, max_loops)
    assert "d = not given" in probes["loop_accuracy"]["headline"]["sentence"]
    lens = pd.read_parquet(out / "logit_lens.parquet")                        # each row's answer, at every loop
    assert set(lens["chain_index"]) == {0} and set(lens["lens"]) == {"coda", "raw", "tuned"}
    assert (lens.groupby(["row_id", "lens"]).size() == 8).all()               # the tuned lens fitted to the last loop
    assert {n["key"] for n in probes["logit_lens"]["headline"]["numbers"]} == {
        "answer_top1_coda", "answer_top1_raw", "answer_top1_tuned"}
    agreement = pd.read_parquet(out / "lens_agreement.parquet")
    assert agreement["label"].isna().all() and agreement["past_depth"].isna().all()   # never a real depth
    dynamics = pd.read_parquet(out / "dynamics__rows.parquet")
    assert (dynamics["t0"] == 1).all() and pd.read_parquet(out / "dynamics.parquet")["past_depth"].isna().all()
    assert set(pd.read_parquet(out / "exit_rules__rows.parquet")["loop"]) == set(range(1, 9))


def test_the_default_batterys_depth_selection_reads_every_row_without_a_depth(capsys, monkeypatch, tmp_path):
    """probes/default.toml selects depths 1-6 x 12 for the logit lens: written for the chase rows. A user's rows
    have no depth, so `probe --rows` reads all 24 of them (it refused with "no rows left" before)."""
    source, manifest = tmp_path / "capitals.jsonl", tmp_path / "capitals_rows.jsonl"
    write_jsonl(source, [capital(i) for i in range(len(CAPITALS))])
    assert invoke(capsys, monkeypatch, "rows", "--from", source, "--out", manifest)[0] == 0
    summary = run_battery(checkpoint=UNTRAINED, battery=None, out=tmp_path / "r", rows=str(manifest), progress=False,
                          only=["logit_lens"])
    assert summary["probe_runs"]["logit_lens"]["rows"]["n"] == 24
    assert summary["probe_runs"]["logit_lens"]["rows"]["per_depth"] == 12   # the battery's selection, recorded


def test_battery_rows_selects_on_given_depths_and_keeps_every_row_without_one():
    rows = [{"row_id": f"r{i}", "depth": d} for i, d in enumerate([1, 0, 2, 1, 0, 3, 1, 0])]
    assert [r["row_id"] for r in battery_rows(rows, [1], 2)] == ["r0", "r1", "r3", "r4", "r7"]
    assert [r["row_id"] for r in battery_rows(rows, [5], None)] == ["r1", "r4", "r7"]
    shipped = [r for r in rows if r["depth"]]
    assert battery_rows(shipped, [1, 3], 1) == select_rows(shipped, [1, 3], 1)
    with pytest.raises(WorkbenchError, match="no rows left"):
        battery_rows(shipped, [5], None)
