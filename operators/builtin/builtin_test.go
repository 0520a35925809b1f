package builtin

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
)

func TestNames(t *testing.T) {
	want := []string{"count", "dedupe", "interval_join", "lookup_join", "nexmark", "rekey", "session_count", "sliding_count", "split", "threshold", "top_n", "trap", "union", "window_count"}
	if got := Names(); !slices.Equal(got, want) {
		t.Fatalf("Names() = %v, want %v", got, want)
	}
	for _, n := range want {
		if b, ok := Lookup(n); !ok || !bytes.HasPrefix(b, []byte("\x00asm")) {
			t.Fatalf("Lookup(%q) = %d bytes, %v", n, len(b), ok)
		}
	}
	if _, ok := Lookup("../builtin"); ok {
		t.Fatal("Lookup accepted a path")
	}
}

// TestBuiltinsUpToDate rebuilds every example from source and fails if an
// embedded module differs: run `go generate ./operators/builtin` to fix.
func TestBuiltinsUpToDate(t *testing.T) {
	if testing.Short() {
		t.Skip("builds every example operator")
	}
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go toolchain")
	}
	dir := t.TempDir()
	cmd := exec.Command("sh", "build.sh", dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build.sh: %v\n%s", err, out)
	}
	for _, n := range Names() {
		fresh, err := os.ReadFile(filepath.Join(dir, n+".wasm"))
		if err != nil {
			t.Fatal(err)
		}
		embedded, _ := Lookup(n)
		if !bytes.Equal(fresh, embedded) {
			t.Errorf("%s.wasm is stale (or the build is not deterministic): run `go generate ./operators/builtin`", n)
		}
	}
	// Every example must be embedded.
	srcs, _ := filepath.Glob("../examples/*")
	if len(srcs) != len(Names()) {
		t.Errorf("%d examples, %d embedded", len(srcs), len(Names()))
	}
}
