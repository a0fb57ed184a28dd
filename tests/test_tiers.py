"""The test tiers are what docs/testing.md says: the marks pyproject registers are its table's rows, in order, and
each tier is in use and implies `slow`, so `make check` (-m "not slow") leaves every tier out."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import tomllib

from tests import conftest

ROOT = Path(__file__).resolve().parents[1]


def registered() -> list[str]:
    """The marker names pyproject.toml registers for pytest, in order."""
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert "--strict-markers" in options["addopts"]  # a misspelled tier would otherwise be a new, empty one
    return [m.split(":")[0] for m in options["markers"]]


def documented() -> list[str]:
    """The marks in docs/testing.md's tier table (its rows that open with a backquoted name)."""
    text = (ROOT / "docs" / "testing.md").read_text()
    table = text[text.index("| mark |"):]
    table = table[:table.index("\n\n")]
    return re.findall(r"^\| `(\w+)` \|", table, re.M)


def test_the_registered_marks_are_the_documented_tiers():
    assert registered() == documented() == ["slow", *conftest.TIERS]


def test_make_check_leaves_the_slow_tier_out_and_make_test_logs_durations():
    makefile = (ROOT / "Makefile").read_text()
    check = makefile[makefile.index("\ncheck:"):makefile.index("\ntest:")]
    test = makefile[makefile.index("\ntest:"):makefile.index("\nclean:")]
    assert '-m "not slow"' in check
    assert '-m "' not in test and "--durations-log=test-durations.log" in test


@pytest.mark.parametrize("workers, pytest_line", [
    (None, "OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 .venv/bin/python -m pytest -n 2 --dist loadfile -q "),
    ("3", "OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 .venv/bin/python -m pytest -n 3 --dist loadfile -q "),
    ("0", ".venv/bin/python -m pytest -q ")])
def test_make_runs_xdist_workers_of_one_torch_thread_or_with_none_one_process(workers, pytest_line):
    """PYTEST_WORKERS is the one switch between two workers (the default) and the serial suite: what `make -n` would
    run for `check` and `test`."""
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_WORKERS"}
    args = ["make", "-n", "-C", str(ROOT), "check", "test", *([f"PYTEST_WORKERS={workers}"] if workers else [])]
    res = subprocess.run(args, capture_output=True, text=True, env=env)
    lines = [line for line in res.stdout.splitlines() if " -m pytest " in line]
    assert len(lines) == 2 and all(line.startswith(pytest_line) for line in lines), res.stdout


@pytest.mark.parametrize("tier", conftest.TIERS)
def test_each_tier_marks_some_test(tier):
    used = [p for p in (ROOT / "tests").rglob("test_*.py") if f"pytest.mark.{tier}" in p.read_text()]
    assert used, f"no test is marked {tier}: drop the tier or mark the tests that need it"


class Item:
    """The part of a pytest item that the tier hook reads and writes."""

    def __init__(self, *marks: str):
        self.marks = list(marks)

    def get_closest_marker(self, name):
        return name if name in self.marks else None

    def add_marker(self, mark):
        self.marks.append(mark.name)


def test_a_tier_mark_implies_slow_and_a_fast_test_stays_fast():
    items = [Item(tier) for tier in conftest.TIERS] + [Item("slow", "browser"), Item(), Item("parametrize")]
    conftest.pytest_collection_modifyitems(items)
    assert [i.marks for i in items] == [[t, "slow"] for t in conftest.TIERS] + [["slow", "browser"], [],
                                                                               ["parametrize"]]


@pytest.mark.parametrize("args, starts", [
    (["/usr/bin/python3", "-c", "pass"], True), ("python -m workbench --help", True),
    ([Path("/venv/bin/workbench"), "probe"], True), (["accelerate", "launch", "x.py"], True),
    (Path("/usr/bin/python3.12"), True), (b"python", True),
    (["git", "describe"], False), (["sh", "-c", "echo $$"], False), ("chromium --headless", False)])
def test_the_fast_tier_knows_an_interpreter_when_it_starts_one(args, starts):
    assert conftest.starts_an_interpreter(args) is starts


def test_no_example_of_a_property_test_has_a_deadline():
    """Hypothesis times each example (200 ms by default): under load that is a wall-clock assertion."""
    from hypothesis import settings

    assert settings.default.deadline is None and settings().deadline is None


