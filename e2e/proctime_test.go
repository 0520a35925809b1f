package e2e

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"cairn/internal/testutil/testbin"
)

var procTimeFull = flag.Bool("cairn.proctime", false, "run TestProcessingTimeKill at the full table's size (2,000 events at 100/s per configuration, about 25 s each) instead of 500 events")

// TestProcessingTimeKill checks that windows by processing time stay exact
// through SIGKILLs, not a graceful stop, because that clock is the
// ingestion time a replay sees again: a separate nats-server process, 2 slots, checkpoints every
// 2 s, events at 100/s over 5 keys published while the job runs, 3
// SIGKILLs at random moments with a restart after each; then every output
// is read back. For builtin:window_count in 1 s windows by processing time
// (exactly_once and transactional) and by event time (exactly_once), every
// configuration must be exact: each (key, window) emitted once with the
// model's count (harness.expected: processing time is the ingestion time
// of the input as stored), so the counts sum to the events published.
//
// By default each configuration publishes 500 events (5 s); the 2,000
// it was first measured with run with -cairn.proctime:
//
//	go test ./e2e -run TestProcessingTimeKill -count=1 -cairn.proctime -v
//
// Seeded (the kill moments): rerun with CAIRN_PROCTIME_SEED.
func TestProcessingTimeKill(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("CAIRN_PROCTIME_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	events, rate := 500, 100
	if *procTimeFull {
		events = 2000
	}
	t.Logf("seed %d, %d events per configuration (rerun: CAIRN_PROCTIME_SEED=%d go test ./e2e -run TestProcessingTimeKill -count=1%s)",
		seed, events, seed, map[bool]string{true: " -cairn.proctime"}[*procTimeFull])
	var rows []string
	for i, tc := range []struct{ op, delivery string }{
		{opWindowProc, "exactly_once"},
		{opWindowProc, "transactional"},
		{opWindowEvent, "exactly_once"},
	} {
		name := tc.op + "-" + tc.delivery
		t.Run(name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, uint64(i)))
			h := newHarness(t, harnessConfig{
				natsURL: startExternalNATS(t), op: tc.op, delivery: tc.delivery,
				store: "file", mode: "incremental", interval: "2s",
				keys: 5, windowMs: 1000, evStepMs: int64(1000 / rate),
			})
			duration := time.Duration(events) * time.Second / time.Duration(rate)
			// 3 kill moments in the publishing period, each run's own.
			var at []time.Duration
			for range 3 {
				at = append(at, time.Duration(rng.Int64N(int64(duration))))
			}
			slices.Sort(at)
			t.Logf("seed %d: SIGKILLs at %v of %v of input", seed, at, duration)

			mark := len(h.logs.String())
			cmd, done := h.start()
			start := time.Now()
			published := make(chan error, 1)
			go func() { published <- h.publishPaced(events, rate) }()
			for _, d := range at {
				time.Sleep(time.Until(start.Add(d)))
				select {
				case err := <-done:
					t.Fatalf("cairn exited before the kill: %v\n%s", err, tail(h.logs.String(), 4000))
				default:
				}
				_ = cmd.Process.Signal(syscall.SIGKILL)
				<-done
				mark = len(h.logs.String())
				cmd, done = h.start()
			}
			if err := <-published; err != nil {
				_ = cmd.Process.Kill()
				t.Fatal(err)
			}
			h.noteLastSeq()
			h.closeInput()
			h.awaitEnd(cmd, done, mark)
			m := h.verify()
			counted := 0
			for _, vs := range m.perKey {
				for _, v := range vs {
					_, n, _ := strings.Cut(v, ",")
					c, _ := strconv.Atoi(n)
					counted += c
				}
			}
			if counted != events {
				t.Errorf("the model counts %d events of %d", counted, events)
			}
			row := fmt.Sprintf("%s %s: %d of %d events counted, %d windows exact, 3 SIGKILLs, %d logged ticks", tc.op, tc.delivery, counted, events, m.outputs, m.ticks)
			if t.Failed() {
				row += " FAILED"
			}
			rows = append(rows, row)
			t.Log(row)
		})
	}
	t.Logf("\n%s", strings.Join(rows, "\n"))
}

// TestWallClockRefused: a stage granted the wall clock (clock: wall) cannot
// promise that a replay regenerates the outputs a restore skips, so cairn
// refuses it with exactly_once and dedupe delivery when the job starts,
// naming the stage and the fix; with transactional it runs.
func TestWallClockRefused(t *testing.T) {
	bin, err := testbin.Build("cairn", "cairn")
	if err != nil {
		t.Fatal(err)
	}
	url := startNATS(t)
	const job = `
name: wallclock
input:  {stream: EVENTS, subjects: ["events.>"]}
stages:
  - {name: win, module: "builtin:window_count", keyed: true, clock: wall, config: {size_ms: 1000, time: processing}}
output: {stream: WINDOWS, subject: windows, delivery: %s}
slots: 2
checkpoint: {store: "file://%s?create_dir=true", interval: 2s}
`
	run := func(delivery string) (*exec.Cmd, *syncBuffer, chan error) {
		dir := t.TempDir()
		file := filepath.Join(dir, "job.yaml")
		if err := os.WriteFile(file, fmt.Appendf(nil, job, delivery, filepath.Join(dir, "store")), 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(bin, "run", "--job", file, "--nats", url, "--data", filepath.Join(dir, "data"), "--http", "off")
		var out syncBuffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		return cmd, &out, done
	}
	for _, delivery := range []string{"exactly_once", "dedupe"} {
		cmd, out, done := run(delivery)
		select {
		case err := <-done:
			msg := out.String()
			if err == nil {
				t.Fatalf("%s: cairn exited 0, want a refusal\n%s", delivery, msg)
			}
			for _, want := range []string{`"win"`, "clock", "wall", "delivery " + delivery, "transactional"} {
				if !strings.Contains(msg, want) {
					t.Errorf("%s: the refusal does not name %q:\n%s", delivery, want, msg)
				}
			}
			if strings.Contains(msg, "job running") {
				t.Errorf("%s: refused only after the job ran:\n%s", delivery, msg)
			}
			t.Logf("%s: %s", delivery, strings.TrimSpace(lastLine(msg)))
		case <-time.After(time.Minute):
			_ = cmd.Process.Kill()
			t.Fatalf("%s: cairn still runs a job with clock: wall\n%s", delivery, out.String())
		}
	}
	cmd, out, done := run("transactional")
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(out.String(), "job running") {
		select {
		case err := <-done:
			t.Fatalf("transactional with clock: wall exited: %v\n%s", err, out.String())
		default:
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			t.Fatalf("transactional with clock: wall did not start\n%s", out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	if err := <-done; err != nil {
		t.Fatalf("transactional with clock: wall: stop: %v\n%s", err, out.String())
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
