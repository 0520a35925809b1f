package devloop

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"cairn/operators/builtin"
)

// TestBuildCommand: cairn build runs a project's build script and checks
// the module it wrote (language, interface, the sha256 line to pin it);
// cairn build FILE.wasm checks a module; a module that is not an operator is
// refused with the reason.
func TestBuildCommand(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "summer")
	if err := NewCommand(context.Background(), []string{"operator", "summer", "--dir", dir}, &bytes.Buffer{}, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	t.Setenv("GOFLAGS", "")
	var out, errb bytes.Buffer
	if err := BuildCommand(context.Background(), []string{dir}, &out, &errb); err != nil {
		t.Fatalf("%v\n%s", err, errb.String())
	}
	for _, want := range []string{"summer.wasm", "Go", "cairn_v2.state_get", "cairn_process", "pin it in the job file's stage: sha256: "} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("no %q in\n%s", want, out.String())
		}
	}
	count, _ := builtin.Lookup("count")
	f := filepath.Join(t.TempDir(), "count.wasm")
	os.WriteFile(f, count, 0o644)
	out.Reset()
	if err := BuildCommand(context.Background(), []string{f}, &out, &errb); err != nil || !strings.Contains(out.String(), "sha256: ") {
		t.Fatalf("checking count.wasm: %v\n%s", err, out.String())
	}
	bad := filepath.Join(t.TempDir(), "bad.wasm")
	os.WriteFile(bad, []byte("\x00asm\x01\x00\x00\x00"), 0o644) // an empty module: no exports
	if err := BuildCommand(context.Background(), []string{bad}, &out, &errb); err == nil || !strings.Contains(err.Error(), "does not follow the cairn ABI") {
		t.Fatalf("an empty module passed: %v", err)
	}
}
