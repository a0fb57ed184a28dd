"""A run's parent (`init_from`): the finished run or keeper it continues from, checked before any tensor loads.

`check_parent` verifies the parent's files against its provenance, then that it was trained on the same base, with
the same retrofit and the same trained groups as the run about to start; it returns the parent's directory, the
groups its trainable.safetensors holds (what `runs.load_trained` loads strictly) and the lineage the run records.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import tomllib

from workbench import runs
from workbench.errors import WorkbenchError
from workbench.io import sha256_file
from workbench.loop.config import RetrofitConfig


@dataclass(frozen=True)
class Parent:
    """A checked parent run: its directory, the groups its tensors hold, and the lineage a child records."""

    dir: Path
    groups: list[str]
    lineage: dict


def find_parent(parent: str, recipe_dir: Path) -> Path:
    """The parent's directory: relative to the recipe file first, then to the working directory."""
    parent_dir = Path(parent)
    if not parent_dir.is_absolute() and (Path(recipe_dir) / parent_dir).is_dir():
        parent_dir = Path(recipe_dir) / parent_dir
    if not parent_dir.is_dir():
        raise WorkbenchError(f"init_from: '{parent}' is not a directory (a finished run or keeper)")
    return parent_dir


def check_parent(parent: str, recipe_dir: Path, base_hash: str, config: RetrofitConfig, groups: list[str],
                 halting_only: bool) -> Parent:
    """Checks a parent run (hashes, same base, retrofit and groups) for a child retrofit `config` training `groups`.

    Args:
        parent: the recipe's `init_from`.
        recipe_dir: the recipe file's directory (a relative `init_from` resolves there first).
        base_hash: `runs.base_sha256` of the child's base.
        halting_only: every stage of the child is a halting stage, which alone may add a halting head to a parent
            trained without one (RecurTrace App. E freezes everything else, so the parent's tensors load strictly
            and the head starts from its own init).
    Any child may add loop codes (`[model] loop_codes`) to a parent without them: the parent's tensors load
    strictly and the codes start at 0, so the child starts as the parent at every loop. The lineage records it.
    Raises:
        WorkbenchError: a missing or damaged parent, another base, another retrofit, or other trained groups.
    """
    parent_dir = find_parent(parent, recipe_dir)
    prov = runs.verify_files(parent_dir)
    record = json.loads((parent_dir / runs.RETROFIT).read_text())
    if record["base"]["sha256"] != base_hash:
        raise WorkbenchError(f"init_from: '{parent}' was trained on base {record['base']['sha256'][:12]}..., this "
                             f"recipe's base is {base_hash[:12]}...")
    mine, theirs = json.loads(json.dumps(config.to_dict())), record["settings"]
    adds_head = bool(mine.get("halting") and not theirs.get("halting") and halting_only)
    adds_codes = bool(mine.get("loop_codes") and not theirs.get("loop_codes"))
    compared = ({**mine, "halting": False, "halting_pooling": theirs.get("halting_pooling")}
                if adds_head else dict(mine))   # the new head's pooling is its own choice
    if adds_codes:
        compared.pop("loop_codes")   # a retrofit without codes does not write the key (RetrofitConfig.to_dict)
    if theirs != compared:
        diff = sorted(k for k in set(mine) | set(theirs) if compared.get(k) != theirs.get(k))
        raise WorkbenchError(f"init_from: '{parent}' has another retrofit ({', '.join(diff)} differ); "
                             "the recipe's [model] and [lora] must match the parent's")
    added = (["halting"] if adds_head else []) + (["loop_codes"] if adds_codes else [])
    parent_groups = [g for g in groups if g not in added]
    if record["trained_groups"] != parent_groups:
        raise WorkbenchError(f"init_from: '{parent}' trained {record['trained_groups']}, this recipe trains {groups}")
    lineage = [{"run": parent, "name": tomllib.loads((parent_dir / runs.RECIPE).read_text()).get("name"),
                "provenance_sha256": sha256_file(parent_dir / runs.PROVENANCE),
                "trainable_sha256": prov["files"][runs.TRAINABLE], "halting_head_added": adds_head}
               | ({"loop_codes_added": True} if adds_codes else {})]
    return Parent(parent_dir, parent_groups, {"parents": lineage + (prov.get("lineage") or {}).get("parents", [])})
