#!/bin/sh
# Builds the AssemblyScript examples with asc (npm package assemblyscript,
# installed globally or in ./node_modules): no network.
# Usage: build.sh [OUTDIR]   (default: each example's folder)
set -eu
cd "$(dirname "$0")"
ASC=asc
command -v asc >/dev/null 2>&1 || ASC="npx --no-install asc"
for ex in count split window_count count_first_seen; do
  out="$PWD/$ex/$ex.wasm"
  [ -n "${1:-}" ] && out="$(cd "$1" && pwd)/$ex.wasm"
  (cd "$ex" && $ASC "$ex.ts" --outFile "$out" --optimize --exportStart _initialize --runtime minimal \
    --use abort=../../sdk-as/cairn/cairnAbort)
  echo "built $out"
done
