#!/usr/bin/env bash
# make test-torch-range: the quick suite (pytest -m "not slow") on each torch of
# TORCH_RANGE (default: 2.6.0, the oldest the README claims, and 2.15.0, the newest
# on PyPI when this was written), each in its own .venv-torch-VERSION made (or
# reused) by scripts/torch_venv.sh. Every version runs even if an earlier one
# failed; the exit status is 1 if any did. One summary line per version at the end.
# It also says when PyPI serves a torch newer than the newest in TORCH_RANGE.
# PYTEST_ARGS passes arguments to pytest.
#
# Disk: a torch from PyPI is the CUDA build, about 6 GB in its venv and 9 GB while pip
# installs it (NEED_GB). Before making a venv the script checks the free space:
# short of NEED_GB it says how much is free and fails that version, or, with
# SKIP_IF_NO_SPACE=1 (CI, whose machine's disk is not ours to size), says so and
# skips it. KEEP_VENVS=0 removes each venv once its tests ran, so only one is on
# disk at a time (CI; by default they stay, to be reused).
set -uo pipefail
cd "$(dirname "$0")/.."
TORCH_RANGE="${TORCH_RANGE:-2.6.0 2.15.0}"
NEED_GB="${NEED_GB:-10}"
KEEP_VENVS="${KEEP_VENVS:-1}"
SKIP_IF_NO_SPACE="${SKIP_IF_NO_SPACE:-0}"
summary=()
failed=0
for version in $TORCH_RANGE; do
    start=$SECONDS
    free_gb="$(df --output=avail -BG . | tail -n 1 | tr -dc 0-9)"
    if [ ! -f ".venv-torch-$version/.installed" ] && [ "$free_gb" -lt "$NEED_GB" ]; then
        why="not tested: ${free_gb} GB free here, the CUDA build of torch needs about ${NEED_GB} GB"
        if [ "$SKIP_IF_NO_SPACE" = 1 ]; then
            summary+=("torch $version: SKIPPED, $why")
        else
            summary+=("torch $version: $why (SKIP_IF_NO_SPACE=1 skips instead of failing)")
            failed=1
        fi
        continue
    fi
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
    if [ "$KEEP_VENVS" = 0 ]; then
        rm -rf ".venv-torch-$version"
    fi
done
newest="$(PIP_CONFIG_FILE=/dev/null python3 -m pip index versions torch 2>/dev/null |
    sed -n 's/^torch (\(.*\))$/\1/p')"
newest_tested="$(printf '%s\n' $TORCH_RANGE | sort -V | tail -n 1)"
if [ -n "$newest" ] && [ "$(printf '%s\n' "$newest" "$newest_tested" | sort -V | tail -n 1)" != "$newest_tested" ]; then
    summary+=("note: PyPI serves torch $newest, newer than $newest_tested: TORCH_RANGE=\"... $newest\"")
fi
printf 'test-torch-range: %s\n' "${summary[@]}"
exit "$failed"
