"""`make setup`'s installer (scripts/setup_venv.py): uv is told what pip's configuration says, so it installs from the
same indexes, find-links and constraints (on this project's machines the CPU build of torch lies only there)."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPEC = importlib.util.spec_from_file_location("setup_venv", ROOT / "scripts" / "setup_venv.py")
setup_venv = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(setup_venv)

# `pip config list` as it prints on this project's machines: PIP_* variables (":env:") and /etc/pip.conf ("global")
LISTED = """:env:.cert='/etc/ssl/certs/ca-certificates.crt'
:env:.default-timeout='180'
:env:.disable-pip-version-check='1'
:env:.find-links='/opt/wheels'
global.cert='/etc/ssl/certs/other.crt'
global.constraint='/etc/xdg/pip/constraints.txt'
global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'
global.find-links='/opt/wheels'
global.index-url='https://mirror.example/simple'""".splitlines()


def test_pip_settings_become_the_same_uv_options():
    settings = setup_venv.parse_pip_config(LISTED)
    assert settings["extra-index-url"] == ["file:///opt/pypi/simple", "file:///opt/pypi-more/simple"]
    assert settings["find-links"] == ["/opt/wheels"]              # named twice, passed once
    assert settings["cert"][0] == "/etc/ssl/certs/ca-certificates.crt"   # the environment's overrides the file's
    options, env = setup_venv.uv_options(settings)
    pairs = list(zip(options[::2], options[1::2]))
    assert pairs[0] == ("--index-strategy", "unsafe-best-match")      # pip's rule across several indexes
    assert ("--index-url", "https://mirror.example/simple") in pairs
    assert [v for f, v in pairs if f == "--extra-index-url"] == settings["extra-index-url"]
    assert ("--find-links", "/opt/wheels") in pairs and ("--constraint", "/etc/xdg/pip/constraints.txt") in pairs
    assert env == {"SSL_CERT_FILE": "/etc/ssl/certs/ca-certificates.crt", "UV_HTTP_TIMEOUT": "180"}


def test_no_pip_configuration_is_uv_with_pips_index_rule_only():
    assert setup_venv.uv_options(setup_venv.parse_pip_config([])) == (["--index-strategy", "unsafe-best-match"], {})
    options, _ = setup_venv.uv_options(setup_venv.parse_pip_config(["global.no-index='true'"]))
    assert "--no-index" in options


def test_the_makefile_sets_up_through_the_script():
    makefile = (ROOT / "Makefile").read_text()
    assert "$(BIN)/python scripts/setup_venv.py" in makefile and "scripts/setup_venv.py\n" in makefile
    assert setup_venv.PACKAGES[0] == "torch==2.13.0" and "deepspeed==0.19.8" in setup_venv.PACKAGES
