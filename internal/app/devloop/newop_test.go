package devloop

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"cairn/internal/testutil/langtool"
)

// TestNewOperatorProject goes where a newcomer goes: cairn new operator,
// the project's own build script with the network off (GOPROXY=off, an
// empty module cache), then cairn test --restore-every on its input: the
// running sums are exact and restore-safe, and the bad record is a dead
// letter.
func TestNewOperatorProject(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "summer")
	var out, errb bytes.Buffer
	if err := NewCommand(context.Background(), []string{"operator", "summer", "--dir", dir}, &out, &errb); err != nil {
		t.Fatalf("%v\n%s", err, errb.String())
	}
	if err := NewCommand(context.Background(), []string{"operator", "summer", "--dir", dir}, &out, &errb); err == nil {
		t.Fatal("cairn new wrote into a folder that is not empty")
	}
	buildAndTestProject(t, dir, "GOPROXY=off", "GOWORK=off", "GOMODCACHE="+t.TempDir(), "GOFLAGS=")
	if err := NewCommand(context.Background(), []string{"operator", "x", "--lang", "cobol", "--dir", t.TempDir()}, &out, &errb); err == nil {
		t.Error("--lang cobol accepted")
	}
}

// TestNewOperatorProjectRust is TestNewOperatorProject for --lang rust:
// the project builds with rustc alone (Debian's rustc and
// libstd-rust-dev-wasm32; no cargo, no crates, no network).
func TestNewOperatorProjectRust(t *testing.T) {
	if err := langtool.Rust(); err != nil {
		t.Skip("the Rust toolchain is missing: " + err.Error())
	}
	newLangProject(t, "rust", "lib.rs", "cairn-sdk/cairn.rs")
}

// TestNewOperatorProjectC is TestNewOperatorProject for --lang c: the
// project builds with clang, lld and wasi-libc alone.
func TestNewOperatorProjectC(t *testing.T) {
	if err := langtool.C(); err != nil {
		t.Skip("the C toolchain is missing: " + err.Error())
	}
	newLangProject(t, "c", "summer.c", "cairn-sdk/cairn.h", "cairn-sdk/cairn.c")
}

func newLangProject(t *testing.T, lang string, files ...string) {
	dir := filepath.Join(t.TempDir(), "summer")
	var out, errb bytes.Buffer
	if err := NewCommand(context.Background(), []string{"operator", "summer", "--lang", lang, "--dir", dir}, &out, &errb); err != nil {
		t.Fatalf("%v\n%s", err, errb.String())
	}
	for _, f := range append(files, "build.sh", "job.yaml", "input.jsonl", "README.md") {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("the %s project has no %s", lang, f)
		}
	}
	buildAndTestProject(t, dir)
}

// buildAndTestProject runs the project's build.sh (with env added), then
// cairn test --restore-every 3 on its input, and checks the running sums
// and the dead letter.
func buildAndTestProject(t *testing.T, dir string, env ...string) {
	t.Helper()
	build := exec.Command("./build.sh")
	build.Dir = dir
	build.Env = append(os.Environ(), env...)
	if b, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build.sh offline: %v\n%s", err, b)
	}
	var out, errb bytes.Buffer
	err := TestCommand(context.Background(), []string{"--job", filepath.Join(dir, "job.yaml"), "--input", filepath.Join(dir, "input.jsonl"), "--restore-every", "3"}, &out, &errb)
	if err != nil {
		t.Fatalf("%v\n%s", err, errb.String())
	}
	got := map[string][]string{}
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var o testOutput
		if err := json.Unmarshal([]byte(l), &o); err != nil {
			t.Fatal(err)
		}
		got[o.Key] = append(got[o.Key], o.Value)
	}
	want := map[string]string{"a": "1 3 6", "b": "5 4", "c": "7"}
	for k, v := range want {
		if strings.Join(got[k], " ") != v {
			t.Errorf("key %s: sums %v, want %s", k, got[k], v)
		}
	}
	if !strings.Contains(errb.String(), "dead letter: seq 4") || !strings.Contains(errb.String(), "identical to an uninterrupted run") {
		t.Errorf("no dead letter or restore summary:\n%s", errb.String())
	}
}

// TestNewOperatorProjectAS is TestNewOperatorProject for --lang as: the
// project builds with the AssemblyScript compiler alone.
func TestNewOperatorProjectAS(t *testing.T) {
	if err := langtool.AS(); err != nil {
		t.Skip("the AssemblyScript toolchain is missing: " + err.Error())
	}
	newLangProject(t, "as", "summer.ts", "cairn-sdk/cairn.ts")
}
