package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestNewOperatorProject goes where a newcomer goes: cairn new operator,
// the project's own build script with the network off (GOPROXY=off, an
// empty module cache), then cairn test --restore-every on its input: the
// running sums are exact and restore-safe, and the bad record is a dead
// letter.
func TestNewOperatorProject(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "summer")
	var out, errb bytes.Buffer
	if err := cmdNew(context.Background(), []string{"operator", "summer", "--dir", dir}, &out, &errb); err != nil {
		t.Fatalf("%v\n%s", err, errb.String())
	}
	if err := cmdNew(context.Background(), []string{"operator", "summer", "--dir", dir}, &out, &errb); err == nil {
		t.Fatal("cairn new wrote into a folder that is not empty")
	}
	build := exec.Command("./build.sh")
	build.Dir = dir
	build.Env = append(os.Environ(), "GOPROXY=off", "GOWORK=off", "GOMODCACHE="+t.TempDir(), "GOFLAGS=")
	if b, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build.sh offline: %v\n%s", err, b)
	}
	out.Reset()
	errb.Reset()
	err := cmdTest(context.Background(), []string{"--job", filepath.Join(dir, "job.yaml"), "--input", filepath.Join(dir, "input.jsonl"), "--restore-every", "3"}, &out, &errb)
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
	if err := cmdNew(context.Background(), []string{"operator", "x", "--lang", "rust", "--dir", t.TempDir()}, &out, &errb); err == nil {
		t.Error("--lang rust accepted")
	}
}
