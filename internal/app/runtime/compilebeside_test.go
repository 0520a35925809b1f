package runtime

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"cairn/wasm"
)

// TestStartRefusesAnInvalidModuleCompiledBeside: a module that is not
// WebAssembly passes the checks that need no compile, so it compiles
// beside the start (the embedded server starts meanwhile); Start still
// refuses it with the compile's error, and returns no running job.
func TestStartRefusesAnInvalidModuleCompiledBeside(t *testing.T) {
	dir := t.TempDir()
	mod := filepath.Join(dir, "op.wasm")
	if err := os.WriteFile(mod, []byte("\x00asm\x01\x00\x00\x00not a module"), 0o644); err != nil {
		t.Fatal(err)
	}
	j := parseJob(t, filepath.Join(dir, "data"), "")
	j.NATS = "embedded"
	j.Stages[0].Module = mod
	err := startWithin(t, 30*time.Second, j)
	if !errors.Is(err, wasm.ErrInvalidModule) {
		t.Fatalf("got %v, want wasm.ErrInvalidModule", err)
	}
	if !strings.HasPrefix(err.Error(), "stages[0].module: ") {
		t.Fatalf("got %q, want the compile's error naming stages[0].module", err)
	}
}
