#!/usr/bin/env bash
# Print the path of a free-threaded CPython (3.13t), obtaining one if needed.
#
# Order: $PYTHON_FT if set; else python3.13t on the PATH; else one built before
# into the cache folder; else build one there:
#   1. Debian trixie's python3.13 *source* package, fetched with
#      `apt-get source --download-only` under a separate apt state folder whose
#      only source list is derived at run time from this machine's own apt
#      configuration (the Debian mirror it already uses, suite trixie, deb-src).
#      Its .orig.tar.xz is the upstream Python-X.Y.Z.tar.xz byte for byte.
#   2. pyenv's python-build X.Y.Zt, offline: the tarball sits in
#      PYTHON_BUILD_CACHE_PATH under its upstream name, and python-build checks
#      it against the checksum in its own definition.
# The cache folder is outside the clone, so a fresh clone reuses it:
#   PREFETCH_FT_CACHE (default ${XDG_CACHE_HOME:-$HOME/.cache}/prefetch-ft).
# Progress goes to stderr; stdout is only the interpreter's path.
set -euo pipefail

CACHE="${PREFETCH_FT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/prefetch-ft}"

say() { echo "ft-python: $*" >&2; }
die() {
    say "error: $*"
    exit 1
}

# A free-threaded build says Py_GIL_DISABLED=1.
is_free_threaded() {
    [ -x "$1" ] || command -v "$1" >/dev/null 2>&1 || return 1
    [ "$("$1" -c 'import sysconfig; print(sysconfig.get_config_var("Py_GIL_DISABLED"))' 2>/dev/null)" = 1 ]
}

if [ -n "${PYTHON_FT:-}" ]; then
    is_free_threaded "$PYTHON_FT" || die "PYTHON_FT=$PYTHON_FT is not a free-threaded Python (Py_GIL_DISABLED is not 1)"
    command -v "$PYTHON_FT"
    exit 0
fi
if found="$(command -v python3.13t)" && is_free_threaded "$found"; then
    echo "$found"
    exit 0
fi
for built in "$CACHE"/python-*t/bin/python3.13t; do
    if is_free_threaded "$built"; then
        echo "$built"
        exit 0
    fi
done

# --- build one ---------------------------------------------------------------
say "no python3.13t found (PYTHON_FT unset, none on the PATH, none in $CACHE): building one"

python_build=""
for candidate in "$(command -v python-build || true)" \
    "${PYENV_ROOT:-$HOME/.pyenv}/plugins/python-build/bin/python-build" \
    "$HOME/.pyenv/plugins/python-build/bin/python-build"; do
    if [ -n "$candidate" ] && [ -x "$candidate" ]; then
        python_build="$candidate"
        break
    fi
done
[ -n "$python_build" ] || die "cannot build one either: pyenv's python-build is not installed
  (looked for python-build on the PATH and under \$PYENV_ROOT/plugins). Install a
  free-threaded CPython 3.13 and set PYTHON_FT=/path/to/python3.13t, or install pyenv."
command -v apt-get >/dev/null || die "cannot fetch the source: no apt-get (set PYTHON_FT=/path/to/python3.13t)"