def test_the_durations_log_lists_every_test_slowest_first_with_the_machine(tmp_path):
    from types import SimpleNamespace

    from tests.durations import DurationsLog

    log = DurationsLog(tmp_path / "durations.log")
    for node, when, seconds, outcome in [("a", "setup", 0.5, "passed"), ("a", "call", 1.0, "passed"),
                                         ("b", "call", 3.0, "failed"), ("a", "teardown", 0.25, "passed")]:
        log.pytest_runtest_logreport(SimpleNamespace(nodeid=node, when=when, duration=seconds, outcome=outcome))
    log.pytest_sessionfinish(None, 1)
    head, _, table = (tmp_path / "durations.log").read_text().partition("\n\n")
    assert head.startswith("cpu: ") and "load average at start" in head and "2 tests, 4.8 s in tests" in head
    assert "; one process;" in head
    import torch

    from workbench.precision import detect_hardware

    units = ", ".join(detect_hardware("cpu").bf16_units) or "none"   # what makes two machines' logs comparable
    assert f"torch kernels {torch.backends.cpu.get_cpu_capability()}, bf16 units: {units})" in head
    assert table.splitlines()[1:] == ["     3.00  failed   b", "     1.75  passed   a"]


def test_under_xdist_only_the_controller_writes_the_durations_log_and_it_names_the_workers(tmp_path):
    """`make test` runs two xdist workers, and each loads the plugin: a worker writing the log would replace the whole
    table with its half. The controller receives every worker's reports, so it alone writes, naming the workers."""
    from types import SimpleNamespace

    from tests import durations

    def config(**worker):
        plugins = SimpleNamespace(registered=[])
        plugins.register = lambda plugin, name: plugins.registered.append(name)
        return SimpleNamespace(getoption=lambda name: str(tmp_path / "durations.log"), pluginmanager=plugins, **worker)

    controller, worker = config(), config(workerinput={"workerid": "gw0"})
    durations.pytest_configure(controller)
    durations.pytest_configure(worker)
    assert controller.pluginmanager.registered == ["durations-log"] and worker.pluginmanager.registered == []

    log = durations.DurationsLog(tmp_path / "durations.log")
    for node, worker_id in [("a", "gw0"), ("b", "gw1"), ("c", "gw0")]:
        ran_on = SimpleNamespace(gateway=SimpleNamespace(id=worker_id))  # what xdist attaches to a worker's report
        log.pytest_runtest_logreport(SimpleNamespace(nodeid=node, when="call", duration=1.0, outcome="passed",
                                                     node=ran_on))
    log.pytest_sessionfinish(None, 0)
    head, _, table = (tmp_path / "durations.log").read_text().partition("\n\n")
    assert "; 2 xdist workers;" in head and "3 tests, 3.0 s in tests" in head and len(table.splitlines()) == 4


def test_a_popen_kept_from_a_fast_test_asks_about_the_test_running_now(monkeypatch):
    """jupyter_client binds `Popen` at import: imported during a fast test, it keeps the guard, and the notebook tests
    (slow) later in the session must still start their kernels; a fast test is still refused."""
    monkeypatch.setitem(conftest.FAST_TEST, "running", False)
    kept = conftest.FastTierPopen([sys.executable, "-c", "pass"])
    assert kept.wait() == 0
    monkeypatch.setitem(conftest.FAST_TEST, "running", True)
    with pytest.raises(pytest.fail.Exception, match="started a fresh interpreter"):
        conftest.FastTierPopen([sys.executable, "-c", "pass"])


def test_an_interpreter_started_on_another_thread_is_kept_naming_the_test_that_started_the_thread(monkeypatch):
    """kaleido's server starts Chromium on a thread of its own, which can outlive the test that started it: the
    refusal in that thread would reach pytest only as a warning, so it is kept for the teardown of the test running
    then (which fails on it) and names the test that started the thread."""
    monkeypatch.setitem(conftest.FAST_TEST, "running", True)
    raised = []

    def start():
        try:
            conftest.FastTierPopen([sys.executable, "-c", "pass"])
        except pytest.fail.Exception as e:
            raised.append(str(e))

    thread = threading.Thread(target=start, name="server")
    thread.start()
    thread.join()
    try:
        assert raised and conftest.STRAY == raised
        assert f"on thread 'server', started by {__name__.replace('.', '/')}.py::" in raised[0]
        assert "test_an_interpreter_started_on_another_thread" in raised[0]
    finally:
        conftest.STRAY.clear()   # kept, this test's own teardown would fail on it, as any other test's does
