# prefetch: the two commands a newcomer needs are `make demo` and `make test`.
# CI (.ci/run) runs `make test` and `make test-slow`: together, every test.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
TORCH ?= torch==2.13.0
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
BENCH_ARGS ?=

.PHONY: help demo test test-slow test-gpu stress docs doctest lint typecheck bench dist clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH)"
	$(PY) -m pip install --quiet -e ".[test,docs,lint,bench,dist]"
	touch $(STAMP)

demo: $(STAMP)  ## run the built-in demonstration (plain vs prefetched training loop)
	$(PY) -m prefetch.demo

test: $(STAMP)  ## run the fast tests, about a minute (GPU tests skip without CUDA)
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

test-slow: $(STAMP)  ## run the slow tests: subprocesses, Ctrl-C, DDP, soak, benchmark smoke run
	$(PY) -m pytest -m slow $(PYTEST_ARGS)

test-gpu: $(STAMP)  ## run only the GPU tests (needs CUDA)
	$(PY) -m pytest tests/gpu -v -rs $(PYTEST_ARGS)

stress: $(STAMP)  ## long soak / stress run
	PREFETCH_STRESS=full $(PY) -m pytest tests/test_stress.py -v $(PYTEST_ARGS)

docs: $(STAMP)  ## build the HTML docs, warnings as errors
	$(PY) -m sphinx -W --keep-going -b html docs docs/_build/html

doctest: $(STAMP)  ## run every example in the docs and docstrings
	$(PY) -m sphinx -W --keep-going -b doctest docs docs/_build/doctest

lint: $(STAMP)  ## ruff check and format check
	$(PY) -m ruff check prefetch benchmarks tests docs examples
	$(PY) -m ruff format --check prefetch benchmarks tests docs examples

typecheck: $(STAMP)  ## mypy --strict on the package
	$(PY) -m mypy

bench: $(STAMP)  ## benchmarks against the baselines; results in docs/benchmarks/
	$(PY) -m benchmarks $(BENCH_ARGS)

dist: $(STAMP)  ## build the sdist and the wheel into dist/ (the wheel holds only prefetch/)
	rm -rf dist
	$(PY) -m build --outdir dist .

clean:  ## remove the virtual environment and build outputs
	rm -rf $(VENV) docs/_build build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis
