"""An installable wheel: `pip wheel .`, its contents, and the installed (not editable) `workbench` at work.

The wheel is built from a copy of the source tree (the build writes build/ and *.egg-info beside
the sources) and installed with --no-deps into a fresh virtual environment. That environment sees
the test interpreter's packages through a .pth file instead of installing torch and the rest:
nothing may download here, and the point is the wheel, not the dependencies. A path listed in a
.pth file is not itself scanned for .pth files, so the editable install of the checkout (a .pth
finder in the test interpreter's site-packages) stays inactive and `workbench` is the wheel's.
"""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "README.md", "workbench", "probes", "training", "figures")

pytestmark = pytest.mark.slow  # a wheel build and a model load: minutes on 2 cores


SHIPPED_TENSORS = ROOT / "training" / "keepers" / "smollm2-chase" / "trainable.safetensors"


def copy_or_stand_in(source: str, target: str) -> None:
    """Copies a source file, except a tensor file the wheel does not ship: a few-byte stand-in of the same name takes
    its place (the package-data patterns still see it, so a pattern that took it would show below; the copy skips
    the hundreds of MB of specimens' tensors)."""
    if source.endswith(".safetensors") and Path(source) != SHIPPED_TENSORS:
        Path(target).write_bytes(b"stand-in for a tensor file the wheel does not ship")
    else:
        shutil.copy2(source, target)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    src = tmp_path_factory.mktemp("src")
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "attempts", "out", "report.html")
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():  # data/* links stay relative links
            shutil.copytree(path, src / name, symlinks=True, ignore=skip, copy_function=copy_or_stand_in)
        else:
            shutil.copy2(path, src / name)
    dist = tmp_path_factory.mktemp("dist")
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                          "-w", str(dist), str(src)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    (built,) = dist.glob("workbench-*.whl")
    return built


def test_the_wheel_holds_every_default(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    data = "workbench/data/"
    expected = [f"{data}claims.toml", f"{data}corpus.txt", f"{data}figures/paper.toml",
                *(f"{data}probes/{n}" for n in ("default.toml", "demo.toml", "chase_n8_d1-7.jsonl",
                                                 "chase_n8_d1-7.manifest.json")),
                *(f"{data}training/{p.name}" for p in (ROOT / "training").glob("*.toml")),
                f"{data}training/keepers/smollm2-chase/trainable.safetensors",  # the default keeper's tensors
                *(f"{data}training/keepers/{k}/{f}" for k in ("smollm2-chase", "smollm2-chase-anneal")
                  for f in ("retrofit.json", "recipe.toml", "provenance.json",
                            "battery/summary.json", "battery/depth_matrix.parquet")),
                f"{data}training/keepers/smollm2-chase/metrics.jsonl",  # the default keeper loads: provenance hashes it
                *(f"{data}training/keepers/{k}/final/{f}"  # the dense controls' claims read these
                  for k in ("smollm2-chase", "smollm2-chase-direct", "smollm2-chase-scratchpad")
                  for f in ("final.json", "final.parquet", "latency.parquet")),
                *(f"{data}training/halting/keeper-oracle/halting/{f}"  # the halting claims read these
                  for f in ("summary.json", "halting.parquet", "halting__chosen.parquet")),
                *(f"{data}training/selection/{d}/{f}"  # the block-selection claims read these
                  for d, f in (("smollm2-135m-instruct", "block_selection.json"),
                               ("smollm2-135m-instruct-stage2", "block_selection.json"),
                               ("smollm2-135m-instruct-stage2", "window_sweep.json"))),
                "workbench/cli.py", "workbench/defaults.py", "workbench/probes/battery.py"]
    assert len(expected) > 25
    assert [n for n in expected if n not in names] == []
    assert not [n for n in names if "attempts/" in n or n.startswith("tests/") or n.endswith("report.html")]
    # no other specimen's tensors: they stay in the repository (WORKBENCH_DATA or --checkpoint PATH)
    assert [n for n in names if n.endswith(".safetensors")] == [f"{data}training/keepers/smollm2-chase/trainable.safetensors"]
    shipped = zipfile.ZipFile(wheel).read(f"{data}training/keepers/smollm2-chase/trainable.safetensors")
    assert shipped == SHIPPED_TENSORS.read_bytes()  # the real tensors, not a stand-in
    assert wheel.stat().st_size <= 15 * 2**20, f"the wheel is {wheel.stat().st_size / 2**20:.1f} MiB"
    entry = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "workbench = workbench.cli:run" in entry


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory):
    """A fresh venv with the wheel installed (--no-deps); its `workbench` script and an environment to run it."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    res = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
                          "--no-deps", "--no-index", "-q", str(wheel)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    where = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(subprocess.run([venv / "bin" / "python", "-c", where], capture_output=True, text=True,
                               check=True).stdout.strip())
    (site / "outer.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")  # torch & co., see the module doc
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return venv / "bin" / "workbench", env, site


def test_the_installed_workbench_runs_with_its_defaults(installed, tmp_path):
    script, env, site = installed
    from workbench.analysis.claims import VERDICTS, build_ledger

    res = subprocess.run([script, "claims", "--out", "ledger"], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    ledger = build_ledger()  # from the checkout: the wheel must hold every result the ledger reads
    counts = ", ".join(f"{sum(r['verdict'] == v for r in ledger)} {v}" for v in VERDICTS)
    assert [line for line in res.stdout.splitlines() if not line.startswith("wrote ")][-1] == counts
    # byte for byte: a table the wheel leaves out changes a row's numbers or verdict (pyproject's package-data
    # ships the tables the ledger reads and no others)
    for name in ("ledger.json", "LEDGER.md"):
        assert (tmp_path / "ledger" / name).read_bytes() == (ROOT / "claims" / name).read_bytes(), name
    # heads: the demo battery's lightest probe on the keeper, over the wheel's manifest (identity would read the
    # 64-row guardrail on two models: half a minute that checks nothing about the wheel)
    res = subprocess.run([script, "probe", "--checkpoint", "smollm2-chase", "--battery", "demo", "--only", "heads",
                          "--out", "res"], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    summary = json.loads((tmp_path / "res" / "summary.json").read_text())
    assert Path(summary["checkpoint"]["path"]).is_relative_to(site)  # the wheel's keeper, not the checkout's
    assert Path(summary["battery"]).is_relative_to(site)
    assert (tmp_path / "res" / "report.html").is_file()


def test_another_keeper_installed_says_where_its_tensors_are(installed, tmp_path):
    """The wheel lists every keeper (its results feed `claims`) but holds one keeper's tensors: asking for another
    by name is one line naming a checkout or WORKBENCH_DATA; with WORKBENCH_DATA set to the checkout it loads."""
    script, env, _ = installed
    args = [script, "probe", "--checkpoint", "smollm2-chase-anneal", "--battery", "demo", "--only", "heads"]
    res = subprocess.run([*args, "--out", "res"], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert res.returncode == 2 and not (tmp_path / "res").exists()
    (line,) = res.stderr.strip().splitlines()
    assert "smollm2-chase-anneal" in line and "WORKBENCH_DATA" in line and "training/keepers/" in line
    res = subprocess.run([*args, "--out", "res2"], capture_output=True, text=True, cwd=tmp_path,
                         env={**env, "WORKBENCH_DATA": str(ROOT)})
    assert res.returncode == 0, res.stderr[-2000:]
    summary = json.loads((tmp_path / "res2" / "summary.json").read_text())
    assert Path(summary["checkpoint"]["path"]).is_relative_to(ROOT)
