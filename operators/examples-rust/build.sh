#!/bin/sh
# Builds the Rust examples with Debian's rustc and libstd-rust-dev-wasm32
# (target wasm32-wasi): no cargo, no crates, no network.
# Usage: build.sh [OUTDIR]   (default: each example's folder)
set -eu
cd "$(dirname "$0")"
. ../sdk-rust/rustc.sh
for ex in count split window_count count_first_seen; do
  out="$ex/$ex.wasm"
  [ -n "${1:-}" ] && out="$1/$ex.wasm"
  cairn_rustc -o "$out" "$ex/lib.rs"
  echo "built $out"
done
