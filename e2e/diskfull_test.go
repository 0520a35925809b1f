package e2e

import (
	"os"

	"cairn/engine"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// mountTmpfs mounts a tmpfs of size bytes at dir (needs root, as in CI).
func mountTmpfs(t *testing.T, dir string, size string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the disk-full test mounts a small tmpfs and needs root (CI runs as root): sudo go test ./e2e -run TestDiskFull")
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir).CombinedOutput(); err != nil {
		t.Fatalf("mount tmpfs: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", "-l", dir).Run() })
}

// fill writes a filler file until the filesystem is full but keep bytes.
func fill(t *testing.T, dir string, keep int64) string {
	t.Helper()
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	free := int64(st.Bavail) * int64(st.Bsize)
	p := filepath.Join(dir, "filler")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	for n := free - keep; n > 0; n -= int64(len(buf)) {
		if _, err := f.Write(buf[:min(int64(len(buf)), n)]); err != nil {
			break
		}
	}
	return p
}

// TestDiskFull runs the job on a data directory that fills up: the job
// stops (it cannot persist progress, so it acknowledges none: no
// checkpoint covers unpersisted state), and after space returns a restart
// ends with exact counts.
func TestDiskFull(t *testing.T) {
	needStorageFaults(t)
	h := newHarness(t, harnessConfig{store: "file", mode: "incremental", delivery: "exactly_once", interval: "100ms", retain: 2})
	if err := os.MkdirAll(h.data, 0o755); err != nil {
		t.Fatal(err)
	}
	mountTmpfs(t, h.data, "64m")
	h.publish(3000)
	h.runToEnd() // a first checkpointed state, with space
	filler := fill(t, h.data, 16<<10)
	h.publish(20000)
	cmd, done := h.start()
	// The job must stop or stall: whatever it could not persist it must not
	// acknowledge (no checkpoint covers it). Give it 15 s, then kill it.
	var st engine.Stats
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("cairn exited 0 on a full disk")
		}
		t.Logf("cairn stopped on the full disk: %v", err)
	case <-time.After(15 * time.Second):
		st, _ = h.stats()
		_ = cmd.Process.Kill()
		<-done
		t.Logf("cairn on a full disk after 15 s: consumed %d, processed %d, checkpoints %d (last at seq %d), failed %d; killed",
			st.ConsumedSeq, st.ProcessedSeq, st.Checkpoints, st.LastChkSeq, st.FailedChk)
	}
	if err := os.Remove(filler); err != nil { // space returns
		t.Fatal(err)
	}
	h.runToEnd()
	h.verify()
}
