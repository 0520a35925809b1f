package nexmarkcmd_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"cairn/engine"
	"cairn/internal/app/job"
	"cairn/internal/app/nexmarkcmd"
	"cairn/internal/app/runtime"
	"cairn/internal/base/natsembed"
	"cairn/nexmark"
	"cairn/operators/builtin"
)

// TestGen publishes events to an embedded JetStream server and reads every
// one back: subject, event time and payload are the generator's.
func TestGen(t *testing.T) {
	srv, err := natsembed.Start(natsembed.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	cfg := nexmark.Config{Seed: 7, Events: 5000, Rate: 1000}
	var out bytes.Buffer
	ctx := context.Background()
	if err := nexmarkcmd.Gen(ctx, nc, nexmarkcmd.GenConfig{Nexmark: cfg, Stream: "NEXMARK", Subject: "nexmark"}, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "published 5000 events") {
		t.Fatalf("output %q", out.String())
	}
	js, _ := jetstream.New(nc)
	cons, err := js.OrderedConsumer(ctx, "NEXMARK", jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	g, _ := nexmark.New(cfg)
	var e nexmark.Event
	for n := uint64(0); n < cfg.Events; n++ {
		m, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil {
			t.Fatalf("message %d: %v", n, err)
		}
		g.Event(n, &e)
		if want := "nexmark." + e.Kind.String() + "." + strconv.FormatInt(e.Key(), 10); m.Subject() != want {
			t.Fatalf("message %d on %s, want %s", n, m.Subject(), want)
		}
		if got := m.Headers().Get(engine.HeaderTime); got != strconv.FormatInt(e.Time(), 10) {
			t.Fatalf("message %d: Cairn-Time %s, want %d", n, got, e.Time())
		}
		if !bytes.Equal(m.Data(), nexmark.AppendJSON(nil, &e)) {
			t.Fatalf("message %d: %s", n, m.Data())
		}
	}
	if err := nexmarkcmd.Gen(ctx, nc, nexmarkcmd.GenConfig{Stream: "NEXMARK", Subject: "nexmark"}, io.Discard); err == nil {
		t.Fatal("Gen of an unbounded input did not fail")
	}
}

// TestBench runs one query for a few events, with and without checkpoints,
// in process, and checks each row's measurements.
func TestBench(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	rows, err := nexmarkcmd.Bench(context.Background(), nexmarkcmd.BenchConfig{
		Queries: []string{"q2"}, Events: 20_000, Seed: 3, Slots: []int{2}, Checkpoints: []bool{false, true},
		Inputs:   []string{nexmarkcmd.Generated, nexmarkcmd.JetStream},
		Interval: time.Second, WorkDir: t.TempDir(),
		Start: func(ctx context.Context, j *job.Job) (nexmarkcmd.Started, error) {
			r, err := runtime.Start(ctx, j, runtime.Options{}, log)
			if err != nil {
				return nil, err
			}
			return started{r}, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 4 {
		t.Fatalf("%d rows", len(rows))
	}
	for _, r := range rows {
		if r.Outputs == 0 || r.DeadLetters != 0 || r.Wall <= 0 || r.EventsPerSec() <= 0 || r.Slots != 2 {
			t.Fatalf("row %+v", r)
		}
		if r.Checkpoints && (r.Chk <= 0 || r.Restore <= 0) {
			t.Fatalf("row with checkpoints %+v: no checkpoint or restore measured", r)
		}
	}
	for i, r := range rows[1:] {
		if r.Outputs != rows[0].Outputs {
			t.Fatalf("row %d: %d outputs, row 0 %d", i+1, r.Outputs, rows[0].Outputs)
		}
	}
	if rows[0].Input != nexmarkcmd.Generated || rows[2].Input != nexmarkcmd.JetStream {
		t.Fatalf("inputs %s, %s, %s, %s", rows[0].Input, rows[1].Input, rows[2].Input, rows[3].Input)
	}
	var out bytes.Buffer
	nexmarkcmd.PrintTable(&out, rows)
	if !strings.Contains(out.String(), "175.2 K") { // Flink's q2 per core
		t.Fatalf("table without Flink's column:\n%s", out.String())
	}
}

// TestBenchModules runs a query with the embedded module and with the same
// module from a file, side by side: two rows, the same outputs, a module
// column in the table; a module file that is not there is refused first.
func TestBenchModules(t *testing.T) {
	code, ok := builtin.Lookup("nexmark")
	if !ok {
		t.Fatal("no builtin nexmark")
	}
	path := filepath.Join(t.TempDir(), "nexmark.wasm")
	if err := os.WriteFile(path, code, 0o644); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg := nexmarkcmd.BenchConfig{
		Queries: []string{"q17"}, Events: 10_000, Seed: 5, Slots: []int{1}, Checkpoints: []bool{false},
		Modules: []string{nexmarkcmd.Builtin, path}, WorkDir: t.TempDir(),
		Start: func(ctx context.Context, j *job.Job) (nexmarkcmd.Started, error) {
			r, err := runtime.Start(ctx, j, runtime.Options{}, log)
			if err != nil {
				return nil, err
			}
			return started{r}, nil
		},
	}
	rows, err := nexmarkcmd.Bench(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 || rows[0].Module != nexmarkcmd.Builtin || rows[1].Module != path {
		t.Fatalf("rows %+v", rows)
	}
	if rows[0].Outputs == 0 || rows[1].Outputs != rows[0].Outputs || rows[1].DeadLetters != 0 {
		t.Fatalf("outputs %d and %d, dead letters %d", rows[0].Outputs, rows[1].Outputs, rows[1].DeadLetters)
	}
	var out bytes.Buffer
	nexmarkcmd.PrintTable(&out, rows)
	if !strings.Contains(out.String(), "module") || !strings.Contains(out.String(), "nexmark.wasm") {
		t.Fatalf("table without the module column:\n%s", out.String())
	}
	cfg.Modules = []string{filepath.Join(t.TempDir(), "missing.wasm")}
	if _, err := nexmarkcmd.Bench(context.Background(), cfg); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a missing module: %v", err)
	}
}

type started struct{ r *runtime.Running }

func (s started) Engine() *engine.Engine { return s.r.Engine }
func (s started) Engines() []*engine.Engine {
	var e []*engine.Engine
	for _, sub := range s.r.SubTopologies() {
		e = append(e, sub.Engine)
	}
	return e
}
func (s started) Close() { s.r.Close() }
func (s started) RestoreDuration() (time.Duration, bool) {
	if s.r.Restored == nil {
		return 0, false
	}
	return s.r.Restored.Duration, true
}
