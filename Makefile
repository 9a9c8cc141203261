# framefleet — the commands the README names.
#   make demo   one job on the embedded default (no Redis, no S3), in a local virtualenv
#   make test   install what the tests need, lint, run the whole suite (CPU; in two steps:
#               tests/parallel.py says which run side by side)
#   make lint   ruff + mypy
#   make chaos  the fault tests at full counts
#   make bench  CPU pipeline benchmark (the GPU one runs on a GPU host: see bench/README.md)
#   make docs   the documentation site (mkdocs.yml), built --strict into site/

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# The CPU build of torch is all the demo and tests need; GPU hosts bring their own.
TORCH_SPEC ?= torch==2.13.0
PYTEST_ARGS ?=
# make test's xdist pass: pytest-xdist workers for the tests that may run side by side; 0 runs
# them in one process. The `serial` tests' two lanes run beside them. Two from 2 cores, half the cores
# from 4 up: the pass waits more than it computes (one process: 0.77 of a core busy on
# 2 cores, 21:58 of wall); two workers on 2 quiet cores took it to 12:35 (1.19 cores busy).
PYTEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); echo $$((n < 2 ? 0 : n < 4 ? 2 : n / 2)))
# Each pass ends with its slowest tests.
PYTEST_DURATIONS ?= --durations=20

.PHONY: demo test lint chaos bench docs install install-test clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

$(VENV)/.installed: pyproject.toml | $(PY)
	$(PIP) install -q "$(TORCH_SPEC)"
	$(PIP) install -q -e ".[worker]"
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed pyproject.toml
	$(PIP) install -q -e ".[worker,test,dev,ops,api,docs]"
	touch $@

install: $(VENV)/.installed

install-test: $(VENV)/.installed-test
	./scripts/install-system-deps.sh

demo: install
	$(VENV)/bin/framefleet demo

lint: install-test
	$(VENV)/bin/ruff check producer worker tests bench examples
	$(VENV)/bin/mypy

# Two steps (tests/passes.py): the tests that may run side by side, over PYTEST_WORKERS xdist
# workers, with the serial tests' two lanes beside them; then the tests that busy every core, alone.
test: install-test lint
	$(PY) -m tests.passes --workers $(PYTEST_WORKERS) $(PYTEST_DURATIONS) $(PYTEST_ARGS)

chaos: install-test
	FRAMEFLEET_CHAOS_FULL=1 $(PY) -m pytest -m chaos $(PYTEST_DURATIONS) $(PYTEST_ARGS)

bench: install-test
	$(PY) bench/decode/pipeline.py --device cpu

# The site alone needs the docs extra, not the worker's. NO_MKDOCS_2_WARNING: mkdocs-material's
# banner about its successor, not a warning of this site's.
docs: | $(PY)
	$(PIP) install -q -e ".[docs]"
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

clean:
	rm -rf $(VENV) demo-out site .framefleet .pytest_cache .mypy_cache .ruff_cache
