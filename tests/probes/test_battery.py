"""The battery runner, checkpoints (run directories and untrained controls), and `compare`."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import tomli_w

from tests.executors import PerfectExecutor, ShuffledExecutor
from workbench.analysis.results import compare_results
from workbench.checkpoints import parse_checkpoint
from workbench.errors import WorkbenchError
from workbench.io import sha256_file
from workbench.probes import parse_only
from workbench.probes.battery import load_battery, run_battery
from workbench.tasks import build_rows
from workbench.tasks.manifest import read_manifest, write_manifest
from workbench.tasks.reader import read_rows

UNTRAINED = "untrained:tiny-llama:2:4"


def write_battery(path, manifest, **probes) -> str:
    path.write_text(tomli_w.dumps({"battery": {"manifest": str(manifest), "batch_size": 8}, "probes": probes}))
    return str(path)


@pytest.fixture(scope="module")
def manifests(tmp_path_factory, tok):
    root = tmp_path_factory.mktemp("manifests")
    for seed in (7, 8):
        write_manifest(build_rows("chase", [1, 2, 3], 4, seed, alphabet=4, tokenizer=tok), root / f"rows{seed}.jsonl")
    return root / "rows7.jsonl", root / "rows8.jsonl"


@pytest.fixture(scope="module")
def results(tmp_path_factory, manifests):
    root = tmp_path_factory.mktemp("results")
    battery = write_battery(root / "b.toml", manifests[0], depth_matrix={}, overshoot={"extra": 2}, halting={},
                            splice={"depths": [2, 3], "k0s": [1], "horizon": 1, "sites": ["state"], "spans": ["all"]})
    summary = run_battery(UNTRAINED, battery, root / "out", seed=1, progress=False)
    return root / "out", summary


def test_the_battery_writes_one_table_per_file_and_a_summary(results, manifests):
    out, summary = results
    names = {p.name for p in out.iterdir()}
    assert {"depth_matrix.parquet", "depth_matrix__frontier.parquet", "overshoot.parquet", "overshoot__cost.parquet",
            "splice.parquet", "splice__verdict.parquet", "summary.json"} <= names
    assert "report.html" not in names  # computation never draws: `workbench probe` writes the report
    # no staging left behind; the one hidden file is the output marker that lets --overwrite replace it
    assert "halting.parquet" not in names and [n for n in names if n.startswith(".")] == [".workbench-output"]
    frame = pd.read_parquet(out / "depth_matrix.parquet")
    assert len(frame) == 12 * 3 and not frame.duplicated(["row_id", "loop"]).any()  # (row, loop <= 3)
    saved = json.loads((out / "summary.json").read_text())
    assert saved == json.loads(json.dumps(summary))
    sidecar = read_manifest(manifests[0]).sidecar
    assert saved["manifests"][str(manifests[0])] == {k: sidecar[k] for k in ("rows_sha256", "row_ids_sha256")}
    assert saved["probe_runs"]["depth_matrix"]["rows"]["rows_sha256"] == sidecar["rows_sha256"]
    assert saved["probe_runs"]["splice"]["rows"]["n"] == 8 and saved["probe_runs"]["splice"]["rows"]["depths"] == [2, 3]
    assert saved["probes"]["halting"]["status"] == "not_applicable"
    assert saved["checkpoint"]["kind"] == "untrained" and len(saved["checkpoint"]["provenance_sha256"]) == 64
    assert saved["probes"]["depth_matrix"]["final_total"] == 12 and saved["probes"]["depth_matrix"]["wall_s"] >= 0
    assert saved["model"]["block"] == [2, 4]


def test_a_full_results_directory_is_refused_without_overwrite(results, manifests, tmp_path):
    out, _ = results
    battery = write_battery(tmp_path / "b.toml", manifests[0], depth_matrix={})
    with pytest.raises(WorkbenchError, match="--overwrite"):
        run_battery(UNTRAINED, battery, out, progress=False)


def test_unknown_probes_and_options_are_errors(tmp_path, manifests):
    with pytest.raises(WorkbenchError, match="known probes: identity, depth_matrix"):
        load_battery(write_battery(tmp_path / "a.toml", manifests[0], depth_matrics={}))
    with pytest.raises(WorkbenchError, match="known probes:"):
        parse_only("depth_matrix,splices")
    assert parse_only("depth_matrix, splice") == ["depth_matrix", "splice"]
    battery = write_battery(tmp_path / "b.toml", manifests[0], overshoot={"extras": 2})
    with pytest.raises(WorkbenchError, match="probe 'overshoot' has no option 'extras'; accepted: extra"):
        run_battery(UNTRAINED, battery, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()  # a failed battery leaves nothing behind
    with pytest.raises(WorkbenchError, match="untrained:BASE:A:B"):
        parse_checkpoint("untrained:tiny-llama:2")


def test_rows_and_only_override_the_battery(tmp_path, manifests):
    battery = write_battery(tmp_path / "b.toml", manifests[0], depth_matrix={}, overshoot={})
    summary = run_battery(UNTRAINED, battery, tmp_path / "out", rows=str(manifests[1]), only=["depth_matrix"],
                          progress=False)
    assert list(summary["probes"]) == ["depth_matrix"] and list(summary["manifests"]) == [str(manifests[1])]


def test_a_run_directory_and_its_untrained_control(tiny_run, manifests, tmp_path):
    battery = write_battery(tmp_path / "b.toml", manifests[0], depth_matrix={})
    trained = run_battery(str(tiny_run), battery, tmp_path / "trained", progress=False)
    assert trained["checkpoint"]["kind"] == "run" and trained["checkpoint"]["support"] == 2
    assert trained["checkpoint"]["provenance_sha256"] == sha256_file(tiny_run / "provenance.json")
    assert trained["probes"]["depth_matrix"]["support"] == 2
    control = run_battery(f"untrained:{tiny_run}", battery, tmp_path / "control", progress=False)
    assert control["checkpoint"]["kind"] == "untrained" and control["model"]["settings"]["max_loops"] == 6
    assert control["probes"]["depth_matrix"]["support"] == 3  # no trained support: the rows' max depth
    table = compare_results(tmp_path / "control", tmp_path / "trained")
    assert list(table["depth"].iloc[:-1]) == [1, 2, 3] and table["n"].iloc[-1] == 12
    assert (table["helped"] + table["hurt"] + table["tied"] == table["n"]).all()


def test_compare_refuses_different_manifests(results, manifests, tmp_path):
    battery = write_battery(tmp_path / "b.toml", manifests[1], depth_matrix={})
    run_battery(UNTRAINED, battery, tmp_path / "other", progress=False)
    with pytest.raises(WorkbenchError, match="different manifests"):
        compare_results(results[0], tmp_path / "other")


def test_compare_pairs_two_subsets_of_one_manifest_on_the_rows_both_read(manifests, tmp_path):
    """A demo battery (fewer rows per depth) against the full battery on the same manifest file: the paired
    tests run over the rows both read, and the comparison says how many."""
    run_battery(UNTRAINED, write_battery(tmp_path / "all.toml", manifests[0], depth_matrix={}), tmp_path / "all",
                progress=False)
    run_battery(UNTRAINED, write_battery(tmp_path / "few.toml", manifests[0], depth_matrix={"per_depth": 2}),
                tmp_path / "few", progress=False)
    table = compare_results(tmp_path / "all", tmp_path / "few")
    assert table.attrs["rows"] == {"compared": 6, "a": 12, "b": 6, "manifest": "rows7.jsonl"}
    assert list(table["n"]) == [2, 2, 2, 6] and (table["helped"] + table["hurt"] == 0).all()  # the same model


def fake_results(path, tok, rows, model):
    """A results directory holding only a depth matrix and its summary."""
    path.mkdir()
    result = read_rows(model, tok, rows, loops=3)
    result.frame().to_parquet(path / "depth_matrix.parquet")
    (path / "summary.json").write_text(json.dumps(
        {"probe_runs": {"depth_matrix": {"rows": {"rows_sha256": result.manifest_sha256}}}}))
    return result


def test_compare_counts_helped_and_hurt(tok, manifests, tmp_path):
    from workbench.commands.compare import compare

    rows = read_manifest(manifests[0]).rows
    perfect = fake_results(tmp_path / "perfect", tok, rows, PerfectExecutor(tok))
    shuffled = fake_results(tmp_path / "shuffled", tok, rows, ShuffledExecutor(PerfectExecutor(tok), seed=2))
    wrong = int((~shuffled.frame().query("loop == depth")["correct"].astype(bool)).sum())
    assert 3 <= wrong <= 12  # chance is 1 in 4
    compare(tmp_path / "shuffled", tmp_path / "perfect", out=tmp_path / "cmp")
    table = pd.read_parquet(tmp_path / "cmp" / "compare.parquet")
    pooled = table.iloc[-1]
    assert pooled["helped"] == wrong and pooled["hurt"] == 0 and pooled["tied"] == 12 - wrong
    saved = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert saved["depths"][-1]["helped"] == wrong and saved["depths"][-1]["depth"] is None
    assert perfect.manifest_sha256 == shuffled.manifest_sha256


def test_a_report_that_fails_keeps_the_finished_tables(tmp_path):
    """The report runs after every probe: its failure (a bug, a missing browser) must not discard the tables the
    battery spent its time on. They are written, summary.json names the failure, and the error says how to retry."""
    def broken(staging):
        raise ImportError("cannot import name 'X'")

    out = tmp_path / "r"
    with pytest.raises(WorkbenchError, match=r"the results are written to .*r, but its report failed \(ImportError: "
                                             r"cannot import name 'X'\); run `workbench report"):
        run_battery("untrained:tiny-llama:2:4", None, out, progress=False, only=["depth_matrix"], finish=broken)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["finish_error"] == "ImportError: cannot import name 'X'"
    assert (out / "depth_matrix.parquet").is_file() and not list(tmp_path.glob(".r.tmp*"))


def test_a_manifest_row_of_no_tokens_or_past_the_context_is_refused_before_any_probe():
    """`check_positions`, the battery's gate on every manifest before a probe runs: a prompt the tokenizer drops whole
    (control characters) and one past the model's positions are each one line naming the manifest and the row."""
    from types import SimpleNamespace

    from workbench.models import load_base
    from workbench.probes.battery import check_positions

    model, tok = load_base("tiny-llama")
    good = {"row_id": "good", "prompt": "The capital of France is", "answer": "A", "symbols": ["A", "B"]}
    check_positions({"rows.jsonl": SimpleNamespace(rows=[good])}, model, tok)
    empty = {**good, "row_id": "dropped", "prompt": "\x06\x06"}
    with pytest.raises(WorkbenchError, match="^manifest 'rows.jsonl' row 'dropped' has a prompt that encodes to no "
                                             "tokens"):
        check_positions({"rows.jsonl": SimpleNamespace(rows=[good, empty])}, model, tok)
    long = {**good, "row_id": "long", "prompt": "word " * (model.config.max_position_embeddings + 1)}
    with pytest.raises(WorkbenchError, match="^manifest 'rows.jsonl' row 'long' is .* tokens, longer than"):
        check_positions({"rows.jsonl": SimpleNamespace(rows=[long])}, model, tok)
