# framefleet — the commands the README names.
#   make demo   one job on the embedded default (no Redis, no S3), in a local virtualenv
#   make test   install what the tests need, lint, run the whole suite (CPU)
#   make lint   ruff + mypy
#   make chaos  the fault tests at full counts
#   make bench  CPU pipeline benchmark (the GPU one runs on a GPU host: see bench/README.md)

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# The CPU build of torch is all the demo and tests need; GPU hosts bring their own.
TORCH_SPEC ?= torch==2.13.0
PYTEST_ARGS ?=

.PHONY: demo test lint chaos bench install install-test clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

$(VENV)/.installed: pyproject.toml | $(PY)
	$(PIP) install -q "$(TORCH_SPEC)"
	$(PIP) install -q -e ".[worker]"
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed pyproject.toml
	$(PIP) install -q -e ".[worker,test,dev,ops,api]"
	touch $@

install: $(VENV)/.installed

install-test: $(VENV)/.installed-test
	./scripts/install-system-deps.sh

demo: install
	$(VENV)/bin/framefleet demo

lint: install-test
	$(VENV)/bin/ruff check producer worker tests bench examples
	$(VENV)/bin/mypy

test: install-test lint
	$(PY) -m pytest -m "not gpu" $(PYTEST_ARGS)

chaos: install-test
	FRAMEFLEET_CHAOS_FULL=1 $(PY) -m pytest -m chaos $(PYTEST_ARGS)

bench: install-test
	$(PY) bench/decode/pipeline.py --device cpu

clean:
	rm -rf $(VENV) demo-out .framefleet .pytest_cache .mypy_cache .ruff_cache
