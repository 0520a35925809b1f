package nexmarkq_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"cairn/engine"
	"cairn/internal/app/job"
	"cairn/internal/base/natsembed"
	"cairn/internal/testutil/testbin"
	"cairn/nexmark"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testbin.Cleanup()
	os.Exit(code)
}

// logBuffer collects a process's output for the failure message.
type logBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.b.String()
	return s[max(0, len(s)-4000):]
}

// proc is one run of the cairn binary.
type proc struct {
	cmd  *exec.Cmd
	done chan error
	http string
}

func startCairn(t *testing.T, bin string, logs *logBuffer, args ...string) *proc {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cmd := exec.Command(bin, append(append([]string{"run"}, args...), "--http", addr, "--log-level", "info")...)
	cmd.Stdout, cmd.Stderr = logs, logs
	dieWithTest(cmd)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, done: make(chan error, 1), http: addr}
	go func() { p.done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGKILL)
		<-p.done
	})
	return p
}

// stats reads the job's /api/stats (false while it does not answer).
func (p *proc) stats() (engine.Stats, bool) {
	var st engine.Stats
	resp, err := http.Get("http://" + p.http + "/api/stats")
	if err != nil {
		return st, false
	}
	defer resp.Body.Close()
	return st, json.NewDecoder(resp.Body).Decode(&st) == nil
}

// waitFor polls the job's stats until ok says so.
func (p *proc) waitFor(t *testing.T, logs *logBuffer, what string, ok func(engine.Stats) bool) engine.Stats {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		select {
		case err := <-p.done:
			p.done <- err
			t.Fatalf("cairn exited waiting for %s: %v\n%s", what, err, logs)
		default:
		}
		if st, got := p.stats(); got && ok(st) {
			return st
		}
		if time.Now().After(deadline) {
			st, _ := p.stats()
			t.Fatalf("no %s in 3 minutes (stats %+v)\n%s", what, st, logs)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// readOutputs reads every output of the stream OUT as the model writes
// them, checking that each key group's Cairn-Out indexes are 1, 2, ....
func readOutputs(t *testing.T, url string) []string {
	t.Helper()
	return readStream(t, url, "OUT")
}

// readStream is readOutputs of another stream.
func readStream(t *testing.T, url, stream string) []string {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cons, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	last := map[string]uint64{}
	var got []string
	for n := uint64(0); n < info.State.Msgs; n++ {
		m, err := cons.Next(jetstream.FetchMaxWait(10 * time.Second))
		if err != nil {
			t.Fatalf("output %d of %d: %v", n+1, info.State.Msgs, err)
		}
		h := m.Headers()
		idx, _ := strconv.ParseUint(h.Get(engine.HeaderOut), 10, 64)
		if idx != last[m.Subject()]+1 {
			t.Fatalf("%s: output index %d after %d: an output was lost or published twice", m.Subject(), idx, last[m.Subject()])
		}
		last[m.Subject()] = idx
		got = append(got, fmt.Sprintf("%s|%s|%s", h.Get(engine.HeaderKey), m.Data(), h.Get(engine.HeaderTime)))
	}
	return sorted(got)
}

// TestKillRestoreOnOtherSlots runs q5 (sliding windows over keyed state),
// q9 (a join whose timers fire at each auction's expiry), q4 (a job
// graph: q9's join, then a running average per category), q15 and q16
// (distinct counts per day, and per channel and day, in sets of ids and in
// the key's own value) with the cairn
// binary on a generated input: SIGKILL once a checkpoint committed, restart
// on another slot count, and the outputs on the JetStream output stream
// (exactly_once) equal the model's.
func TestKillRestoreOnOtherSlots(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the cairn binary")
	}
	bin, err := testbin.Build("cairn", "cairn")
	if err != nil {
		t.Fatal(err)
	}
	seed := testSeed(t)
	for i, q := range []string{"q5", "q9", "q4", "q15", "q16"} {
		t.Run(q, func(t *testing.T) {
			dir := t.TempDir()
			srv, err := natsembed.Start(natsembed.Options{Dir: filepath.Join(dir, "nats")})
			if err != nil {
				t.Fatal(err)
			}
			defer srv.Shutdown()
			cfg := nexmark.Config{Seed: seed + uint64(i), Events: 60_000, Rate: 1000}
			evs, wm := events(t, cfg)
			want := models[q](evs, wm)
			j := loadQuery(t, q, cfg, 1, filepath.Join(dir, "data"))
			j.HTTP = "off"
			j.Checkpoint = &job.Checkpoint{Store: "file://" + filepath.Join(dir, "store") + "?create_dir=true", Interval: 300 * time.Millisecond, Mode: "incremental"}
			j.SetDefaults()
			yml, err := j.Marshal()
			if err != nil {
				t.Fatal(err)
			}
			jobFile := filepath.Join(dir, q+".yaml")
			if err := os.WriteFile(jobFile, yml, 0o644); err != nil {
				t.Fatal(err)
			}
			logs := &logBuffer{}
			p := startCairn(t, bin, logs, "--job", jobFile, "--nats", srv.URL(), "--slots", "1")
			st := p.waitFor(t, logs, "a committed checkpoint", func(st engine.Stats) bool { return st.Checkpoints > 0 })
			_ = p.cmd.Process.Signal(syscall.SIGKILL)
			<-p.done
			p.done <- nil
			t.Logf("SIGKILL at input %d of %d, checkpoint %d at input %d", st.ProcessedSeq, cfg.Events, st.LastChkID, st.LastChkSeq)
			p = startCairn(t, bin, logs, "--job", jobFile, "--nats", srv.URL(), "--slots", "2")
			p.waitFor(t, logs, "the whole input processed", func(st engine.Stats) bool { return st.ProcessedSeq >= cfg.Events && st.RecordsOut > 0 })
			// The last outputs may still be on their way: poll the stream.
			var got []string
			deadline := time.Now().Add(time.Minute)
			for got = readOutputs(t, srv.URL()); len(got) < len(want) && time.Now().Before(deadline); got = readOutputs(t, srv.URL()) {
				time.Sleep(100 * time.Millisecond)
			}
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
			if err := <-p.done; err != nil {
				t.Fatalf("graceful stop: %v\n%s", err, logs)
			}
			p.done <- nil
			compare(t, readOutputs(t, srv.URL()), want)
			t.Logf("%d outputs equal the model's after the SIGKILL and a restore from 1 slot onto 2", len(want))
		})
	}
}
