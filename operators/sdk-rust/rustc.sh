# cairn_rustc ARGS...: runs rustc for a cairn operator: a cdylib (reactor)
# for WASI, optimized and stripped. It picks the first of $RUSTC, rustc
# and /usr/bin/rustc (Debian's, with libstd-rust-dev-wasm32) whose sysroot
# has the wasm32-wasi or wasm32-wasip1 standard library.
cairn_rustc() {
  for r in "${RUSTC:-}" rustc /usr/bin/rustc; do
    [ -n "$r" ] && command -v "$r" >/dev/null 2>&1 || continue
    sysroot=$("$r" --print sysroot 2>/dev/null) || continue
    for t in wasm32-wasip1 wasm32-wasi; do
      if [ -d "$sysroot/lib/rustlib/$t/lib" ]; then
        "$r" --edition 2021 --crate-type cdylib --target "$t" -C opt-level=3 -C panic=abort \
          -C lto -C codegen-units=1 -C strip=symbols "$@"
        return
      fi
    done
  done
  echo "no rustc with the wasm32-wasi standard library: apt-get install rustc libstd-rust-dev-wasm32" >&2
  return 1
}
