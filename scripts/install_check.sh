#!/usr/bin/env bash
# Installs a build into a throwaway prefix, then builds the examples as an outside project
# against it, through find_package(Tandem) and through pkg-config, and runs them on a tiny
# synthetic model.
#   scripts/install_check.sh [BUILD_DIR]   (default: build/$TANDEM_PRESET, already built)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
build="${1:-build/$TANDEM_PRESET}"
work=$(mktemp -d "${TMPDIR:-/tmp}/tandem-install-check.XXXXXX")
trap 'rm -rf "$work"' EXIT
prefix="$work/prefix"

cmake --install "$build" --prefix "$prefix" >"$work/install.log"
libdir=$(dirname "$(find "$prefix" -name libtandem.so -print -quit)")
for f in include/tandem.h include/tandem/runtime.h bin/tandem; do
  [[ -e "$prefix/$f" ]] || { echo "install_check: $f was not installed" >&2; exit 1; }
done
for f in libtandem.so cmake/Tandem/TandemConfig.cmake pkgconfig/tandem.pc; do
  [[ -e "$libdir/$f" ]] || { echo "install_check: $f was not installed" >&2; exit 1; }
done

"$prefix/bin/tandem" synth --preset tiny --type q8_0 --seed 1 -t 1 -o "$work/tiny.gguf" \
  >/dev/null
# The outside project: the examples folder on its own, finding only the installed package.
cmake -S examples -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix" >"$work/configure.log"
cmake --build "$work/build" >"$work/build.log" || { cat "$work/build.log" >&2; exit 1; }
PKG_CONFIG_PATH="$libdir/pkgconfig" pkg-config --exists tandem
# shellcheck disable=SC2046
cc -std=c11 -Wall -Wextra -Werror examples/generate.c \
  $(PKG_CONFIG_PATH="$libdir/pkgconfig" pkg-config --cflags --libs tandem) -o "$work/generate-pc"

for example in "$work/build/tandem-generate-c" "$work/build/tandem-generate-cpp" \
               "$work/generate-pc"; do
  out=$("$example" "$work/tiny.gguf" "hello" 8 cpu 2>"$work/stderr.log") ||
    { cat "$work/stderr.log" >&2; echo "install_check: $example failed" >&2; exit 1; }
  [[ "$out" == hello* ]] || { echo "install_check: $example printed '$out'" >&2; exit 1; }
  grep -q "placement" "$work/stderr.log" ||
    { echo "install_check: $example reported no placement" >&2; exit 1; }
done
echo "install_check: installed to a throwaway prefix; the C and C++ examples built with" \
     "find_package(Tandem) and pkg-config and ran"
