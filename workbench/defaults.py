"""The defaults the workbench ships with: names shared across the package, and files found from the package.

Nothing here pulls in the model stack (the CLI reads it at start-up). EMBEDDED_DEFAULT is the base
model shipped with the project (`workbench.models` loads it); the commands' --model defaults, the
recipe schema and the error messages that give an example name all read it from here.

`workbench/data/` mirrors the repository's layout: `probes/` (probe batteries and the frozen
row manifests they name), `training/` (recipes, and `training/keepers/` with the shipped
keepers and their committed battery results) and `figures/` (figure specs). In a checkout these
three are links to the repository's folders; a wheel holds copies. Paths inside them stay
relative to each other (a battery names its manifest beside it, the anneal recipe its parent
keeper), so they resolve the same way in both.

Every command that takes one of these files accepts a path to the user's own file or a short
name of a shipped one: `--battery default`, `workbench train smollm2_lora_chase`,
`--spec paper`, `--rows chase_n8_d1-7`, `--checkpoint smollm2-chase`.
"""

from __future__ import annotations

import os
from pathlib import Path

from workbench.errors import WorkbenchError

EMBEDDED_DEFAULT = "smollm2-135m-instruct"
DATA = Path(__file__).parent / "data"
KEEPERS = DATA / "training" / "keepers"

# kind -> (folder under DATA, suffix, what the user may give instead)
KINDS = {
    "battery": ("probes", ".toml", "a battery TOML file"),
    "manifest": ("probes", ".jsonl", "a row manifest (.jsonl)"),
    "recipe": ("training", ".toml", "a recipe TOML file"),
    "figure spec": ("figures", ".toml", "a figure spec TOML file"),
}
DEFAULT_BATTERY = "default"
DEMO_BATTERY = "demo"
DEFAULT_RECIPE = "smollm2_lora_chase"
DEFAULT_KEEPER = "smollm2-chase"

# Defaults a torch-free layer (the training recipe's schema, `workbench.train.recipe`) shares with the module that
# uses them, which imports torch: each is stated here once, and both read it from here.
MAX_DROP_POINTS = 3.0   # the guardrail's hard stop: percentage points below the base (`workbench.tasks.guardrail`)
ORACLE_MARGIN = 0.01    # the halting oracle's delta and per-loop cost (`workbench.loop.halting.oracle_labels`)
ORACLE_DEPTH_COST = 0.0
REHEARSAL_SOURCES = ("corpus", "patterns", "numbers")   # the rehearsal texts' sources (`workbench.tasks.rehearsal`)
# The names the recipe schema accepts for what the task generators (which import torch) define: each generator
# reads its names from here, so a name added there is a recipe value at once.
TASK_NAMES = ("chase", "phop", "state", "state_query", "arith")     # `workbench.tasks.build_rows`
CHASE_SURFACES = ("symbolic", "relay", "pointer")                  # `workbench.tasks.chase.TEMPLATES`
SYMBOL_SET_NAMES = ("letters", "names")                            # `workbench.tasks.chase.SYMBOL_SETS`
INSTALL_BAR = 0.71      # the installation bar: a depth is installed at this final-loop accuracy (the frontier's bar)
# The window sweep's table (`select-block --window-sweep`): `workbench.selection.window_sweep` writes it, the report,
# the demo and the ledger read it; a sweep made before the window sweep had its name holds it as OLD_SWEEP_TABLE.
SWEEP_TABLE = "window_sweep.json"
OLD_SWEEP_TABLE = "stage2.json"

# The one order of the probes: `workbench.probes.PROBES` lists them in it, the headlines are printed in it and the
# report's sections and `workbench figures` follow it. Each side finds its modules by name (the probe's compute in
# `workbench.probes`, its headline in `workbench.analysis.headlines`, its section and figures in `workbench.plots`);
# a probe not named here follows these, by name (`probe_order`).
PROBE_ORDER = ("identity", "depth_matrix", "loop_accuracy", "overshoot", "logit_lens", "splice", "patching",
               "attribution", "paths", "heads", "linear_probe", "drift", "halting", "lens_agreement", "dynamics",
               "exit_rules", "gradient_audit", "latency")


