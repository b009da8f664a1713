#!/usr/bin/env bash
# make stress-ft: the concurrency tests, RUNS times in a row (default 30), on
# free-threaded CPython 3.13t with the GIL off; one line per run, a log per run
# and a summary in STRESS_OUT (default runs/stress-ft/), exit 1 if any run failed.
# Rerun it after changing the engine. FILES overrides the test files.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS="${RUNS:-30}"
OUT="${STRESS_OUT:-runs/stress-ft}"
FILES="${FILES:-tests/test_engine_wakeups.py tests/test_release.py tests/test_parallel_fetch.py
    tests/test_parallel_fetch_lifetime.py tests/test_model_based.py tests/test_faults*.py
    tests/test_background.py tests/test_adaptive_loader.py tests/test_torch_guard.py
    tests/test_out_of_order.py}"
bash scripts/ft_venv.sh
export PYTHON_GIL=0
mkdir -p "$OUT"
summary="$OUT/summary.txt"
: >"$summary"
failed_runs=0
for run in $(seq 1 "$RUNS"); do
    log="$OUT/run-$run.log"
    start=$SECONDS
    # shellcheck disable=SC2086  # FILES is a list of paths and globs
    if "${VENV_FT:-.venv-ft}/bin/python" -m pytest -p no:randomly -p no:cacheprovider -q $FILES \
        ${PYTEST_ARGS:-} >"$log" 2>&1; then
        status=ok
    else
        status=FAILED
        failed_runs=$((failed_runs + 1))
    fi
    line="run $run/$RUNS $status in $((SECONDS - start)) s: $(tail -n 1 "$log")"
    echo "$line" | tee -a "$summary"
    if [ "$status" = FAILED ]; then
        grep -E '^(FAILED|ERROR) ' "$log" | sed 's/^/    /' | tee -a "$summary" || true
    fi
done
echo "stress-ft: $((RUNS - failed_runs)) of $RUNS runs passed (logs in $OUT)" | tee -a "$summary"
if [ "$failed_runs" -gt 0 ]; then  # runs in which each failing test failed, by file
    grep -h -E '^(FAILED|ERROR) ' "$OUT"/run-*.log | cut -d' ' -f2 | sed 's/ - .*//' | sort | uniq -c |
        sed 's/^/    failed in runs: /' | tee -a "$summary"
fi
[ "$failed_runs" -eq 0 ]
