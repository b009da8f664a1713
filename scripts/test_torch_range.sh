#!/usr/bin/env bash
# make test-torch-range: the quick suite (pytest -m "not slow") on each torch of
# TORCH_RANGE (default: 2.6.0, the oldest the README claims, and 2.15.0, the newest
# on PyPI when this was written), each in its own .venv-torch-VERSION made (or
# reused) by scripts/torch_venv.sh. Every version runs even if an earlier one
# failed; the exit status is 1 if any did. One summary line per version at the end.
# It also says when PyPI serves a torch newer than the newest in TORCH_RANGE.
# PYTEST_ARGS passes arguments to pytest.
set -uo pipefail
cd "$(dirname "$0")/.."
TORCH_RANGE="${TORCH_RANGE:-2.6.0 2.15.0}"
summary=()
failed=0
for version in $TORCH_RANGE; do
    start=$SECONDS
    if ! bash scripts/torch_venv.sh "$version"; then
        summary+=("torch $version: the venv could not be made")
        failed=1
        continue
    fi
    made=$((SECONDS - start))
    log=".venv-torch-$version/pytest.log"
    # shellcheck disable=SC2086  # PYTEST_ARGS is a list of arguments
    ".venv-torch-$version/bin/python" -m pytest -p no:cacheprovider -m "not slow" -q \
        ${PYTEST_ARGS:-} 2>&1 | tee "$log" | grep -E '^(FAILED|ERROR)|^[0-9]+ (passed|failed)'
    status=${PIPESTATUS[0]}
    [ "$status" -eq 0 ] || failed=1
    summary+=("torch $version: $(tail -n 1 "$log" | tr -d '=') (venv ${made} s, exit $status)")
done
newest="$(PIP_CONFIG_FILE=/dev/null python3 -m pip index versions torch 2>/dev/null |
    sed -n 's/^torch (\(.*\))$/\1/p')"
newest_tested="$(printf '%s\n' $TORCH_RANGE | sort -V | tail -n 1)"
if [ -n "$newest" ] && [ "$(printf '%s\n' "$newest" "$newest_tested" | sort -V | tail -n 1)" != "$newest_tested" ]; then
    summary+=("note: PyPI serves torch $newest, newer than $newest_tested: TORCH_RANGE=\"... $newest\"")
fi
printf 'test-torch-range: %s\n' "${summary[@]}"
exit "$failed"