def probe_order(names) -> list[str]:
    """`names` (probe names) in `PROBE_ORDER`, then those it does not name, sorted."""
    names = set(names)
    return [n for n in PROBE_ORDER if n in names] + sorted(names - set(PROBE_ORDER))


def shipped(kind: str) -> list[str]:
    """The names of the shipped files of `kind` (a key of KINDS), sorted; one folder deep (`support/...`)."""
    folder, suffix, _ = KINDS[kind]
    root = DATA / folder
    files = [*root.glob(f"*{suffix}"), *root.glob(f"*/*{suffix}")]  # keepers' own recipe.toml lie deeper
    return sorted(p.relative_to(root).as_posix().removesuffix(suffix) for p in files)


def shipped_keepers() -> list[str]:
    """The names of the shipped keepers (finished run directories under training/keepers/)."""
    return sorted(p.name for p in KEEPERS.iterdir() if (p / "retrofit.json").is_file()) if KEEPERS.is_dir() else []


def resolve(kind: str, given: str | os.PathLike) -> Path:
    """Returns the file `given` names: an existing file, else the shipped file of that name.

    A name is the file's path under its shipped folder without the suffix (`default`,
    `support/smollm2_chase_s2`) or with it (`default.toml`); a path that exists
    always wins over a shipped name, so a user's own `default.toml` is never shadowed.

    Raises:
        WorkbenchError: `given` is neither an existing file nor a shipped name (the message lists them).
    """
    folder, suffix, what = KINDS[kind]
    text = os.fspath(given)
    path = Path(text).expanduser()
    if path.is_file():
        return path
    name = text.removesuffix(suffix)
    if name in shipped(kind):
        return DATA / folder / f"{name}{suffix}"
    state = "is a directory, not a file" if path.is_dir() else "does not exist"
    raise WorkbenchError(f"{kind} '{text}' {state}; give {what} or a shipped name: {', '.join(shipped(kind))}")


def in_checkout() -> bool:
    """Whether the package runs from a checkout (its data folders are links to the repository's), not a wheel."""
    return (DATA / "training").is_symlink()


def data_root() -> Path:
    """The folder laid out as the repository (`training/keepers/<specimen>/`, `probes/`, `figures/`), found by
    real paths: the checkout's own root when the package runs from one (it holds pyproject.toml and training/
    beside workbench/), else the package's data (`DATA`: an installed wheel holds copies there)."""
    checkout = Path(__file__).resolve().parent.parent
    return checkout if (checkout / "pyproject.toml").is_file() and (checkout / "training").is_dir() else DATA


def data_dirs() -> list[Path]:
    """Where specimens are looked for by name: `$WORKBENCH_DATA` (a checkout's root, or any directory laid
    out like it: `training/keepers/<name>/`) first when set, then the package's own data."""
    extra = os.environ.get("WORKBENCH_DATA")
    return [Path(extra).expanduser(), DATA] if extra else [DATA]


def resolve_run(given: str | os.PathLike) -> Path:
    """Returns the run directory `given` names: an existing directory, else the shipped keeper of that name.

    A name is looked up under `training/keepers/` of each of `data_dirs()`; the first copy that holds its
    tensors (trainable.safetensors) wins. Anything that is not a keeper's name is returned as given, for the
    run loader to refuse with its own message.

    Raises:
        WorkbenchError: a shipped keeper whose tensors are not here (an installed wheel carries only the
            default keeper's); the message says where to get them.
    """
    text = os.fspath(given)
    path = Path(text).expanduser()
    if path.exists() or "/" in text:
        return path
    found = [root / "training" / "keepers" / text for root in data_dirs()]
    found = [p for p in found if (p / "retrofit.json").is_file()]
    if not found:
        return path
    for candidate in found:
        if (candidate / "trainable.safetensors").is_file():
            return candidate
    if in_checkout() or os.environ.get("WORKBENCH_DATA"):
        return found[0]  # a specimen committed without its tensors: the loader names the missing file
    raise WorkbenchError(f"keeper '{text}' is shipped without its tensors (a wheel holds only {DEFAULT_KEEPER}'s); "
                         f"give --checkpoint CHECKOUT/training/keepers/{text} from a clone of the workbench "
                         f"repository, or set WORKBENCH_DATA=CHECKOUT")
