#!/usr/bin/env bash
# make test-ft: the whole suite on free-threaded CPython 3.13t with the GIL off.
# scripts/ft_venv.sh makes .venv-ft first (and the interpreter, when there is none);
# tests/gil.py fails the session if the GIL is on while the tests run.
# PYTEST_ARGS passes arguments to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/ft_venv.sh
export PYTHON_GIL=0
# shellcheck disable=SC2086  # PYTEST_ARGS is a list of arguments
exec "${VENV_FT:-.venv-ft}/bin/python" -m pytest ${PYTEST_ARGS:-}
