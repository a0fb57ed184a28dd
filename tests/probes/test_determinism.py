"""Determinism: the same battery on the same checkpoint, rows and seed writes byte-identical parquet."""

from __future__ import annotations

import tomli_w

from workbench.probes.battery import run_battery
from workbench.tasks import build_rows
from workbench.tasks.manifest import write_manifest

# Every probe whose numbers are not wall-clock times (latency measures seconds; halting needs a halting head
# and times its early exit).
BATTERY = {
    "identity": {"loops": 1, "n_rows": 2, "lora": False},
    "depth_matrix": {},
    "loop_accuracy": {"loops": 3},
    "overshoot": {"depths": [2], "extra": 2},
    "logit_lens": {"depths": [1, 2], "per_depth": 6},
    "splice": {"depths": [2, 3], "k0s": [1], "horizon": 1, "sites": ["state", "block_resid"], "spans": ["all"]},
    "heads": {"depths": [2, 3], "per_depth": 4},
    "linear_probe": {"depths": [1, 2, 3], "per_depth": 6},
    "drift": {"depths": [3], "per_depth": 4, "loops": 3},
    "gradient_audit": {"depths": [1, 2], "per_depth": 2, "n_rows": 2},
}


def test_same_checkpoint_rows_and_seed_give_byte_identical_parquet(tiny_run, tok, tmp_path):
    rows = tmp_path / "rows.jsonl"
    write_manifest(build_rows("chase", [1, 2, 3], 6, 9, alphabet=4, tokenizer=tok), rows)
    battery = tmp_path / "b.toml"
    battery.write_text(tomli_w.dumps({"battery": {"manifest": str(rows), "batch_size": 4}, "probes": BATTERY}))
    for name in ("a", "b"):
        run_battery(str(tiny_run), battery, tmp_path / name, seed=5, progress=False)
    files = sorted(p.name for p in (tmp_path / "a").glob("*.parquet"))
    assert {f.split("__")[0].removesuffix(".parquet") for f in files} == set(BATTERY)
    differ = [f for f in files if (tmp_path / "a" / f).read_bytes() != (tmp_path / "b" / f).read_bytes()]
    assert differ == [], f"parquet that differ between two identical runs: {differ}"
