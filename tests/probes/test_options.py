"""Every probe declares its options as a typed record; the battery checks a battery's options against it before any
probe runs, and every battery file the repository ships still loads."""

import inspect
from dataclasses import MISSING, fields
from pathlib import Path

import pytest
import tomllib

from tests.test_cli_errors import assert_clean_error, invoke
from workbench.errors import WorkbenchError
from workbench.probes import PROBES, get_probe
from workbench.probes.battery import SELECTION_KEYS, check_options, load_battery
from workbench.probes.options import CONTEXT

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "workbench" / "data" / "probes" / "chase_n8_d1-7.jsonl"
BATTERIES = sorted({p.resolve() for folder in ("probes", "workbench/data/probes", "training")   # battery files:
                    for p in (ROOT / folder).rglob("*.toml")                                # a [battery] table
                    if "battery" in tomllib.loads(p.read_text()) and "probes" in tomllib.loads(p.read_text())})


@pytest.mark.parametrize("name", list(PROBES))
def test_each_probe_declares_the_options_its_run_takes(name):
    """The record is the battery's schema and `run` the probe's Python call: the same names, the same defaults."""
    spec = get_probe(name)
    record = {f.name: f.default for f in fields(spec.options)}
    assert MISSING not in record.values(), name
    params = list(inspect.signature(spec.run).parameters.values())
    assert [p.name for p in params[:3]] == list(CONTEXT)
    assert {p.name: p.default for p in params[3:]} == record, name


def test_every_shipped_battery_loads_and_its_options_check():
    assert len(BATTERIES) >= 12
    for path in BATTERIES:
        for name, options in load_battery(path)["probes"].items():
            check_options(name, {k: v for k, v in options.items() if k not in SELECTION_KEYS})


@pytest.mark.parametrize("probe, options, message", [
    ("overshoot", {"extras": 2}, "probe 'overshoot' has no option 'extras'; accepted: extra, batch_size; "
                                 "did you mean 'extra'?"),
    ("depth_matrix", {"loop": 3}, "did you mean 'loops'?"),
    ("depth_matrix", {"loops": "four"}, "probe 'depth_matrix' option loops = 'four': input should be a valid integer"),
    ("drift", {"positions": "last"}, "probe 'drift' option positions = 'last': input should be 'all' or 'read'"),
    ("heads", {"batch_size": 0}, "probe 'heads' option batch_size = 0: input should be greater than or equal to 1"),
    ("patching", {"components": "resid"}, "probe 'patching' option components = 'resid'"),
    ("splice", {"k0s": [1, "two"]}, "probe 'splice' option k0s = [1, 'two']"),
])
def test_a_bad_option_is_refused_in_one_line(probe, options, message):
    with pytest.raises(WorkbenchError) as err:
        check_options(probe, options)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_the_cli_refuses_a_misspelled_option_before_any_probe_runs(capsys, monkeypatch, tmp_path):
    battery = tmp_path / "b.toml"
    battery.write_text(f'[battery]\nmanifest = "{MANIFEST}"\n[probes.loop_accuracy]\n[probes.overshoot]\nextras = 2\n')
    out = tmp_path / "res"
    code, _, err = invoke(capsys, monkeypatch, "probe", "--checkpoint", "untrained:tiny-llama:2:4", "--battery",
                          battery, "--out", out)
    assert_clean_error(code, err, "probe 'overshoot' has no option 'extras'", "did you mean 'extra'?")
    assert not out.exists()
