package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"cairn/checkpoint"
	"cairn/internal/testutil/wait"
)

// TestSavepointCommandAndStandbyFailover drives the commands as a user
// would, with the built binary: `cairn savepoint` on a running job through
// its HTTP control endpoint; `cairn standby` following the store; SIGKILL of
// the primary; `cairn run --standby-cache` on a fresh data directory takes
// the files from the standby's cache and downloads only what it lacks, and
// the job ends exact.
func TestSavepointCommandAndStandbyFailover(t *testing.T) {
	h := newHarness(t, harnessConfig{store: "file", mode: "incremental", delivery: "exactly_once", interval: "200ms", retain: 3})
	h.publish(4000)
	primary, primaryDone := h.start()
	defer func() { _ = primary.Process.Kill() }()
	wait.Until(t, 90*time.Second, "the primary to process its input and take 2 checkpoints", func() error {
		if st, ok := h.stats(); ok && st.ProcessedSeq >= uint64(h.n) && st.Checkpoints >= 2 {
			return nil
		}
		return fmt.Errorf("no progress\n%s", tail(h.logs.String(), 4000))
	})

	// cairn savepoint, through the HTTP control endpoint.
	out, err := exec.Command(h.bin, "savepoint", "--http", h.httpAddr, "--name", "before-failover").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "committed") {
		t.Fatalf("cairn savepoint: %v\n%s", err, out)
	}
	ctx := context.Background()
	s, err := checkpoint.OpenStore(ctx, h.store)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	if _, err := checkpoint.LoadSavepoint(ctx, s, "killed", "before-failover"); err != nil {
		t.Fatalf("the savepoint is not in the store: %v", err)
	}

	// cairn standby follows the store into its cache.
	cache := filepath.Join(t.TempDir(), "cache")
	var sbOut syncBuffer
	standby := exec.Command(h.bin, "standby", "--job", h.jobFile, "--store", h.store, "--cache", cache, "--poll", "100ms", "--report", "200ms")
	standby.Env = append(os.Environ(), h.env...)
	standby.Stdout, standby.Stderr = &sbOut, &sbOut
	if err := standby.Start(); err != nil {
		t.Fatal(err)
	}
	synced := regexp.MustCompile(`standby: synced checkpoint ([1-9][0-9]*), latest ([0-9]+), 0 checkpoints`)
	wait.Until(t, 90*time.Second, "the standby to catch up", func() error {
		if synced.MatchString(sbOut.String()) {
			return nil
		}
		return fmt.Errorf("not synced\n%s", sbOut.String())
	})

	// The primary dies; the standby stops; more input arrives.
	_ = primary.Process.Signal(syscall.SIGKILL)
	<-primaryDone
	_ = standby.Process.Signal(syscall.SIGTERM)
	if err := standby.Wait(); err != nil {
		t.Fatalf("standby stop: %v\n%s", err, sbOut.String())
	}
	h.publish(1000)

	// Failover on another node: a fresh data dir and the standby's cache.
	h.data = filepath.Join(t.TempDir(), "node2")
	h.args = []string{"--standby-cache", cache}
	mark := len(h.logs.String())
	h.runToEnd()
	h.verify()
	m := regexp.MustCompile(`msg="restore complete" checkpoint=\d+ .*bytes_downloaded=(\d+) bytes_standby_cache=(\d+)`).FindStringSubmatch(h.logs.String()[mark:])
	if m == nil {
		t.Fatalf("no restore on failover\n%s", tail(h.logs.String()[mark:], 4000))
	}
	downloaded, _ := strconv.ParseInt(m[1], 10, 64)
	fromCache, _ := strconv.ParseInt(m[2], 10, 64)
	if fromCache == 0 || downloaded >= fromCache {
		t.Fatalf("failover took %d bytes from the standby cache and downloaded %d: the cache should carry the bulk", fromCache, downloaded)
	}
	t.Logf("failover: %d bytes from the standby cache, %d downloaded", fromCache, downloaded)
}
