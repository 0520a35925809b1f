#!/bin/sh
# Rebuilds the embedded example operators from operators/examples/*.
# The build must be deterministic: TestBuiltinsUpToDate rebuilds each one
# and compares. Usage: operators/builtin/build.sh [outdir] (default: this dir).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here}
for dir in "$here"/../examples/*/; do
	name=$(basename "$dir")
	(cd "$dir" && GOOS=wasip1 GOARCH=wasm CGO_ENABLED=0 go build -buildmode=c-shared \
		-trimpath -buildvcs=false -ldflags='-s -w' -o "$out/$name.wasm" .)
done
# The embedded copies are compressed (pack): only when building into this
# folder; TestBuiltinsUpToDate builds into a temporary one and compares the
# modules themselves.
if [ "$out" = "$here" ]; then
	(cd "$here" && go run ./pack .)
fi
