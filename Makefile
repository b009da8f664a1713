# prefetch: the two commands a newcomer needs are `make demo` and `make test`.
# CI (.ci/run) runs `make test`: every test, then `make test-ft`: every test on free-threaded
# Python 3.13t with the GIL off, and `make test-torch-range`: the quick suite on the oldest and
# the newest torch. `make test-fast` is the quick edit loop.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
TORCH ?= torch==2.13.0
# Where pip looks for torch, e.g. https://download.pytorch.org/whl/cpu for the CPU build
# (empty: pip's own configuration; on plain PyPI a Linux torch is the CUDA build).
TORCH_INDEX ?=
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
BENCH_ARGS ?=
# `make bench` writes here (ignored by git); `make bench-docs` writes docs/benchmarks/.
BENCH_OUT ?= runs/bench
GPU_OUT ?= docs/benchmarks/gpu

MUTATION_JOBS ?= 2
# The kill rate `make mutation` must reach (docs/development.rst, "Recorded results"); 0: only report.
MUTATION_FLOOR ?= 90
# Mutant names or globs to check (empty: all), e.g. MUTANTS="prefetch._threads.tickets.*"
MUTANTS ?=
# Non-empty: keep mutants/ and go on with an interrupted run (mutmut re-checks only the
# functions whose code changed since); empty: start afresh.
MUTATION_RESUME ?=

# The quick suite on the oldest torch the README claims and the newest on PyPI (test-torch-range).
TORCH_RANGE ?= 2.6.0 2.15.0
# KEEP_VENVS=0 removes each torch venv after its tests; SKIP_IF_NO_SPACE=1 skips a torch
# the disk has no room for (about 10 GB each) instead of failing (scripts/test_torch_range.sh).
KEEP_VENVS ?= 1
SKIP_IF_NO_SPACE ?= 0

.PHONY: help demo test test-ft test-torch-range stress-ft test-fast test-gpu gpu-check stress mutation docs doctest lint typecheck bench bench-docs dist clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

$(STAMP): setup.cfg pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) "$(TORCH)"
	$(PY) -m pip install --quiet -c constraints.txt -e ".[test,docs,lint,bench,dist]"
	touch $(STAMP)

demo: $(STAMP)  ## run the built-in demonstration (plain vs prefetched training loop)
	$(PY) -m prefetch.demo

test: $(STAMP)  ## run the whole test suite (GPU tests skip without CUDA)
	$(PY) -m pytest $(PYTEST_ARGS)

test-ft:  ## the whole suite on free-threaded Python 3.13t, GIL off (builds the interpreter once, makes .venv-ft)
	PYTEST_ARGS='$(PYTEST_ARGS)' bash scripts/test_ft.sh

test-torch-range:  ## the quick suite on torch 2.6.0 and 2.15.0 (TORCH_RANGE), each in .venv-torch-VERSION (made once)
	TORCH_RANGE='$(TORCH_RANGE)' PYTEST_ARGS='$(PYTEST_ARGS)' KEEP_VENVS='$(KEEP_VENVS)' \
		SKIP_IF_NO_SPACE='$(SKIP_IF_NO_SPACE)' bash scripts/test_torch_range.sh

stress-ft:  ## the concurrency tests 30 times in a row on 3.13t, GIL off (RUNS=N); logs in runs/stress-ft/
	PYTEST_ARGS='$(PYTEST_ARGS)' bash scripts/stress_ft.sh

test-fast: $(STAMP)  ## the quick loop: every test not marked slow (subprocesses, Ctrl-C, DDP, soak, bench smoke)
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

test-gpu: $(STAMP)  ## run only the GPU tests (needs CUDA)
	$(PY) -m pytest tests/gpu -v -rs $(PYTEST_ARGS)

gpu-check:  ## with a CUDA GPU: GPU tests + GPU benchmark (< 8 min) into GPU_OUT (docs/benchmarks/gpu/); else a no-op
	GPU_OUT='$(GPU_OUT)' bash scripts/gpu_check.sh

stress: $(STAMP)  ## long soak / stress run
	PREFETCH_STRESS=full $(PY) -m pytest tests/test_stress.py -v $(PYTEST_ARGS)

mutation: $(STAMP)  ## mutation check of the thread engine and device iterator (slow; not in CI; MUTANTS=globs)
	$(PY) -m pip install --quiet "$(TORCH)" -e ".[mutation]"
	$(if $(MUTATION_RESUME),,rm -rf mutants)
	$(VENV)/bin/mutmut run --max-children $(MUTATION_JOBS) $(MUTANTS)
	$(PY) tools/mutation_report.py --min $(MUTATION_FLOOR)

docs: $(STAMP)  ## build the HTML docs, warnings as errors
	$(PY) -m sphinx -W --keep-going -b html docs docs/_build/html

doctest: $(STAMP)  ## run every example in the docs and docstrings
	$(PY) -m sphinx -W --keep-going -b doctest docs docs/_build/doctest

lint: $(STAMP)  ## ruff check and format check
	$(PY) -m ruff check prefetch benchmarks tests docs examples tools
	$(PY) -m ruff format --check prefetch benchmarks tests docs examples tools

typecheck: $(STAMP)  ## mypy --strict on the package
	$(PY) -m mypy

bench: $(STAMP)  ## benchmarks into runs/bench/ (ignored); exit 3 if a target is MISS, 1 on an error
	$(PY) -m benchmarks --check --out $(BENCH_OUT) $(BENCH_ARGS)

bench-docs: $(STAMP)  ## rerun the benchmarks and rewrite the docs' results (docs/benchmarks/); MISS exits 0
	$(PY) -m benchmarks --out docs/benchmarks $(BENCH_ARGS)

dist: $(STAMP)  ## build the sdist and the wheel into dist/ (the wheel holds only prefetch/)
	rm -rf dist
	$(PY) -m build --outdir dist .

clean:  ## remove the virtual environment and build outputs
	rm -rf $(VENV) .venv-gpu .venv-ft .venv-torch-* docs/_build build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis
