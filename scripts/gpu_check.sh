#!/usr/bin/env bash
# The GPU check: `bash scripts/gpu_check.sh` from the repository root (`make gpu-check` only
# calls it). On a machine with a CUDA GPU it runs the GPU tests and the GPU benchmark in one go,
# in under 8 minutes, and writes every result flat into $GPU_OUT (default docs/benchmarks/gpu),
# at most 8 files:
#   check.txt   versions, GPU, clocks before and after, each step's exit status, seconds
#   tests.txt   the GPU tests' log         tests.xml   the same run as junit XML
#   bench.txt   the benchmark's log        results.json, results.rst, gpu.png   its results
# It prints the Python, torch and CUDA versions, the GPUs and their clocks first. Without a GPU
# it says so and exits 0.
#
# Exit status: the GPU tests' (pytest's) when they fail; 7 when they pass but the benchmark did
# not finish (an error, a missing extra, its time limit); 1 when it could not start (a GPU but
# no Python whose torch sees it, or no pytest); else 0. A benchmark target that is MISS is a
# result, in results.rst, not a failure.
#
# Nothing is installed or downloaded: it uses the first Python whose torch sees CUDA
# (GPU_PYTHON if set, then python3, then python) as it is, and puts this checkout on its path
# with PYTHONPATH. That Python needs pytest and pytest-timeout (and hypothesis, numpy, as the
# test configuration loads them), and matplotlib for the plot; not prefetch_generator.
#
# On a machine whose runner copies the working tree and brings back one folder, $OUT:
#     GPU_OUT="$OUT" bash scripts/gpu_check.sh
# then copy that folder's files into docs/benchmarks/gpu/ (docs/development.rst).
#
# GPU_CHECK_DRY_RUN=1 is for testing this script only (tests/test_gpu_check.py): it hides every
# GPU from torch (CUDA_VISIBLE_DEVICES=) and runs the same steps anyway, so the GPU tests skip
# and the benchmark reports its GPU workload skipped. TEST_LIMIT and BENCH_LIMIT (seconds) bound
# the two steps.
set -uo pipefail

