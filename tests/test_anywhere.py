"""The CLI run from a directory outside the repository: every default resolves from the package.

Each command runs with the working directory a fresh temporary folder that holds none of the
repository's files, naming the shipped files by name.
"""

import json
from pathlib import Path

import pytest

from tests.test_cli_errors import invoke
from workbench import defaults
from workbench.errors import WorkbenchError

ROOT = Path(__file__).resolve().parents[1]


# --- name resolution (in process) ---------------------------------------------------------------

def test_every_shipped_default_is_found_by_name():
    assert {"default", "demo"} <= set(defaults.shipped("battery"))
    assert "smollm2_lora_chase" in defaults.shipped("recipe") and "paper" in defaults.shipped("figure spec")
    assert "chase_n8_d1-7" in defaults.shipped("manifest")
    assert "smollm2-chase" in defaults.shipped_keepers()
    for kind, name in (("battery", "default"), ("battery", "demo.toml"), ("recipe", "smollm2_lora_chase"),
                       ("figure spec", "paper"), ("manifest", "chase_n8_d1-7")):
        path = defaults.resolve(kind, name)
        assert path.is_file() and path.is_relative_to(defaults.DATA), (kind, name, path)
    keeper = defaults.resolve_run("smollm2-chase")
    assert (keeper / "trainable.safetensors").is_file() and keeper.is_relative_to(defaults.DATA)


def test_a_users_own_file_wins_over_a_shipped_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "default.toml").write_text("[battery]\n")
    assert defaults.resolve("battery", "default.toml") == Path("default.toml")
    assert defaults.resolve("battery", "default") == defaults.DATA / "probes" / "default.toml"
    (tmp_path / "smollm2-chase").mkdir()
    assert defaults.resolve_run("smollm2-chase") == Path("smollm2-chase")


@pytest.mark.parametrize("kind,given,fragment", [
    ("battery", "nope", "battery 'nope' does not exist; give a battery TOML file or a shipped name: "),
    ("recipe", "training/none.toml", "recipe 'training/none.toml' does not exist"),
    ("figure spec", ".", "figure spec '.' is a directory, not a file"),
])
def test_an_unknown_name_lists_the_shipped_ones(kind, given, fragment):
    with pytest.raises(WorkbenchError) as exc:
        defaults.resolve(kind, given)
    assert fragment in str(exc.value) and "\n" not in str(exc.value)


# --- the CLI from a directory outside the repository ------------------------------------------
# In process through the console entry point (tests/test_cli_errors.py's `invoke`), with the working
# directory a fresh temporary folder; test_cli.py and test_signals.py run real subprocesses.

@pytest.fixture
def elsewhere(tmp_path, monkeypatch):
    """An empty working directory outside the repository."""
    assert not tmp_path.is_relative_to(ROOT)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_rows_from_elsewhere(capsys, monkeypatch, elsewhere):
    code, _, err = invoke(capsys, monkeypatch, "rows", "--task", "chase", "--alphabet", "8", "--depths", "1-2",
                          "--per-depth", "2", "--seed", "1", "--model", "tiny-llama", "--out", "r.jsonl")
    assert code == 0, err
    assert (elsewhere / "r.jsonl").is_file() and (elsewhere / "r.manifest.json").is_file()


def test_train_probe_report_figures_from_elsewhere(capsys, monkeypatch, elsewhere):
    """`workbench train smollm2_lora_chase` (the shipped recipe by name, shrunk onto tiny-llama: 3 steps),
    then the default battery's depth matrix on it, its report and its figures."""
    shrink = ["model.base=tiny-llama", "model.block=2:4", "stages.0.steps=1", "stages.1.steps=1", "stages.2.steps=1",
              "eval.per_depth=2", "guardrail.enabled=false", "preserve.kl_weight=0"]
    code, _, err = invoke(capsys, monkeypatch, "train", "smollm2_lora_chase", "--out", "run",
                          *[a for s in shrink for a in ("--set", s)])
    assert code == 0, err[-2000:]
    assert json.loads((elsewhere / "run" / "provenance.json").read_text())["status"] == "finished"
    code, _, err = invoke(capsys, monkeypatch, "probe", "--checkpoint", "run", "--only", "depth_matrix", "--out", "res")
    assert code == 0, err[-2000:]
    summary = json.loads((elsewhere / "res" / "summary.json").read_text())
    assert summary["battery"] == str(defaults.DATA / "probes" / "default.toml")
    assert summary["probe_runs"]["depth_matrix"]["rows"]["n"] == 7 * 32  # the default battery's rows
    code, _, err = invoke(capsys, monkeypatch, "report", "res", "--out", "report.html")
    assert code == 0, err[-2000:]
    assert (elsewhere / "report.html").stat().st_size > 10_000
    code, _, err = invoke(capsys, monkeypatch, "figures", "--format", "html", "--out", "figs")
    assert code == 2 and "no directory under ./results" in err  # ./results is the user's own, and there is none
    code, _, err = invoke(capsys, monkeypatch, "figures", "--results", "res", "--format", "html", "--spec", "paper",
                          "--out", "figs")
    assert code == 0, err[-2000:]
    assert list((elsewhere / "figs").rglob("*.html")) and list((elsewhere / "figs").rglob("*.csv"))


@pytest.mark.specimen  # an end-to-end run: the shipped keeper on SmolLM2
def test_probe_names_a_shipped_keeper_and_battery_from_elsewhere(capsys, monkeypatch, elsewhere):
    """One probe, the demo battery's lightest on the keeper (heads: 8 rows, a few seconds; identity would read the
    64-row guardrail on two models), reading the battery's manifest: the names are what is checked."""
    code, _, err = invoke(capsys, monkeypatch, "probe", "--checkpoint", "smollm2-chase", "--battery", "demo",
                          "--only", "heads", "--out", "keeper")
    assert code == 0, err[-2000:]
    summary = json.loads((elsewhere / "keeper" / "summary.json").read_text())
    assert summary["checkpoint"]["path"] == str(defaults.KEEPERS / "smollm2-chase")
    assert summary["battery"] == str(defaults.DATA / "probes" / "demo.toml")
