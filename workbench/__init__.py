"""workbench: looped retrofits of pretrained LMs, and the probes that look inside every loop.

The public API (`import workbench as wb`; docs/api.md lists every name with its signature):

    base, tok = wb.load_base("smollm2-135m-instruct")        # an HF directory, a .gguf, a tiny config
    looped = wb.retrofit(base, wb.RetrofitConfig(wb.Block(10, 16), reentry="bridge"))
    looped, tok, info = wb.load_run("smollm2-chase")         # a trained run or a shipped keeper
    read = wb.read_rows(looped, tok, rows, loops=4)          # every loop's symbol scores, one forward
    wb.hook_name("state", 2)                                 # "loop.2.hook_state"

Importing `workbench` is cheap and silent: each name is imported from its module on first use
(PEP 562), so `import workbench` loads neither torch nor transformers until a name that needs
them is touched. The modules themselves (`workbench.loop`, `workbench.probes`, ...) stay
importable for everything the surface leaves out.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> the module that defines it ("module:name" where the name differs; tests/test_api.py keeps it)
_EXPORTS: dict[str, str] = {
    # base models and the retrofit
    "load_base": "workbench.models",
    "load_looped": "workbench.models",  # native looped models (Inkling2Loop, HRM-Text)
    "Block": "workbench.loop.config",
    "RetrofitConfig": "workbench.loop.config",
    "LoraSettings": "workbench.loop.config",
    "retrofit": "workbench.loop.surgery",
    "attach_lora": "workbench.loop.surgery",
    "parameter_report": "workbench.loop.surgery",
    "LoopedLM": "workbench.loop.looped",
    "HaltPolicy": "workbench.loop.halting",
    # hooks
    "hook_name": "workbench.loop.hooks",
    "loop_hook_names": "workbench.loop.hooks",
    "stack_loops": "workbench.loop.hooks",
    # rows and reading them
    "build_rows": "workbench.tasks",
    "read_manifest": "workbench.tasks.manifest",
    "write_manifest": "workbench.tasks.manifest",
    "read_user_rows": "workbench.tasks.user",  # a user's own rows (`workbench rows --from`), checked
    "read_rows": "workbench.tasks.reader",
    "read_answers": "workbench.tasks.reader",
    # runs: training one, loading one
    "train_recipe": "workbench.api",  # `workbench.train` is the training package
    "load_run": "workbench.runs",
    "resolve_run": "workbench.runs",
    # checks and probes
    "identity_report": "workbench.loop.identity",
    "select_block": "workbench.selection.stage1",
    "probe": "workbench.api",
    "lens": "workbench.lenses",  # a per-loop lens on any prompt
    "generate": "workbench.generation",  # the continuation under every loop count
    "probe_names": "workbench.api",
    "load_battery": "workbench.probes.battery",
    "run_battery": "workbench.probes.battery",
    "load_results": "workbench.analysis.results",
    "read_summary": "workbench.analysis.results",
    "build_ledger": "workbench.analysis.claims",
    "WorkbenchError": "workbench.errors",
}

__all__ = [
    "Block",
    "HaltPolicy",
    "LoopedLM",
    "LoraSettings",
    "RetrofitConfig",
    "WorkbenchError",
    "attach_lora",
    "build_ledger",
    "build_rows",
    "generate",
    "hook_name",
    "identity_report",
    "lens",
    "load_base",
    "load_battery",
    "load_looped",
    "load_results",
    "load_run",
    "loop_hook_names",
    "parameter_report",
    "probe",
    "probe_names",
    "read_answers",
    "read_manifest",
    "read_rows",
    "read_summary",
    "read_user_rows",
    "resolve_run",
    "retrofit",
    "run_battery",
    "select_block",
    "stack_loops",
    "train_recipe",
    "write_manifest",
]


def __getattr__(name: str) -> Any:
    """Imports a public name from its module the first time it is asked for (PEP 562)."""
    where = _EXPORTS.get(name)
    if where is None:
        raise AttributeError(f"module 'workbench' has no attribute '{name}'")
    module, _, attr = where.partition(":")
    value = getattr(importlib.import_module(module), attr or name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


if TYPE_CHECKING:  # what type checkers and IDEs see; at run time the names load lazily
    from workbench.analysis.claims import build_ledger
    from workbench.analysis.results import load_results, read_summary
    from workbench.api import probe, probe_names, train_recipe
    from workbench.errors import WorkbenchError
    from workbench.generation import generate
    from workbench.loop.config import Block, LoraSettings, RetrofitConfig
    from workbench.loop.halting import HaltPolicy
    from workbench.loop.hooks import hook_name, loop_hook_names, stack_loops
    from workbench.loop.identity import identity_report
    from workbench.loop.looped import LoopedLM
    from workbench.loop.surgery import attach_lora, parameter_report, retrofit
    from workbench.models import load_base, load_looped
    from workbench.probes.battery import load_battery, run_battery
    from workbench.runs import load_run, resolve_run
    from workbench.selection.stage1 import select_block
    from workbench.tasks import build_rows
    from workbench.tasks.manifest import read_manifest, write_manifest
    from workbench.tasks.reader import read_answers, read_rows
    from workbench.tasks.user import read_user_rows