GPU_OUT=${GPU_OUT:-docs/benchmarks/gpu}
case $GPU_OUT in /*) ;; *) GPU_OUT="$PWD/$GPU_OUT" ;; esac
TEST_LIMIT=${TEST_LIMIT:-240}
BENCH_LIMIT=${BENCH_LIMIT:-150}
PROBE_LIMIT=30
DRY_RUN=${GPU_CHECK_DRY_RUN:-0}
FILES="check.txt tests.txt tests.xml bench.txt results.json results.rst gpu.png"
cd "$(dirname "$0")/.." || exit 1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
[ "$DRY_RUN" = 1 ] && export CUDA_VISIBLE_DEVICES=""

bounded() {  # $1: seconds, then a command: run it, killed after that long (where `timeout` exists)
    local limit=$1
    shift
    if command -v timeout >/dev/null 2>&1; then timeout -k 10 "$limit" "$@"; else "$@"; fi
}

read -r -d '' PROBE <<'EOF'
import platform, sys
print(f"gpu-check: python {platform.python_version()} ({sys.executable})")
try:
    import torch
except Exception as error:
    print(f"gpu-check: torch cannot be imported: {type(error).__name__}: {error}")
    sys.exit(2)
cuda = torch.cuda.is_available()
count = torch.cuda.device_count() if cuda else 0
cudnn = torch.backends.cudnn.version() if cuda else None
print(f"gpu-check: torch {torch.__version__}, CUDA {torch.version.cuda or 'none (CPU build)'}, "
      f"cuDNN {cudnn or 'n/a'}; torch.cuda.is_available(): {cuda}, {count} GPU(s)")
for index in range(count):
    p = torch.cuda.get_device_properties(index)
    print(f"gpu-check: GPU {index}: {p.name}, compute capability {p.major}.{p.minor}, "
          f"{p.total_memory / 2**30:.1f} GiB, {p.multi_processor_count} SMs")
sys.exit(0 if cuda else 1)
EOF

clocks() {  # $1: "before" or "after": the GPUs' clocks now, from nvidia-smi
    if ! command -v nvidia-smi >/dev/null 2>&1; then
        echo "gpu-check: clocks $1: nvidia-smi not found"
        return
    fi
    local found
    found=$(bounded "$PROBE_LIMIT" nvidia-smi --format=csv --query-gpu=index,name,clocks.sm,\
clocks.max.sm,clocks.mem,clocks.max.mem,temperature.gpu,power.draw,driver_version 2>&1) ||
        found=$(bounded "$PROBE_LIMIT" nvidia-smi --format=csv \
            --query-gpu=index,name,clocks.sm,clocks.max.sm 2>&1) ||
        found="nvidia-smi failed: $found"
    echo "$found" | sed "s/^/gpu-check: clocks $1: /"
}

# Find the Python to use: the first whose torch sees CUDA; in a dry run, the first with torch.
py="" header="" fallback="" fallback_header="" first_header=""
for candidate in ${GPU_PYTHON:-} python3 python; do
    command -v "$candidate" >/dev/null 2>&1 || continue
    said=$(bounded "$PROBE_LIMIT" "$(command -v "$candidate")" -c "$PROBE" 2>&1)
    rc=$?
    [ -z "$first_header" ] && first_header=$said
    if [ "$rc" -eq 0 ]; then
        py=$(command -v "$candidate") header=$said
        break
    elif [ "$rc" -eq 1 ] && [ -z "$fallback" ]; then
        fallback=$(command -v "$candidate") fallback_header=$said
    fi
done
if [ -z "$py" ] && [ "$DRY_RUN" = 1 ] && [ -n "$fallback" ]; then
    py=$fallback header=$fallback_header
fi
if [ -z "$py" ]; then
    echo "${fallback_header:-${first_header:-gpu-check: no python3 or python found}}"
    clocks before
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
        echo "gpu-check: nvidia-smi sees a GPU, but no Python here has a torch that sees it"
        echo "gpu-check: (tried ${GPU_PYTHON:-} python3 python); set GPU_PYTHON to one that does."
        exit 1
    fi
    echo "gpu-check: no CUDA GPU on this machine (no nvidia-smi GPU, no torch sees one):"
    echo "gpu-check: nothing to run; the GPU tests and benchmark need one."
    exit 0
fi

started=$(date +%s)
mkdir -p "$GPU_OUT" || exit 1
for name in $FILES; do rm -f "${GPU_OUT:?}/$name"; done
summary="$GPU_OUT/check.txt"
{
    echo "$header"
    clocks before
    echo "gpu-check: $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    [ "$DRY_RUN" = 1 ] && echo "gpu-check: GPU_CHECK_DRY_RUN=1: a test of this script, GPUs hidden from torch"
    echo "gpu-check: results into $GPU_OUT; at most $((TEST_LIMIT + BENCH_LIMIT + 60)) s (tests <= $TEST_LIMIT s, benchmark <= $BENCH_LIMIT s)"
} | tee "$summary"

if ! "$py" -c 'import pytest, pytest_timeout' >/dev/null 2>&1; then
    echo "gpu-check: $py lacks pytest or pytest-timeout; nothing is installed here" | tee -a "$summary"
    exit 1
fi

bounded "$TEST_LIMIT" "$py" -m pytest tests/gpu -v -rs -p no:cacheprovider \
    --junitxml="$GPU_OUT/tests.xml" 2>&1 | tee "$GPU_OUT/tests.txt"
tests_rc=${PIPESTATUS[0]}
bounded "$BENCH_LIMIT" "$py" -m benchmarks --workloads gpu --out "$GPU_OUT" 2>&1 |
    tee "$GPU_OUT/bench.txt"
bench_rc=${PIPESTATUS[0]}

if [ "$tests_rc" -ne 0 ]; then status=$tests_rc; elif [ "$bench_rc" -ne 0 ]; then status=7; else status=0; fi
counts=$(grep -E '^=+ .* in [0-9.]+s' "$GPU_OUT/tests.txt" | tail -n 1 | tr -d '=' | xargs)
{
    echo
    echo "gpu-check: tests: exit $tests_rc (${counts:-no summary line}; 124 or 137: past $TEST_LIMIT s)"
    echo "gpu-check: benchmark: exit $bench_rc (124 or 137: past $BENCH_LIMIT s)"
    clocks after
    for name in $FILES; do  # check.txt is still being written
        [ -f "$GPU_OUT/$name" ] && [ "$name" != check.txt ] &&
            echo "gpu-check: wrote $name ($(wc -c <"$GPU_OUT/$name") bytes)"
    done
    echo "gpu-check: wrote check.txt (this summary)"
    echo "gpu-check: $(($(date +%s) - started)) s; exit $status"
} | tee -a "$summary"
exit "$status"
