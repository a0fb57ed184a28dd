"""`--durations-log=PATH`: every test's time (set-up, call and tear-down together), slowest first, under a header
that names the CPU (its model, the vector kernels torch picked and its bf16 units: two "AMD EPYC" machines of this
project differed 2x, AVX2 against AVX-512), the torch threads, the pytest-xdist workers and the load average at the
start and the end (a loaded machine's timings are not a quiet one's). `make test` writes test-durations.log;
docs/testing.md reads its table from one. Under xdist only the controller writes it: every worker's reports reach
it, and a worker writing the same path would replace the whole table with its half."""

from __future__ import annotations

import os
import platform
import time
from collections import defaultdict
from pathlib import Path

import pytest


def pytest_addoption(parser):
    parser.addoption("--durations-log", metavar="PATH", default=None,
                     help="write every test's duration, slowest first, with the machine and its load, to PATH")


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else what `platform` knows."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def load() -> str:
    return "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg()) if hasattr(os, "getloadavg") else "unknown"


class DurationsLog:
    """Adds up each test's phases as pytest reports them, and writes the table when the session ends."""

    def __init__(self, path: Path):
        self.path = path
        self.seconds: dict[str, float] = defaultdict(float)
        self.outcome: dict[str, str] = {}
        self.workers: set[str] = set()  # xdist's worker ids ("gw0", ...) the reports came from; none in one process
        self.started = time.time()
        self.load_at_start = load()

    def pytest_runtest_logreport(self, report):
        self.seconds[report.nodeid] += report.duration
        node = getattr(report, "node", None)  # xdist: the worker that ran it
        if node is not None:
            self.workers.add(node.gateway.id)
        if report.when == "call" or report.outcome != "passed":
            self.outcome[report.nodeid] = report.outcome

    def pytest_sessionfinish(self, session, exitstatus):
        import torch

        rows = sorted(self.seconds.items(), key=lambda kv: -kv[1])
        workers = f"{len(self.workers)} xdist workers" if self.workers else "one process"
        from workbench.precision import detect_hardware

        units = ", ".join(detect_hardware("cpu").bf16_units) or "none"
        header = [f"cpu: {cpu_name()} ({os.cpu_count()} cores; torch kernels {torch.backends.cpu.get_cpu_capability()}, "
                  f"bf16 units: {units}); {workers}; torch threads {torch.get_num_threads()} "
                  f"a process; OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}",
                  f"load average at start {self.load_at_start}, at end {load()}",
                  f"{len(rows)} tests, {sum(self.seconds.values()):.1f} s in tests (all workers' together), "
                  f"{time.time() - self.started:.1f} s wall; exit status {int(exitstatus)}",
                  "", f"{'seconds':>9}  outcome  test"]
        lines = [f"{s:9.2f}  {self.outcome.get(node, 'passed'):<7}  {node}" for node, s in rows]
        self.path.write_text("\n".join(header + lines) + "\n")


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    path = config.getoption("--durations-log")
    if path and not hasattr(config, "workerinput"):  # an xdist worker has `workerinput`: the controller writes
        config.pluginmanager.register(DurationsLog(Path(path)), "durations-log")
