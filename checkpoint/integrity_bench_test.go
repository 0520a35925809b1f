package checkpoint

import (
	"context"
	"flag"
	"path/filepath"
	"testing"
	"time"

	"cairn/internal/app/job"
	"cairn/internal/testutil/benchstate"
)

var integritySize = flag.String("integrity.size", "64MiB", "BenchmarkRestartReadBack: state size (key+value bytes)")

// BenchmarkRestartReadBack measures what the integrity checks cost a
// restarted writer on a file store: the start check (one listing of
// shared/), the first checkpoint after the restart (it reads back every
// shared object it reuses, once), a second checkpoint (reads nothing), and
// one unbounded scrub pass (ScrubOnce) over the same objects.
//
//	go test ./checkpoint -run '^$' -bench RestartReadBack -benchtime 1x -integrity.size 256MiB
func BenchmarkRestartReadBack(b *testing.B) {
	ctx := context.Background()
	size, err := job.ParseBytes(*integritySize)
	if err != nil {
		b.Fatal(err)
	}
	root := b.TempDir()
	const slots = 2
	s, _ := newBenchState(b, filepath.Join(root, "db"), size, slots, 7)
	defer s.Close()
	store, err := NewFileStore(filepath.Join(root, "store"), true)
	if err != nil {
		b.Fatal(err)
	}
	cfg := WriterConfig{Job: "bench", KeyGroups: benchstate.KeyGroups, Slots: slots, Retain: 3, Logger: quietLogger(), Scrub: ScrubConfig{Disabled: true}}
	w1, err := NewWriter(ctx, store, cfg)
	if err != nil {
		b.Fatal(err)
	}
	n := 0
	take := func(w *Writer) (*Manifest, time.Duration) {
		n++
		snaps, _ := s.snapshot(b, filepath.Join(root, "local", time.Now().Format("150405.000000000")))
		t := time.Now()
		m, err := w.Commit(ctx, w.NextID(), Meta{SourceSeq: uint64(n)}, snaps)
		if err != nil {
			b.Fatal(err)
		}
		return m, time.Since(t)
	}
	_, _ = take(w1)
	s.UpdateN(b, s.Keys/100)
	_, steadyBefore := take(w1)
	w1.Close(ctx)
	for b.Loop() {
		s.UpdateN(b, s.Keys/100)
		t := time.Now()
		w2, err := NewWriter(ctx, store, cfg)
		if err != nil {
			b.Fatal(err)
		}
		start := time.Since(t)
		m1, first := take(w2)
		s.UpdateN(b, s.Keys/100)
		_, second := take(w2)
		t = time.Now()
		rep, err := w2.ScrubOnce(ctx)
		if err != nil {
			b.Fatal(err)
		}
		scrub := time.Since(t)
		w2.Close(ctx)
		b.ReportMetric(float64(start.Microseconds())/1000, "start-check-ms")
		b.ReportMetric(float64(steadyBefore.Microseconds())/1000, "commit-before-restart-ms")
		b.ReportMetric(float64(first.Microseconds())/1000, "first-commit-ms")
		b.ReportMetric(float64(second.Microseconds())/1000, "second-commit-ms")
		b.ReportMetric(float64(m1.Figures.BytesReused)/(1<<20), "read-back-MiB")
		b.ReportMetric(float64(rep.Bytes)/(1<<20)/scrub.Seconds(), "scrub-unbounded-MiB/s")
	}
}

// BenchmarkScrubRate runs the background scrub with the default rate over
// a store for 3 s per iteration, every object always due, and reports what
// it read: the bound it keeps (DefaultScrubBytesPerSecond, each object
// counted as at least ScrubMinObjectCost).
//
//	go test ./checkpoint -run '^$' -bench ScrubRate -benchtime 1x
func BenchmarkScrubRate(b *testing.B) {
	ctx := context.Background()
	size, err := job.ParseBytes(*integritySize)
	if err != nil {
		b.Fatal(err)
	}
	root := b.TempDir()
	const slots = 2
	s, _ := newBenchState(b, filepath.Join(root, "db"), size, slots, 7)
	defer s.Close()
	fs, err := NewFileStore(filepath.Join(root, "store"), true)
	if err != nil {
		b.Fatal(err)
	}
	cfg := WriterConfig{Job: "bench", KeyGroups: benchstate.KeyGroups, Slots: slots, Logger: quietLogger(), Scrub: ScrubConfig{Disabled: true}}
	w1, err := NewWriter(ctx, fs, cfg)
	if err != nil {
		b.Fatal(err)
	}
	snaps, _ := s.snapshot(b, filepath.Join(root, "local"))
	m, err := w1.Commit(ctx, 1, Meta{}, snaps)
	if err != nil {
		b.Fatal(err)
	}
	w1.Close(ctx)
	for b.Loop() {
		cs := &countingStore{Store: fs}
		cfg.Scrub = ScrubConfig{Every: time.Nanosecond}
		w, err := NewWriter(ctx, cs, cfg)
		if err != nil {
			b.Fatal(err)
		}
		t := time.Now()
		time.Sleep(3 * time.Second)
		w.Close(ctx)
		d := time.Since(t)
		b.ReportMetric(float64(cs.bytes.Load())/(1<<20)/d.Seconds(), "MiB/s")
		b.ReportMetric(float64(cs.gets.Load())/d.Seconds(), "objects/s")
		b.ReportMetric(float64(len(m.Objects)), "objects-in-checkpoint")
	}
}
