package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
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

// harness runs the cairn binary as a child process over a keyed count job,
// against a NATS server and a checkpoint store that live in the test
// process (so they survive the child's deaths), and keeps the model of the
// expected counts.
type harness struct {
	t        *testing.T
	bin      string
	natsURL  string
	js       jetstream.JetStream
	store    string
	env      []string
	data     string
	jobFile  string
	httpAddr string
	logs     syncBuffer
	model    map[string]int
	n        int      // input messages published so far
	args     []string // extra arguments of cairn run
}

type harnessConfig struct {
	store     string // "file" or "s3", or a URL
	mode      string
	delivery  string
	interval  string
	retain    int
	dupWindow time.Duration
}

func newHarness(t *testing.T, c harnessConfig) *harness {
	t.Helper()
	bin, err := testbin.Build("cairn", "cairn")
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, bin: bin, model: map[string]int{}}
	h.natsURL = startNATS(t)
	_, h.js = connectJS(t, h.natsURL)
	createStream(t, h.js, "EVENTS", "events.>")
	if c.dupWindow > 0 {
		if _, err := h.js.CreateStream(context.Background(), jetstream.StreamConfig{Name: "COUNTS", Subjects: []string{"counts.>"}, Duplicates: c.dupWindow}); err != nil {
			t.Fatal(err)
		}
	}
	switch c.store {
	case "file":
		h.store = "file://" + t.TempDir() + "?create_dir=true"
	case "s3":
		h.store = testservers.StartGoFakeS3(t)
		h.env = s3Env()
	default:
		h.store = c.store
		h.env = s3Env()
	}
	if c.retain == 0 {
		c.retain = 2
	}
	dir := t.TempDir()
	h.data = filepath.Join(dir, "data")
	h.jobFile = filepath.Join(dir, "job.yaml")
	job := fmt.Sprintf(killJob, c.delivery, c.interval, c.mode)
	job = strings.Replace(job, "retain: 2", fmt.Sprintf("retain: %d", c.retain), 1)
	if err := os.WriteFile(h.jobFile, []byte(job), 0o644); err != nil {
		t.Fatal(err)
	}
	h.httpAddr = fmt.Sprintf("127.0.0.1:%d", freePort(t))
	return h
}

func s3Env() []string {
	return []string{"AWS_ACCESS_KEY_ID=" + testservers.AccessKey, "AWS_SECRET_ACCESS_KEY=" + testservers.SecretKey, "AWS_REGION=" + testservers.Region, "AWS_EC2_METADATA_DISABLED=true"}
}

// publish appends count events to the input, one key each.
func (h *harness) publish(count int) {
	var msgs []*nats.Msg
	for i := h.n; i < h.n+count; i++ {
		k := fmt.Sprintf("key-%d", (i*31)%257)
		h.model[k]++
		msgs = append(msgs, &nats.Msg{Subject: "events.x", Header: nats.Header{engine.HeaderKey: []string{k}}, Data: []byte("x")})
	}
	publishAll(h.t, h.js, msgs)
	h.n += count
}

// start runs the binary; extraEnv arms failpoints.
func (h *harness) start(extraEnv ...string) (*exec.Cmd, chan error) {
	cmd := exec.Command(h.bin, append([]string{"run", "--job", h.jobFile, "--nats", h.natsURL, "--store", h.store, "--data", h.data, "--http", h.httpAddr}, h.args...)...)
	cmd.Env = append(append(os.Environ(), h.env...), extraEnv...)
	cmd.Stdout, cmd.Stderr = &h.logs, &h.logs
	if err := cmd.Start(); err != nil {
		h.t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	return cmd, done
}

func (h *harness) stats() (engine.Stats, bool) {
	var st engine.Stats
	resp, err := http.Get("http://" + h.httpAddr + "/api/stats")
	if err != nil {
		return st, false
	}
	defer resp.Body.Close()
	return st, json.NewDecoder(resp.Body).Decode(&st) == nil
}

// runToEnd starts the job, waits until it processed the whole input and
// stops it gracefully.
func (h *harness) runToEnd() {
	h.t.Helper()
	mark := len(h.logs.String())
	cmd, done := h.start()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if st, ok := h.stats(); ok && st.ProcessedSeq >= uint64(h.n) && strings.Contains(h.logs.String()[mark:], "job running") {
			break
		}
		select {
		case err := <-done:
			h.t.Fatalf("cairn exited: %v\n%s", err, tail(h.logs.String(), 6000))
		default:
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			h.t.Fatalf("timed out processing %d messages\n%s", h.n, tail(h.logs.String(), 6000))
		}
		time.Sleep(30 * time.Millisecond)
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	if err := <-done; err != nil {
		h.t.Fatalf("cairn stop: %v\n%s", err, tail(h.logs.String(), 6000))
	}
}

// verify checks the invariant: one output per input, gap-free output
// indexes per key group, last value and state equal to the model.
func (h *harness) verify() {
	h.t.Helper()
	defer func() {
		if h.t.Failed() {
			h.t.Logf("cairn logs:\n%s", tail(h.logs.String(), 4000))
		}
	}()
	if got := len(h.model); got == 0 {
		h.t.Fatal("harness: nothing published")
	}
	checkOutputs(h.t, h.js, "COUNTS", "counts", 32, h.model)
	checkState(h.t, h.data, 32, 2, h.model)
}
