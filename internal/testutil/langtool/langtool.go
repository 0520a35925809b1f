// Package langtool finds the toolchains of the Rust, C and AssemblyScript
// operator SDKs (operators/sdk-rust, sdk-c, sdk-as) for tests, which skip
// with the returned error's message when one is missing. .ci/run installs
// them.
package langtool

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Rust returns nil when a rustc with the wasm32-wasi (or wasm32-wasip1)
// standard library is there: $RUSTC, rustc or Debian's /usr/bin/rustc, as
// operators/sdk-rust/rustc.sh looks for it.
func Rust() error {
	for _, r := range []string{os.Getenv("RUSTC"), "rustc", "/usr/bin/rustc"} {
		if r == "" {
			continue
		}
		out, err := exec.Command(r, "--print", "sysroot").Output()
		if err != nil {
			continue
		}
		root := strings.TrimSpace(string(out))
		for _, t := range []string{"wasm32-wasip1", "wasm32-wasi"} {
			if st, err := os.Stat(filepath.Join(root, "lib", "rustlib", t, "lib")); err == nil && st.IsDir() {
				return nil
			}
		}
	}
	return errors.New("no rustc with the wasm32-wasi standard library (apt-get install rustc libstd-rust-dev-wasm32)")
}

// C returns nil when $CC (default clang) links a WASI reactor module.
func C() error {
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "clang"
	}
	if _, err := exec.LookPath(cc); err != nil {
		return errors.New("no clang (apt-get install clang lld wasi-libc libclang-rt-14-dev-wasm32)")
	}
	dir, err := os.MkdirTemp("", "langtool-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	src := filepath.Join(dir, "probe.c")
	if err := os.WriteFile(src, []byte("#include <stdlib.h>\nvoid *probe(int n) { return malloc(n); }\n"), 0o644); err != nil {
		return err
	}
	if out, err := exec.Command(cc, "--target=wasm32-wasi", "-mexec-model=reactor", "-O2", "-o", filepath.Join(dir, "probe.wasm"), src).CombinedOutput(); err != nil {
		return errors.New("clang cannot build for wasm32-wasi (apt-get install clang lld wasi-libc libclang-rt-14-dev-wasm32): " + strings.SplitN(string(out), "\n", 2)[0])
	}
	return nil
}

// AS returns nil when the AssemblyScript compiler asc (npm package
// assemblyscript) is on the PATH.
func AS() error {
	if err := exec.Command("asc", "--version").Run(); err != nil {
		return errors.New("no asc (npm install -g assemblyscript@0.28.20): " + err.Error())
	}
	return nil
}
