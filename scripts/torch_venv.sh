#!/usr/bin/env bash
# Make (or reuse) .venv-torch-VERSION: Python 3.11, torch==VERSION, the project
# (editable) and its test extras, for `make test-torch-range`.
#
#   bash scripts/torch_venv.sh 2.6.0
#
# torch comes from PyPI, past this machine's pip configuration: /etc/xdg/pip caps
# torch at the releases stored on disk (torch<=2.14.1), and that cap must not
# apply here (PIP_CONFIG_FILE=/dev/null, for these venvs only; the rest of the
# project keeps the configuration). From PyPI a Linux torch is the CUDA build
# (2.5-4 GB with its nvidia packages); it runs on a CPU-only machine.
# Every later install is constrained to the torch just installed, so no extra
# can swap it. Test extras that cannot install beside this torch are reported
# and left out (their tests skip); the stamp file names them.
# A stamp file (.venv-torch-VERSION/.installed) records what was installed; an
# unchanged second run installs nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

version="${1:?usage: torch_venv.sh TORCH_VERSION (e.g. 2.6.0)}"
venv=".venv-torch-$version"
stamp="$venv/.installed"
python="${PYTHON:-$(command -v python3.11 || command -v python3)}"

say() { echo "torch-venv $version: $*" >&2; }

# What every venv needs to run the quick suite, and the extras whose tests skip without them.
# (The test, bench and dist extras of setup.cfg, and docutils, which one bench test reads
# the docs with; test_bench_*.py import pillow and matplotlib.)
REQUIRED=("pytest>=8" "pytest-timeout>=2.3" "hypothesis>=6.100" "numpy>=1.26" "pillow>=10"
    "matplotlib>=3.8" "prefetch_generator==1.0.3" "build>=1.2" "docutils")
OPTIONAL=("torchdata>=0.10" "lightning>=2.6,<3" "accelerate>=1.15,<2" "datasets>=3" "spdl-core>=0.8")
want="$(printf '%s\n' "python: $python" "torch: $version" "required: ${REQUIRED[*]}" \
    "optional: ${OPTIONAL[*]}" "setup.cfg: $(sha256sum setup.cfg | cut -c1-16)" \
    "this script: $(sha256sum "$0" | cut -c1-16)")"
if [ -f "$stamp" ] && [ "$(sed -n '1,/^--$/p' "$stamp" | sed '$d')" = "$want" ]; then
    say "$venv is up to date ($(tail -n 1 "$stamp"))"
    exit 0
fi

export PIP_CONFIG_FILE=/dev/null PIP_CONSTRAINT= PIP_DISABLE_PIP_VERSION_CHECK=1
start=$SECONDS
rm -rf "$venv"
"$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip)
"${pip[@]}" install --quiet --upgrade pip
say "installing torch==$version from PyPI (the CUDA build: a large download)"
"${pip[@]}" install --quiet --no-cache-dir --prefer-binary "torch==$version"
constraints="$venv/constraints.txt"
echo "torch==$version" >"$constraints"
"${pip[@]}" install --quiet --prefer-binary -c "$constraints" "${REQUIRED[@]}"
"${pip[@]}" install --quiet --no-deps -e .
skipped=()
for spec in "${OPTIONAL[@]}"; do
    if "${pip[@]}" install --quiet --prefer-binary -c "$constraints" "$spec" >"$venv/pip-$$.log" 2>&1; then
        say "installed $spec"
    else
        say "not installed: $spec (cannot install beside torch $version; its tests skip)"
        tail -n 3 "$venv/pip-$$.log" | sed 's/^/    /' >&2
        skipped+=("$spec")
    fi
    rm -f "$venv/pip-$$.log"
done
installed="$("$venv/bin/python" -c 'import torch; print(torch.__version__)')"
if [ "${installed%%+*}" != "$version" ]; then
    say "torch $installed was installed, not $version"
    exit 1
fi
{
    echo "$want"
    echo "--"
    echo "not installed: ${skipped[*]:-none}"
    "$venv/bin/python" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__)'
} >"$stamp"
say "$venv ready in $((SECONDS - start)) s: $(tail -n 1 "$stamp")"
