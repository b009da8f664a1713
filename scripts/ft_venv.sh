#!/usr/bin/env bash
# Make (or reuse) the free-threaded test environment .venv-ft (VENV_FT).
#
# The interpreter comes from scripts/ft_python.sh. Installed, all as wheels where
# one exists (a numpy or pillow without a cp313t wheel would build from source
# for minutes):
#   - torch $TORCH_FT (default torch==2.12.0: the newest release with a cp313t
#     wheel; there is none for 2.13.0). From PyPI that is a CUDA build (~2.6 GB
#     with its dependencies); it runs on a CPU-only machine.
#   - the project (editable, no dependencies) and the test, dist and bench extras
#     that install on 3.13t. accelerate and datasets do not (safetensors and
#     hf_xet have no cp313t wheels, and their sources need Rust): their tests
#     skip. Optional ones are tried from wheels only (but pyyaml, which has no
#     cp313t wheel and builds from its source in seconds: lightning needs it),
#     and a failure is reported, not fatal.
# A stamp file records what was installed; an unchanged second run installs nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV_FT="${VENV_FT:-.venv-ft}"
TORCH_FT="${TORCH_FT:-torch==2.12.0}"
STAMP="$VENV_FT/.installed"

say() { echo "ft-venv: $*" >&2; }

py_ft="$(bash scripts/ft_python.sh)"

# Everything that decides what gets installed; a change reinstalls.
REQUIRED=(
    "pytest>=8" "pytest-timeout>=2.3" "hypothesis>=6.100" "numpy>=1.26,<2.5" "pillow>=10,<13"
    "prefetch_generator==1.0.3" "torchdata>=0.10" "build>=1.2"
)
OPTIONAL=("lightning>=2.6,<3" "matplotlib>=3.8" "spdl-core>=0.8" "accelerate>=1.15,<2" "datasets>=3")
want="$(printf '%s\n' "python: $py_ft" "torch: $TORCH_FT" "required: ${REQUIRED[*]}" \
    "optional: ${OPTIONAL[*]}" "setup.cfg: $(sha256sum setup.cfg | cut -c1-16)" \
    "this script: $(sha256sum "$0" | cut -c1-16)")"
if [ -f "$STAMP" ] && [ "$(sed -n '1,/^--$/p' "$STAMP" | sed '$d')" = "$want" ]; then
    say "$VENV_FT is up to date ($STAMP)"
    exit 0
fi

start=$SECONDS
rm -rf "$VENV_FT"
"$py_ft" -m venv "$VENV_FT"
pip=("$VENV_FT/bin/python" -m pip)
"${pip[@]}" install --quiet --upgrade pip
say "installing $TORCH_FT (a large download from PyPI: CUDA build)"
"${pip[@]}" install --quiet --prefer-binary "$TORCH_FT"
# Every later install keeps the torch just installed (an extra must not swap it).
constraints="$VENV_FT/constraints.txt"
"$VENV_FT/bin/python" -c 'import importlib.metadata as m; print("torch==" + m.version("torch"))' \
    >"$constraints"
say "installing the project and the test extras that have cp313t wheels"
"${pip[@]}" install --quiet --prefer-binary -c "$constraints" "${REQUIRED[@]}"
"${pip[@]}" install --quiet --no-deps -e .
skipped=()
for spec in "${OPTIONAL[@]}"; do
    if "${pip[@]}" install --quiet --only-binary :all: --no-binary pyyaml -c "$constraints" "$spec" >/dev/null 2>&1; then
        say "installed $spec"
    else
        say "not installed: $spec (no wheels for this interpreter; its tests skip)"
        skipped+=("$spec")
    fi
done
{
    echo "$want"
    echo "--"
    echo "not installed: ${skipped[*]:-none}"
    "$VENV_FT/bin/python" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__)'
} >"$STAMP"
say "$VENV_FT ready in $((SECONDS - start)) s: $(tail -n 1 "$STAMP")"
