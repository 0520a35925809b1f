package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestImportedSavepointRunsOn: a running job's savepoint (taken at its
// graceful stop, exactly-once delivery), exported with `cairn state export`
// and imported back as another savepoint with `cairn state import`, is what
// `cairn run --restore savepoint:NAME` starts from on another slot count,
// with a real NATS server: every count goes on exactly (the engine's output
// counters travel through the JSON lines too, or the sink would publish
// duplicates or skip outputs).
func TestImportedSavepointRunsOn(t *testing.T) {
	h := newHarness(t, harnessConfig{store: "file", mode: "incremental", delivery: "exactly_once", interval: "100ms", slots: 2})
	h.publish(3000)
	h.args = []string{"--savepoint-on-stop", "before"}
	h.runToEnd()

	file := filepath.Join(t.TempDir(), "state.jsonl")
	cairn := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(h.bin, append(args, "--store", h.store, "--job", "killed")...)
		cmd.Env = append(os.Environ(), h.env...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("cairn %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	t.Log(cairn("state", "export", "--checkpoint", "savepoint:before", "--out", file))
	t.Log(cairn("state", "import", "--savepoint", "copy", "--in", file))
	if out := cairn("state", "diff", "savepoint:before", "savepoint:copy"); !strings.Contains(out, "hold the same state") {
		t.Fatalf("the imported savepoint differs from the exported one:\n%s", out)
	}

	h.publish(3000)
	h.args = []string{"--restore", "savepoint:copy", "--slots", "3"}
	h.runToEnd()
	if !strings.Contains(h.logs.String(), `"savepoint":"copy"`) && !strings.Contains(h.logs.String(), "savepoint=copy") {
		t.Fatalf("the second run did not restore savepoint copy:\n%s", tail(h.logs.String(), 4000))
	}
	h.cfg.slots = 3 // the local state is now the 3 slots'
	h.verify()
}
