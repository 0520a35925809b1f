package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"cairn/internal/app/dashboard/dashboardtest"
	"cairn/internal/testutil/testbin"
)

var demoShots = flag.String("cairn.screenshots", "", "write the dashboard screenshots of TestDemoFailuresInBrowser (before and after a kill, after losing the disk and rescaling) to this directory")

// demoProc is a `cairn demo` process of a test.
type demoProc struct {
	cmd  *exec.Cmd
	out  syncBuffer
	done chan error
}

// startDemo runs the cairn binary's demo on dataDir with args added.
func startDemo(t *testing.T, dataDir string, natsPort int, args ...string) *demoProc {
	t.Helper()
	bin, err := testbin.Build("cairn", "cairn")
	if err != nil {
		t.Fatal(err)
	}
	p := &demoProc{done: make(chan error, 1)}
	p.cmd = exec.Command(bin, append([]string{"demo", "--data", dataDir, "--nats-port", strconv.Itoa(natsPort), "--rate", "1000"}, args...)...)
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- p.cmd.Wait() }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
		p.done <- nil
	})
	return p
}

// wait waits for the demo to exit and fails unless it exited 0 after its
// exactly-once check passed.
func (p *demoProc) wait(t *testing.T) {
	t.Helper()
	select {
	case err := <-p.done:
		p.done <- err
		if err != nil {
			t.Fatalf("demo exited: %v\n%s", err, tail(p.out.String(), 6000))
		}
	case <-time.After(3 * time.Minute):
		t.Fatalf("demo did not exit within 3 minutes\n%s", tail(p.out.String(), 6000))
	}
	if !strings.Contains(p.out.String(), "\nverified: ") {
		t.Fatalf("demo printed no verified summary:\n%s", tail(p.out.String(), 6000))
	}
}

// demoSnapshot is the part of /api/snapshot the tests read.
type demoSnapshot struct {
	Checkpoints []struct {
		ID        uint64  `json:"id"`
		Mode      string  `json:"mode"`
		Predicted float64 `json:"predicted_restore_seconds"`
	} `json:"checkpoints"`
	Restores []struct {
		CheckpointID uint64   `json:"checkpoint_id"`
		Source       string   `json:"source"`
		Downloaded   int64    `json:"bytes_downloaded"`
		ToSlots      int      `json:"to_slots"`
		Checkpoint   *float64 `json:"checkpoint_duration_seconds"`
		Predicted    *float64 `json:"predicted_restore_seconds"`
		Measured     float64  `json:"duration_seconds"`
		CaughtUp     *float64 `json:"caught_up_seconds"`
	} `json:"restores"`
	Story struct {
		Phase string   `json:"phase"`
		Lines []string `json:"lines"`
	} `json:"story"`
}

func getSnapshot(base string) (demoSnapshot, error) {
	var s demoSnapshot
	resp, err := http.Get(base + "/api/snapshot")
	if err != nil {
		return s, err
	}
	defer resp.Body.Close()
	return s, json.NewDecoder(resp.Body).Decode(&s)
}

