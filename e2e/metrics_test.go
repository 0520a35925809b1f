package e2e

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"cairn/checkpoint"
	"cairn/internal/testutil/wait"
)

// TestMetricsAfterRestore: after checkpoints and a restore, the restarted
// job's /metrics parses as Prometheus text and carries the restore figures
// (and the restored job's next checkpoint reuses every SST already stored:
// a restored DB uploads nothing again).
func TestMetricsAfterRestore(t *testing.T) {
	h := newHarness(t, harnessConfig{store: "file", mode: "incremental", delivery: "exactly_once", interval: "1h", retain: 3})
	h.publish(5000)
	h.runToEnd() // the graceful stop commits a checkpoint
	ctx := context.Background()
	s, err := checkpoint.OpenStore(ctx, h.store)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	before, err := checkpoint.Latest(ctx, s, "killed")
	if err != nil {
		t.Fatal(err)
	}

	// A drill report for the dashboard to show beside the job's figures.
	report := filepath.Join(t.TempDir(), "drill.json")
	if err := os.WriteFile(report, []byte(`{"scenarios":[{"name":"store-incremental","restore_seconds":1.5}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	h.args = []string{"--drill-report", report}
	mark := len(h.logs.String())
	cmd, done := h.start()
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		<-done
	}()
	for !strings.Contains(h.logs.String()[mark:], "job running") {
		select {
		case err := <-done:
			t.Fatalf("cairn exited: %v\n%s", err, h.logs.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	// A checkpoint right after the restore, with no new input.
	resp, err := http.Post("http://"+h.httpAddr+"/api/action/checkpoint", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("checkpoint action: %s: %s", resp.Status, body)
	}
	after, err := checkpoint.Latest(ctx, s, "killed")
	if err != nil {
		t.Fatal(err)
	}
	if after.ID == before.ID {
		t.Fatal("no new checkpoint")
	}
	old := map[string]bool{}
	for _, o := range before.Objects {
		old[o.Path] = true
	}
	ssts := 0
	for _, o := range after.Objects {
		if o.Kind == checkpoint.KindSST {
			ssts++
			if !old[o.Path] {
				t.Errorf("the restored job uploaded SST %s again or anew (no input since the restore)", o.Path)
			}
		}
	}
	if ssts == 0 {
		t.Fatal("the checkpoint after the restore references no SST: nothing to check reuse on")
	}
	if after.Figures.FilesReused != ssts {
		t.Errorf("files reused %d, want every SST (%d)", after.Figures.FilesReused, ssts)
	}

	// /metrics: restore and checkpoint figures (the observer refreshes every second).
	var fams map[string]bool
	deadline := time.Now().Add(10 * time.Second)
	for {
		parsed := scrapeMetrics(t, "http://"+h.httpAddr+"/metrics")
		fams = map[string]bool{}
		for k := range parsed {
			fams[k] = true
		}
		if fams["cairn_checkpoint_last_id"] || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	resp, err = http.Get("http://" + h.httpAddr + "/api/snapshot")
	if err != nil {
		t.Fatal(err)
	}
	snap, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(snap), "store-incremental") {
		t.Errorf("the dashboard snapshot does not carry the drill report: %s", snap)
	}
	for _, name := range []string{"cairn_restore_last_duration_seconds", "cairn_restore_last_downloaded_bytes", "cairn_restore_last_local_bytes", "cairn_restores_total", "cairn_restore_duration_seconds", "cairn_checkpoint_last_id", "cairn_checkpoint_sync_duration_seconds", "cairn_record_latency_seconds"} {
		if !fams[name] {
			t.Errorf("/metrics lacks %s", name)
		}
	}
}

// TestMemoryBudgetMetrics: the binary run with --memory divides the budget
// as the log says and exports the division in /metrics: the total as
// given, Pebble's caches and memtables, the operators' share and the Go
// runtime's soft limit (the total less the operators', whose guest memory
// is an mmap outside the Go heap), the parts within the total.
func TestMemoryBudgetMetrics(t *testing.T) {
	h := newHarness(t, harnessConfig{store: "file", mode: "incremental", delivery: "exactly_once", interval: "1h"})
	h.publish(1000)
	h.args = []string{"--memory", "256MiB"}
	cmd, done := h.start()
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		<-done
	}()
	wait.For(t, time.Minute, "the job to run", func() bool { return strings.Contains(h.logs.String(), "job running") })
	if !strings.Contains(h.logs.String(), "memory budget") {
		t.Fatalf("no memory budget log line:\n%s", tail(h.logs.String(), 3000))
	}
	got := map[string]float64{}
	wait.For(t, 10*time.Second, "cairn_memory_budget_bytes", func() bool {
		fam := scrapeMetrics(t, "http://"+h.httpAddr+"/metrics")["cairn_memory_budget_bytes"]
		if fam == nil {
			return false
		}
		for _, m := range fam.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "component" {
					got[l.GetValue()] = m.GetGauge().GetValue()
				}
			}
		}
		return true
	})
	const total = 256 << 20
	if got["total"] != total {
		t.Fatalf("budget total %v, want %d (all: %v)", got["total"], total, got)
	}
	parts := 0.0
	for _, c := range []string{"pebble_cache", "pebble_memtables", "operators"} {
		if got[c] <= 0 {
			t.Errorf("component %s: %v (all: %v)", c, got[c], got)
		}
		parts += got[c]
	}
	parts += got["nats"] // only with the embedded server
	if parts > total {
		t.Errorf("the parts add up to %v, over the total %d: %v", parts, total, got)
	}
	if got["go_limit"] != total-got["operators"] {
		t.Errorf("Go soft limit %v, want the total less the operators' %v", got["go_limit"], total-got["operators"])
	}
}
