# explorl — two-command quickstart: `make demo` and `make test`. Each target sets up .venv
# when missing: the pinned CPU torch first (a plain `torch` requirement would pull several
# GB of CUDA wheels), then the package with its dev extras.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH_PIN ?= torch==2.13.0
PYTEST_ARGS ?=

.PHONY: setup demo test bench clean

$(BIN)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q $(TORCH_PIN)
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

setup: $(BIN)/.installed

demo: setup
	$(BIN)/explorl train recipes/quickstart.yaml --out runs/quickstart

test: setup
	$(BIN)/python -m pytest -n 2 $(PYTEST_ARGS)

bench: setup
	$(BIN)/python benchmarks/quickstart_speed.py

clean:
	rm -rf runs .pytest_cache
