#!/usr/bin/env bash
# `make gpu-check`: on a machine with a CUDA GPU, run the GPU tests and the GPU
# benchmark in one go (about 8 minutes at most) and leave the results in
# $GPU_OUT (docs/benchmarks/gpu): tests.txt and tests.xml (junit) of the test
# run, the benchmark's results.json / results.rst / plot and bench.txt, and
# check.txt (machine, torch, exit codes, seconds). On a machine without a GPU
# it says so and exits 0.
#
# The venv ($GPU_VENV) is made from a Python whose torch already sees CUDA
# (GPU_PYTHON, else python3): its site-packages and this checkout are put on
# the venv's path by a .pth file, so nothing is downloaded (GPU machines
# without network, such as the lent device machine, work). Where no Python has
# a CUDA torch, the venv installs one from $TORCH_INDEX (PyPI's Linux wheels
# are CUDA builds), with pytest and pytest-timeout.
set -uo pipefail

GPU_VENV=${GPU_VENV:-.venv-gpu}
GPU_OUT=${GPU_OUT:-docs/benchmarks/gpu}
GPU_BENCH=${GPU_BENCH:-"$GPU_VENV/bin/python -m benchmarks --workloads gpu --out $GPU_OUT"}
TORCH=${TORCH:-torch==2.13.0}
TORCH_INDEX=${TORCH_INDEX:-https://pypi.org/simple}
TEST_LIMIT=${TEST_LIMIT:-300}
BENCH_LIMIT=${BENCH_LIMIT:-150}
ROOT=$(pwd)

sees_cuda() {  # $1: a python; true when its torch is a CUDA build that sees a GPU
    "$1" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1
}

base=""
for candidate in ${GPU_PYTHON:-} python3 python; do
    if command -v "$candidate" >/dev/null 2>&1 && sees_cuda "$candidate"; then
        base=$(command -v "$candidate")
        break
    fi
done
if [ -z "$base" ] && ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu-check: no CUDA GPU on this machine (nvidia-smi finds none, no torch sees one):"
    echo "gpu-check: nothing to run; the GPU tests and benchmark need one."
    exit 0
fi

started=$(date +%s)
echo "gpu-check: expect about 5 minutes (tests <= ${TEST_LIMIT} s, benchmark <= ${BENCH_LIMIT} s)"
if [ -n "$base" ]; then
    echo "gpu-check: $base has a CUDA torch; making $GPU_VENV on top of it (no download)"
    rm -rf "$GPU_VENV"
    "$base" -m venv --without-pip "$GPU_VENV" || exit 1
    site=$("$GPU_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    {   # addsitedir also runs the .pth files there (as the base Python itself does)
        "$base" -c 'import site; [print(f"import site; site.addsitedir({d!r})") for d in site.getsitepackages()]'
        echo "$ROOT"
    } >"$site/gpu_check_base.pth"
else
    echo "gpu-check: a GPU but no CUDA torch; installing $TORCH from $TORCH_INDEX into $GPU_VENV"
    rm -rf "$GPU_VENV"
    ${PYTHON:-python3} -m venv "$GPU_VENV" || exit 1
    "$GPU_VENV/bin/python" -m pip install --quiet --index-url "$TORCH_INDEX" "$TORCH" \
        "pytest>=8" "pytest-timeout>=2.3" || { echo "gpu-check: could not install torch"; exit 1; }
    "$GPU_VENV/bin/python" -m pip install --quiet --no-deps -e . || exit 1
fi
py="$GPU_VENV/bin/python"
if ! sees_cuda "$py"; then
    echo "gpu-check: the torch in $GPU_VENV does not see the GPU:"
    "$py" -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.is_available())'
    exit 1
fi
if ! "$py" -c 'import prefetch, pytest, pytest_timeout' 2>/dev/null; then
    echo "gpu-check: $GPU_VENV lacks pytest or pytest-timeout (or cannot import prefetch)"
    exit 1
fi

mkdir -p "$GPU_OUT"
export PYTHONUNBUFFERED=1
timeout "$TEST_LIMIT" "$py" -m pytest tests/gpu -v -rs -p no:cacheprovider \
    --junitxml="$GPU_OUT/tests.xml" 2>&1 | tee "$GPU_OUT/tests.txt"
tests_rc=${PIPESTATUS[0]}
timeout "$BENCH_LIMIT" $GPU_BENCH 2>&1 | tee "$GPU_OUT/bench.txt"
bench_rc=${PIPESTATUS[0]}

{
    echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)"
    nvidia-smi -L 2>/dev/null || echo "nvidia-smi: not found"
    "$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name())'
    echo "tests: exit $tests_rc ($(grep -Eo '[0-9]+ (passed|failed|skipped|error)[a-z]*' "$GPU_OUT/tests.txt" | tr '\n' ' '))"
    echo "benchmark: exit $bench_rc ($GPU_BENCH)"
    echo "seconds: $(($(date +%s) - started))"
} | tee "$GPU_OUT/check.txt"
[ "$tests_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
