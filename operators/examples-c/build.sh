#!/bin/sh
# Builds the C examples with Debian's clang, lld, wasi-libc and
# libclang-rt-14-dev-wasm32: no network.
# Usage: build.sh [OUTDIR]   (default: each example's folder)
set -eu
cd "$(dirname "$0")"
for ex in count split window_count count_first_seen; do
  out="$ex/$ex.wasm"
  [ -n "${1:-}" ] && out="$1/$ex.wasm"
  # An example with a migration (cairn_upgrade.h) links its exports too.
  upgrade=""
  grep -q cairn_upgrade.h "$ex/$ex.c" && upgrade=../sdk-c/cairn_upgrade.c
  ${CC:-clang} --target=wasm32-wasi -mexec-model=reactor -O2 -Wall -Wextra -I ../sdk-c \
    -Wl,--strip-all -o "$out" "$ex/$ex.c" ../sdk-c/cairn.c $upgrade
  echo "built $out"
done
