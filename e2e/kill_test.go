package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"cairn/engine"
	"cairn/internal/testbin"
	"cairn/internal/testservers"
)

const killJob = `
name: killed
input:  {stream: EVENTS, subjects: ["events.>"]}
stages:
  - {name: count, module: "builtin:count", keyed: true}
output: {stream: COUNTS, subject: counts, delivery: %s}
key_groups: 32
slots: 2
batch_size: 128
checkpoint: {interval: %s, mode: %s, retain: 2}
`

// TestKillNine kills the cairn binary with SIGKILL at random moments while
// it processes a known keyed input, restarts it each time (it restores the
// latest checkpoint), and checks at the end: every key's count exact in the
// output stream's last value and in the state, exactly one output per (key
// group, output index) with no gap, nothing missing. Seeded: set
// CAIRN_KILL_SEED to rerun a failure.
func TestKillNine(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("CAIRN_KILL_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	t.Logf("seed %d (rerun: CAIRN_KILL_SEED=%d go test ./e2e -run TestKillNine)", seed, seed)
	bin, err := testbin.Build("cairn", "cairn")
	if err != nil {
		t.Fatal(err)
	}
	kills := 0
	for i, tc := range []struct {
		store, mode, delivery, interval string
		dupWindow                       time.Duration
	}{
		{"file", "incremental", "exactly_once", "150ms", 0},
		{"file", "full", "transactional", "150ms", 0},
		{"s3", "incremental", "transactional", "150ms", 0},
		{"s3", "full", "exactly_once", "150ms", 0},
		// A checkpoint older than the output stream's duplicate window: the
		// replay regenerates outputs the server no longer remembers ids of.
		{"file", "incremental", "exactly_once", "2500ms", 500 * time.Millisecond},
	} {
		name := fmt.Sprintf("%s-%s-%s", tc.store, tc.mode, tc.delivery)
		if tc.dupWindow > 0 {
			name += "-old-checkpoint"
		}
		t.Run(name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, uint64(i)))
			kills += killCase(t, bin, rng, tc.store, tc.mode, tc.delivery, tc.interval, tc.dupWindow)
		})
	}
	t.Logf("%d SIGKILLs in total", kills)
	if kills < 10 && !t.Failed() {
		t.Fatalf("only %d kills", kills)
	}
}

func killCase(t *testing.T, bin string, rng *rand.Rand, storeKind, mode, delivery, interval string, dupWindow time.Duration) int {
	natsURL := startNATS(t)
	_, js := connectJS(t, natsURL)
	ctx := context.Background()
	createStream(t, js, "EVENTS", "events.>")
	if dupWindow > 0 {
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "COUNTS", Subjects: []string{"counts.>"}, Duplicates: dupWindow}); err != nil {
			t.Fatal(err)
		}
	}
	store := "file://" + t.TempDir() + "?create_dir=true"
	var env []string
	if storeKind == "s3" {
		store = testservers.StartGoFakeS3(t)
		env = []string{"AWS_ACCESS_KEY_ID=" + testservers.AccessKey, "AWS_SECRET_ACCESS_KEY=" + testservers.SecretKey, "AWS_REGION=" + testservers.Region, "AWS_EC2_METADATA_DISABLED=true"}
	}
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	jobFile := filepath.Join(dir, "job.yaml")
	if err := os.WriteFile(jobFile, fmt.Appendf(nil, killJob, delivery, interval, mode), 0o644); err != nil {
		t.Fatal(err)
	}
	const n = 12000
	model := map[string]int{}
	publish := func(from, to int) {
		var msgs []*nats.Msg
		for i := from; i < to; i++ {
			k := fmt.Sprintf("key-%d", (i*31)%257)
			model[k]++
			msgs = append(msgs, &nats.Msg{Subject: "events.x", Header: nats.Header{engine.HeaderKey: []string{k}}, Data: []byte("x")})
		}
		publishAll(t, js, msgs)
	}
	publish(0, n/2)

	var logs bytes.Buffer
	httpAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	start := func() (*exec.Cmd, chan error) {
		cmd := exec.Command(bin, "run", "--job", jobFile, "--nats", natsURL, "--store", store, "--data", data, "--http", httpAddr)
		cmd.Env = append(os.Environ(), env...)
		cmd.Stdout, cmd.Stderr = &logs, &logs
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		return cmd, done
	}
	kills := 0
	for k := range 3 {
		cmd, done := start()
		time.Sleep(time.Duration(300+rng.IntN(900)) * time.Millisecond)
		if k == 1 {
			publish(n/2, n) // the rest of the input arrives while it runs
		}
		select {
		case err := <-done:
			t.Fatalf("cairn exited before the kill: %v\n%s", err, logs.String())
		default:
		}
		_ = cmd.Process.Signal(syscall.SIGKILL)
		<-done
		kills++
	}
	// A last run to completion, then a graceful stop.
	logsBefore := logs.Len()
	cmd, done := start()
	// SIGTERM before the process installed its handler would kill it:
	// wait until it runs the job.
	for !strings.Contains(logs.String()[logsBefore:], "job running") {
		select {
		case err := <-done:
			t.Fatalf("cairn exited: %v\n%s", err, logs.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	total := n
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var st engine.Stats
		if resp, err := http.Get("http://" + httpAddr + "/api/stats"); err == nil {
			_ = json.NewDecoder(resp.Body).Decode(&st)
			resp.Body.Close()
			if st.ProcessedSeq >= n {
				break
			}
		}
		select {
		case err := <-done:
			t.Fatalf("cairn exited: %v\n%s", err, logs.String())
		default:
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			t.Fatalf("timed out waiting for %d outputs\n%s", total, tail(logs.String(), 4000))
		}
		time.Sleep(50 * time.Millisecond)
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	if err := <-done; err != nil {
		t.Fatalf("cairn stop: %v\n%s", err, tail(logs.String(), 4000))
	}
	out := readStream(t, js, "COUNTS", total)
	if len(out) != total {
		t.Fatalf("output stream holds %d messages, want exactly %d (one per input event)\n%s", len(out), total, tail(logs.String(), 4000))
	}
	last := lastValues(t, out, "counts", 32) // gap-free, no repeats per key group
	keys := make([]string, 0, len(model))
	for k, c := range model {
		keys = append(keys, k)
		if last[k] != strconv.Itoa(c) {
			t.Errorf("key %s: output %q, want %d", k, last[k], c)
		}
	}
	st := stateValues(t, data, 32, 2, keys)
	for k, c := range model {
		if st[k] != strconv.Itoa(c) {
			t.Errorf("key %s: state %q, want %d", k, st[k], c)
		}
	}
	return kills
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}