# The Debian mirror this machine already uses: the first URI of a Debian archive
# (one serving a Debian suite, not the security archive) in its apt sources.
debian_mirror() {
    local etc="/etc/apt"
    {
        [ -f "$etc/sources.list" ] && awk '$1 == "deb" || $1 == "deb-src" {
            for (i = 2; i <= NF; i++) if ($i !~ /^\[/ && $i !~ /\]$/) { print $i, $(i + 1); break } }' "$etc/sources.list"
        for f in "$etc"/sources.list.d/*.list; do
            [ -f "$f" ] && awk '$1 == "deb" || $1 == "deb-src" {
                for (i = 2; i <= NF; i++) if ($i !~ /^\[/ && $i !~ /\]$/) { print $i, $(i + 1); break } }' "$f"
        done
        for f in "$etc"/sources.list.d/*.sources; do
            # deb822 stanzas: pair each URIs line with the Suites line of its stanza
            [ -f "$f" ] && awk 'BEGIN { RS = ""; FS = "\n" } {
                uri = ""; suite = ""
                for (i = 1; i <= NF; i++) {
                    if ($i ~ /^URIs:/) { split($i, a, /[ \t]+/); uri = a[2] }
                    if ($i ~ /^Suites:/) { split($i, b, /[ \t]+/); suite = b[2] }
                }
                if (uri != "") print uri, suite }' "$f"
        done
    } | awk '$2 ~ /^(bookworm|trixie|forky|sid|stable|testing|unstable|oldstable)(-updates)?$/ && $1 !~ /security/ { print $1; exit }'
}
mirror="$(debian_mirror)"
[ -n "$mirror" ] || die "no Debian archive found in /etc/apt's source lists to fetch trixie's python3.13 from
  (set PYTHON_FT=/path/to/python3.13t)"

keyring=/usr/share/keyrings/debian-archive-keyring.gpg
apt_dir="$CACHE/apt"
mkdir -p "$apt_dir/etc/sources.list.d" "$apt_dir/etc/preferences.d" "$apt_dir/lists/partial" \
    "$apt_dir/cache/archives/partial" "$CACHE/downloads"
cat >"$apt_dir/etc/sources.list.d/trixie.sources" <<SOURCES
Types: deb-src
URIs: $mirror
Suites: trixie
Components: main
Signed-By: $keyring
SOURCES
apt_opts=(
    -o "Dir::Etc::SourceList=/dev/null"
    -o "Dir::Etc::SourceParts=$apt_dir/etc/sources.list.d"
    -o "Dir::Etc::PreferencesParts=$apt_dir/etc/preferences.d"
    -o "Dir::State=$apt_dir"
    -o "Dir::State::Lists=$apt_dir/lists"
    -o "Dir::State::status=/dev/null"
    -o "Dir::Cache=$apt_dir/cache"
    -o "APT::Sandbox::User=root"
)
say "fetching Debian trixie's python3.13 source package (separate apt state in $apt_dir)"
start=$SECONDS
apt-get "${apt_opts[@]}" -qq update >&2 || die "apt-get update of trixie's source index failed"
(cd "$CACHE/downloads" && apt-get "${apt_opts[@]}" -q source --download-only python3.13 >&2) ||
    die "apt-get source --download-only python3.13 failed"
say "fetched in $((SECONDS - start)) s"

orig="$(ls -t "$CACHE"/downloads/python3.13_*.orig.tar.xz 2>/dev/null | head -n 1)"
[ -n "$orig" ] || die "the source package has no .orig.tar.xz"
version="$(basename "$orig" | sed -E 's/^python3\.13_([0-9.]+)\.orig\.tar\.xz$/\1/')"
[[ "$version" =~ ^3\.13\.[0-9]+$ ]] || die "unexpected source version in $(basename "$orig")"
definitions="$(dirname "$python_build")/../share/python-build"
[ -f "$definitions/${version}t" ] || die "this python-build has no definition for ${version}t (update pyenv)"
cp -f "$orig" "$CACHE/downloads/Python-$version.tar.xz"

prefix="$CACHE/python-${version}t"
say "building CPython ${version}t into $prefix with $python_build (a few minutes)"
start=$SECONDS
rm -rf "$prefix"
PYTHON_BUILD_CACHE_PATH="$CACHE/downloads" MAKE_OPTS="-j$(nproc)" \
    "$python_build" "${version}t" "$prefix" >&2 || die "python-build ${version}t failed"
say "built in $((SECONDS - start)) s"
is_free_threaded "$prefix/bin/python3.13t" || die "$prefix/bin/python3.13t is not free-threaded"
echo "$prefix/bin/python3.13t"
