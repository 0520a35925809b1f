#!/bin/sh
# Builds the C examples with Debian's clang, lld, wasi-libc and
# libclang-rt-14-dev-wasm32: no network.
# Usage: build.sh [OUTDIR]   (default: each example's folder)
set -eu
cd "$(dirname "$0")"
for ex in count split window_count; do
  out="$ex/$ex.wasm"
  [ -n "${1:-}" ] && out="$1/$ex.wasm"
  ${CC:-clang} --target=wasm32-wasi -mexec-model=reactor -O2 -Wall -Wextra -I ../sdk-c \
    -Wl,--strip-all -o "$out" "$ex/$ex.c" ../sdk-c/cairn.c
  echo "built $out"
done
