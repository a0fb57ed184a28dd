"""Shared fixtures: tiny random models built from configs (nothing downloads), the tiny runs trained once per
session, and the tiers (docs/testing.md): a tier mark implies `slow`, and a fast test may not start an interpreter."""

import hashlib
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from hypothesis import settings

from workbench.models import load_base

pytest_plugins = ["tests.durations"]   # --durations-log: `make test` writes test-durations.log

# hypothesis's default deadline (200 ms an example) is a wall-clock assertion: a loaded machine fails it
settings.register_profile("workbench", deadline=None)
settings.load_profile("workbench")

TINY = ("tiny-llama", "tiny-qwen2", "tiny-qwen3")
PROMPTS = [
    "The capital of France is",
    "A -> C\nB -> A\nC -> D\nD -> B\nStart at A. Apply the table 2 times.\nAnswer:",
    "Hello there, how are you doing today, my good friend?",
]


@pytest.fixture
def tiny():
    """A fresh tiny-llama and its tokenizer (fresh: LoRA tests edit the base in place)."""
    return load_base("tiny-llama")


@pytest.fixture
def batch(tiny):
    """A left-padded batch of three prompts of different lengths."""
    _, tok = tiny
    return tok(PROMPTS, return_tensors="pt", padding=True)


def perturb(module: torch.nn.Module, scale: float = 0.05, seed: int = 0) -> None:
    """Moves every parameter of `module` off its init so later loops differ from loop 1."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))


# --- the tiers (docs/testing.md) ---------------------------------------------------------------------------

TIERS = ("specimen", "notebook", "browser", "multiprocess")


def pytest_collection_modifyitems(items):
    """A test in a tier is slow: `make check` (-m "not slow") leaves every tier out without naming them."""
    for item in items:
        if any(item.get_closest_marker(tier) for tier in TIERS) and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)


def starts_an_interpreter(args) -> bool:
    """True when a command line `args` (as Popen takes it) starts Python or the `workbench` entry point."""
    if isinstance(args, (str, bytes, os.PathLike)):  # one program, or a shell line
        first = os.fsdecode(args).split()[0]
    else:
        first = os.fsdecode(list(args)[0])
    name = Path(first).name
    return first == sys.executable or name.startswith("python") or name in ("workbench", "accelerate", "torchrun")


FAST_TEST = {"running": False}  # set per test by the fixture below: whether the test running now is in the fast tier
STRAY: list[str] = []   # fresh interpreters started on threads other than the main one, failed at the test's teardown
_thread_start = threading.Thread.start


def _start_naming_the_test(self, *args, **kwargs):
    """Thread.start that labels the thread with the test that started it (a thread started by a labelled thread
    keeps its label): a thread may start a process long after its test ended, and the guard names the starter."""
    self.started_by = getattr(threading.current_thread(), "started_by", None) or os.environ.get(
        "PYTEST_CURRENT_TEST", "outside any test").removesuffix(" (setup)").removesuffix(" (call)")
    return _thread_start(self, *args, **kwargs)


threading.Thread.start = _start_naming_the_test


class FastTierPopen(subprocess.Popen):
    """Popen for the fast tier: a fresh interpreter costs seconds (torch's import alone), so it fails the test.

    It asks whether the test running *now* is fast, not the test it was installed for: a module imported during a
    fast test keeps this class (jupyter_client's launcher does `from subprocess import Popen`), and a slow test
    later in the session must still start its kernel. On a thread of its own (kaleido's server starts Chromium
    there) the failure would be that thread's alone, which pytest reports only as a warning: it is kept, and the
    test running then fails at teardown, naming the test that started the thread."""

    def __init__(self, args, *rest, **kwargs):
        if FAST_TEST["running"] and starts_an_interpreter(args):
            thread = threading.current_thread()
            starter = "" if thread is threading.main_thread() else \
                f" on thread {thread.name!r}, started by {getattr(thread, 'started_by', 'an unknown test')}"
            message = (f"a test outside the slow tier started a fresh interpreter ({args!r}){starter}: mark it slow "
                       "(docs/testing.md) or run the code in this process")
            if starter:
                STRAY.append(message)
            pytest.fail(message, pytrace=False)
        super().__init__(args, *rest, **kwargs)


@pytest.fixture(autouse=True)
def _fast_tests_start_no_interpreter(request, monkeypatch):
    fast = request.node.get_closest_marker("slow") is None
    monkeypatch.setitem(FAST_TEST, "running", fast)
    if fast:
        monkeypatch.setattr(subprocess, "Popen", FastTierPopen)
    yield
    if STRAY:
        stray = STRAY.copy()
        STRAY.clear()
        pytest.fail(stray[0], pytrace=False)


# --- tiny runs, trained once per session ---------------------------------------------------------------------

def tree_digest(root: Path) -> str:
    """SHA-256 over every file under `root`: relative names and bytes, in sorted order."""
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


SHARED_RUNS = ("tiny_run", "finished_run")


@pytest.fixture(autouse=True)
def _shared_runs_unchanged(request):
    """Fails a test by name when it changed a run the session shares (or the recipe beside it): copy it first."""
    roots = [request.getfixturevalue(name).parent for name in SHARED_RUNS if name in request.fixturenames]
    before = [tree_digest(root) for root in roots]
    yield
    changed = [str(root) for root, digest in zip(roots, before) if tree_digest(root) != digest]
    if changed:
        pytest.fail(f"{request.node.nodeid} wrote into the session's shared {', '.join(changed)}: copy it first "
                    "(tests/test_cli_errors.copy_run)", pytrace=False)


def train_tiny(root: Path, recipe: dict) -> Path:
    """Trains the tiny recipe `recipe` under `root` (recipe.toml beside run/) and returns the run directory."""
    import tomli_w

    from workbench.train.trainer import train

    (root / "recipe.toml").write_text(tomli_w.dumps(recipe))
    train(root / "recipe.toml", out=root / "run", progress=False)
    return root / "run"


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """A finished 2-step tiny-llama run (block 2:4, max_loops 6; depth 1, then depths 1-2), trained once per
    session: read it, or copy it to change it."""
    from tests.training.conftest import TINY_RECIPE, merge

    recipe = merge(TINY_RECIPE, {"model": {"max_loops": 6}, "eval": {"per_depth": 2},
                                 "stages": [{"name": "a", "depths": [1], "steps": 1},
                                            {"name": "b", "depths": [1, 2], "steps": 1}]})
    return train_tiny(tmp_path_factory.mktemp("tiny_run"), recipe)


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory):
    """A finished 6-step tiny run (depth 1 then depths 1-2, checkpoints every 2 steps), trained once per session;
    its recipe is `finished_run.parent / "recipe.toml"`."""
    from tests.training.conftest import TINY_RECIPE

    return train_tiny(tmp_path_factory.mktemp("finished"), TINY_RECIPE)


@pytest.fixture(scope="session")
def tiny_manifest(tmp_path_factory):
    """Chase rows at depths 1-2, two per depth, alphabet 4, on the tiny models' tokenizer."""
    from workbench.models import load_tokenizer
    from workbench.tasks import build_rows
    from workbench.tasks.manifest import write_manifest

    path = tmp_path_factory.mktemp("tiny_rows") / "rows.jsonl"
    write_manifest(build_rows("chase", [1, 2], 2, 5, alphabet=4, tokenizer=load_tokenizer("tiny-llama")), path)
    return path
