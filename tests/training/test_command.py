"""`workbench train` as a command: --set overrides, the before/after summary, one-line errors."""

from __future__ import annotations

import typer
from typer.testing import CliRunner

from workbench.commands.train import train
from workbench.errors import WorkbenchError

app = typer.Typer()
app.command()(train)


def test_train_command_runs_a_recipe_with_overrides(write_recipe, tmp_path):
    recipe = write_recipe()
    res = CliRunner().invoke(app, [recipe, "--out", str(tmp_path / "cli"), "--set", "stages.1.steps=1",
                                   "--set", "optim.lr=2e-3"])
    assert res.exit_code == 0, res.output
    assert "steps: 3" in res.output and "held-out active-label accuracy after:" in res.output
    assert "depth 2: t1=" in res.output
    text = (tmp_path / "cli" / "recipe.toml").read_text()
    assert "lr = 0.002" in text and "steps = 1" in text  # the resolved recipe keeps the overrides


def test_train_command_reports_an_unknown_key(write_recipe, tmp_path):
    res = CliRunner().invoke(app, [write_recipe(), "--out", str(tmp_path / "x"), "--set", "optim.lrate=1"])
    assert isinstance(res.exception, WorkbenchError)
    assert "unknown recipe key 'optim.lrate'" in str(res.exception)
    assert not (tmp_path / "x").exists()  # refused before anything is written
