"""`workbench probe` end to end on the embedded default (slow) and its input errors (fast)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tomli_w
from typer.testing import CliRunner

from workbench.cli import app
from workbench.commands.probe import probe
from workbench.errors import WorkbenchError

MANIFEST = Path(__file__).parents[2] / "probes" / "chase_n8_d1-7.jsonl"


def test_unknown_probe_in_only_is_refused_before_any_work(tmp_path):
    with pytest.raises(WorkbenchError, match="known probes: identity, depth_matrix"):
        probe(checkpoint="untrained:tiny-llama:2:4", battery="probes/default.toml", rows=None,
              only="depth_matrix,lens", out=tmp_path / "out", overwrite=False, seed=0)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_probe_and_compare_on_the_embedded_default(tmp_path):
    battery = tmp_path / "small.toml"
    battery.write_text(tomli_w.dumps({
        "battery": {"manifest": str(MANIFEST), "batch_size": 8},
        "probes": {"depth_matrix": {"depths": [1, 2, 3], "per_depth": 4},
                   "overshoot": {"depths": [2], "per_depth": 4, "extra": 2},
                   "splice": {"depths": [3], "per_depth": 4, "k0s": [1], "horizon": 2, "sites": ["state"],
                              "spans": ["read"]},
                   "heads": {"depths": [2], "per_depth": 2}}}))
    runner = CliRunner()
    for name, spec in (("a", "untrained:smollm2-135m-instruct:10:16"), ("b", "untrained:smollm2-135m-instruct:12:24")):
        result = runner.invoke(app, ["probe", "--checkpoint", spec, "--battery", str(battery),
                                     "--out", str(tmp_path / name)])
        assert result.exit_code == 0, result.output
        assert "depth_matrix" in result.output and "results:" in result.output
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["model"]["n_layers"] == 30 and summary["model"]["block"] == [10, 16]
    assert (tmp_path / "a" / "report.html").stat().st_size > 100_000
    assert summary["probes"]["depth_matrix"]["final_total"] == 12
    result = runner.invoke(app, ["compare", str(tmp_path / "a"), str(tmp_path / "b")])
    assert result.exit_code == 0, result.output
    assert "McNemar" in result.output and (tmp_path / "b" / "compare.json").is_file()


def test_probe_prints_headline_tables_within_100_columns_and_json_on_request(tmp_path):
    """`workbench probe` and `workbench compare` on a tiny retrofit: rich tables, never truncated JSON; --json."""
    from workbench.analysis.headlines import headlines_from_summary
    from workbench.probes import PROBES

    battery = tmp_path / "tiny.toml"
    battery.write_text(tomli_w.dumps({
        "battery": {"manifest": str(MANIFEST), "batch_size": 8},
        "probes": {"identity": {"loops": 1, "n_rows": 1, "lora": False},
                   "depth_matrix": {"depths": [1, 2, 3], "per_depth": 4},
                   "overshoot": {"depths": [2], "per_depth": 4, "extra": 2}}}))
    runner = CliRunner()
    args = ["probe", "--checkpoint", "untrained:tiny-llama:2:4", "--battery", str(battery)]
    res = runner.invoke(app, [*args, "--out", str(tmp_path / "a")])
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert max(len(line) for line in lines) <= 100 and "{" not in res.stdout
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    heads = headlines_from_summary(summary, PROBES)
    assert list(heads) == ["identity", "depth_matrix", "overshoot"]
    flat = " ".join(res.stdout.split())
    for head in heads.values():
        assert " ".join(head.sentence.split()) in flat
        for n in head.numbers:
            assert n.text() in res.stdout
    assert heads["identity"]["vs_base"].label == "loop 1 vs base (no adapter)" and heads["identity"]["vs_base"].value == 0
    res = runner.invoke(app, [*args, "--out", str(tmp_path / "b"), "--json"])
    assert res.exit_code == 0, res.output
    printed = json.loads(res.stdout)
    assert printed["probes"]["depth_matrix"]["headline"] == summary["probes"]["depth_matrix"]["headline"]
    res = runner.invoke(app, ["compare", str(tmp_path / "a"), str(tmp_path / "b")])
    assert res.exit_code == 0, res.output
    assert max(len(line) for line in res.stdout.splitlines()) <= 100 and "B − A [95% CI]" in res.stdout
    res = runner.invoke(app, ["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--json"])
    same = {r["key"]: r for r in json.loads(res.stdout)["headlines"]}
    assert same["final_d1"]["diff_value"] == 0.0 and same["final_d1"]["p_mcnemar"] == 1.0  # one model, same rows