// pollSnapshot polls the demo's snapshot until ok, failing loudly at the deadline.
func pollSnapshot(t *testing.T, p *demoProc, base, what string, ok func(demoSnapshot) bool) demoSnapshot {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		s, err := getSnapshot(base)
		if err == nil && ok(s) {
			return s
		}
		select {
		case err := <-p.done:
			p.done <- err
			t.Fatalf("demo exited (%v) while waiting for %s\n%s", err, what, tail(p.out.String(), 6000))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s after 90 s (last snapshot: %+v, err %v)\n%s", what, s, err, tail(p.out.String(), 6000))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// restoreRow is the newest row of the dashboard's restore table, by column header.
const restoreRow = `(() => {
  const t = document.getElementById('t-restores');
  if (!t || !t.tHead || !t.tBodies[0] || !t.tBodies[0].rows.length) return null;
  const heads = [...t.tHead.rows[0].cells].map((c) => c.textContent);
  const cells = [...t.tBodies[0].rows[0].cells].map((c) => c.textContent);
  const row = { rows: t.tBodies[0].rows.length };
  heads.forEach((h, i) => { row[h] = cells[i]; });
  return row;
})()`

// TestDemoFailuresInBrowser drives `cairn demo` from its dashboard in headless
// Chromium as a presenter would: it clicks kill -9 and sees the restore row
// appear with the restored checkpoint's duration, the predicted and the
// measured restore time, and the time until the lag was back; then it loses
// the disk and rescales to 3 slots, and at the end the demo's exactly-once
// check passes. The dashboard's charts and /metrics carry the figures.
func TestDemoFailuresInBrowser(t *testing.T) {
	// Mostly waiting on processes and servers: run beside another.
	t.Parallel()
	chromium := dashboardtest.RequireChromium(t)
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	base := "http://" + addr
	p := startDemo(t, t.TempDir(), freePort(t), "--http", addr)
	// The restore model calibrates from the first checkpoints: wait for a
	// predicted restore on the dashboard before failing anything.
	pollSnapshot(t, p, base, "calibrated prediction", func(s demoSnapshot) bool {
		return s.Story.Phase == "running" && len(s.Checkpoints) >= 2 && s.Checkpoints[len(s.Checkpoints)-1].Predicted > 0
	})

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	b, err := dashboardtest.Open(ctx, chromium, base+"/", 1280, 2200)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := b.WaitFor(ctx, `document.querySelector('button[data-action="kill"]') && document.getElementById('status').textContent === 'live'`); err != nil {
		t.Fatal(err)
	}
	shot(t, ctx, b, "1-before-kill.png")

	type row map[string]any
	// click presses an action's button and waits until the restore table has
	// n rows, the newest complete: every number filled in and the lag back.
	click := func(action string, n int) row {
		t.Helper()
		if err := b.Eval(ctx, `document.querySelector('button[data-action="`+action+`"]').click()`, nil); err != nil {
			t.Fatal(err)
		}
		var r row
		deadline := time.Now().Add(90 * time.Second)
		for {
			err := b.Eval(ctx, restoreRow, &r)
			if err == nil && r != nil && int(r["rows"].(float64)) >= n && filled(r, "checkpoint took", "predicted", "restored in", "caught up in") {
				return r
			}
			if time.Now().After(deadline) {
				dom, _ := b.DOM(ctx)
				writeDOM(t, "demo-dom.html", dom)
				t.Fatalf("after %s: restore row %v (err %v), want %d rows with every number\n%s", action, r, err, n, tail(p.out.String(), 6000))
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	r := click("kill", 1) // the demo's first start restored nothing: row 1 is the kill's
	t.Logf("kill -9: %v", r)
	if r["source"] != "local" {
		t.Errorf("after kill -9 the restore read %v, want the local copy", r["source"])
	}
	shot(t, ctx, b, "2-after-kill.png")

	r = click("lose-disk", 2)
	t.Logf("lose the disk: %v", r)
	if r["source"] != "store" || r["downloaded"] == "0 B" {
		t.Errorf("after losing the disk the restore read %v and downloaded %v, want the store", r["source"], r["downloaded"])
	}
	shot(t, ctx, b, "3-after-lose-disk.png")

	if err := b.Eval(ctx, `document.querySelector('input[data-param="rescale"]').value = '3'`, nil); err != nil {
		t.Fatal(err)
	}
	r = click("rescale", 3)
	t.Logf("rescale: %v", r)
	if r["slots"] != "2 → 3" {
		t.Errorf("after rescale the restore row says slots %v, want 2 → 3", r["slots"])
	}
	shot(t, ctx, b, "4-after-rescale.png")

	s, err := getSnapshot(base)
	if err != nil {
		t.Fatal(err)
	}
	for _, rs := range s.Restores {
		if rs.Checkpoint == nil || rs.Predicted == nil || rs.CaughtUp == nil || rs.Measured <= 0 {
			t.Errorf("restore of checkpoint %d lacks a number: %+v", rs.CheckpointID, rs)
		}
	}
	dom, err := b.DOM(ctx)
	if err != nil {
		t.Fatal(err)
	}
	charts := dashboardtest.Charts(dom)
	if c := charts["checkpoint-bytes"]; c.Points < 2 {
		t.Errorf("checkpoint-bytes chart has %d points, want >= 2", c.Points)
	}
	if c := charts["recovery"]; c.Series["caught_up"] < 3 || c.Series["predicted"] < 3 {
		t.Errorf("recovery chart: %v, want the three restores with predicted and caught-up bars", c.Series)
	}
	checkDemoMetrics(t, base)

	_ = p.cmd.Process.Signal(os.Interrupt) // stop: drain, stop the job, check the outputs
	p.wait(t)
	t.Logf("%s", lastLines(p.out.String(), 3))
}

// filled reports whether every named cell of a table row holds a number.
func filled(r map[string]any, cols ...string) bool {
	for _, c := range cols {
		v, _ := r[c].(string)
		if v == "" || v == "—" || v == "calibrating" {
			return false
		}
	}
	return true
}

func shot(t *testing.T, ctx context.Context, b *dashboardtest.Browser, name string) {
	t.Helper()
	if *demoShots == "" {
		return
	}
	if err := os.MkdirAll(*demoShots, 0o755); err != nil {
		t.Fatal(err)
	}
	// Let the page draw the latest poll first.
	time.Sleep(1200 * time.Millisecond)
	if err := b.Screenshot(ctx, filepath.Join(*demoShots, name)); err != nil {
		t.Fatal(err)
	}
}

func writeDOM(t *testing.T, name, dom string) {
	p := filepath.Join(os.TempDir(), name)
	if err := os.WriteFile(p, []byte(dom), 0o644); err == nil {
		t.Logf("DOM written to %s", p)
	}
}

func checkDemoMetrics(t *testing.T, base string) {
	t.Helper()
	fams := scrapeMetrics(t, base+"/metrics")
	for _, name := range []string{"cairn_records_in_total", "cairn_checkpoint_sync_duration_seconds", "cairn_restores_total", "cairn_state_size_bytes"} {
		if fams[name] == nil {
			t.Errorf("/metrics lacks %s", name)
		}
	}
}

// scrapeMetrics reads and parses a Prometheus text endpoint.
func scrapeMetrics(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("%s does not parse: %v", url, err)
	}
	return fams
}

// alive reports whether process pid runs (a zombie waiting for init does not).
func alive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	_, rest, _ := strings.Cut(string(b), ") ")
	return !strings.HasPrefix(rest, "Z")
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// TestDemoSurvivesSIGKILL kills `cairn demo` itself with SIGKILL while it
// runs, then starts it again on the same data directory: it restores the
// job's last checkpoint, its job process of the killed run is gone, and its
// exactly-once check (which spans both runs) passes.
func TestDemoSurvivesSIGKILL(t *testing.T) {
	// Mostly waiting on processes and servers: run beside another.
	t.Parallel()
	dir := t.TempDir()
	natsPort := freePort(t)
	p := startDemo(t, dir, natsPort, "--http", "off")
	deadline := time.Now().Add(90 * time.Second)
	for {
		m, _ := filepath.Glob(filepath.Join(dir, "store", "wordcount", "chk-*", "MANIFEST.json"))
		_, verr := os.Stat(filepath.Join(dir, "verify.json"))
		if len(m) >= 2 && verr == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no two checkpoints and no verifier state after 90 s\n%s", tail(p.out.String(), 4000))
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(time.Second) // input and outputs past the last checkpoint
	pid, err := os.ReadFile(filepath.Join(dir, "job.pid"))
	if err != nil {
		t.Fatal(err)
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	if err := <-p.done; err == nil {
		t.Fatal("the demo exited 0 after SIGKILL")
	}
	p.done <- nil
	child, _ := strconv.Atoi(strings.TrimSpace(string(pid)))
	deadline = time.Now().Add(30 * time.Second)
	for alive(child) {
		if time.Now().After(deadline) {
			t.Fatalf("the job process %d outlived the killed demo by 30 s", child)
		}
		time.Sleep(50 * time.Millisecond)
	}

	p2 := startDemo(t, dir, natsPort, "--http", "off", "--duration", "6s")
	p2.wait(t)
	out := p2.out.String()
	if !strings.Contains(out, "restored checkpoint #") {
		t.Fatalf("the restarted demo did not restore:\n%s", out)
	}
	t.Logf("%s", lastLines(out, 3))
}
