package model

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const mib = 1 << 20

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-6*math.Max(1, math.Abs(b)) }

var t0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

// calibrated returns a model with every term known: 10 MiB/s, 4 ms per
// object, 20 ms open, 4 s/GiB decode, 2 s/GiB move.
func calibrated(t *testing.T) *Model {
	t.Helper()
	m := New()
	m.SetClock(func() time.Time { return t0 })
	// Two transfers with different bytes per object separate bandwidth and
	// latency: s = bytes/10MiB + objects/8 × 0.004.
	for _, tr := range []Transfer{{Bytes: 10 * mib, Objects: 8}, {Bytes: 20 * mib, Objects: 800}} {
		tr.Parallelism = 8
		tr.Seconds = float64(tr.Bytes)/(10*mib) + float64(tr.Objects)/8*0.004
		tr.From = "standby sync"
		tr.Time = t0.Add(-3 * time.Minute)
		if err := m.ObserveTransfer(tr); err != nil {
			t.Fatal(err)
		}
	}
	m.st.Open = Term{Value: 0.020, Samples: 1, Measured: t0}
	m.st.Decode = Term{Value: 4, Samples: 1, Measured: t0}
	m.st.Move = Term{Value: 2, Samples: 1, Measured: t0}
	return m
}

func TestFitSeparatesBandwidthAndLatency(t *testing.T) {
	terms := calibrated(t).Terms()
	if !near(terms[TermBandwidth].Value, 10*mib) || !near(terms[TermLatency].Value, 0.004) {
		t.Fatalf("bandwidth %v latency %v, want 10 MiB/s and 4 ms", terms[TermBandwidth].Value, terms[TermLatency].Value)
	}
}

// TestEveryPath checks the sum of terms for each restore path.
func TestEveryPath(t *testing.T) {
	m := calibrated(t)
	fetch := func(b int64, n int) float64 { return float64(b)/(10*mib) + float64(n)/8*0.004 }
	cases := []struct {
		name string
		in   Input
		want float64
	}{
		{"local same incremental", Input{Mode: Incremental, Source: SourceLocal}, 0.020},
		{"local same full", Input{Mode: Full, Source: SourceLocal, BytesRebuild: 512 * mib}, 0.020 + 2},
		{"standby incremental delta", Input{Mode: Incremental, Source: SourceStandby, Objects: 3, BytesFetch: 5 * mib}, 0.020 + fetch(5*mib, 3)},
		// A full checkpoint's fetch and rebuild overlap: the slower counts.
		{"standby full", Input{Mode: Full, Source: SourceStandby, Objects: 2, BytesFetch: 1 * mib, BytesRebuild: 256 * mib}, 0.020 + 1},
		{"store same incremental", Input{Mode: Incremental, Source: SourceStore, Objects: 40, BytesFetch: 100 * mib}, 0.020 + fetch(100*mib, 40)},
		{"store same full", Input{Mode: Full, Source: SourceStore, Objects: 4, BytesFetch: 100 * mib, BytesRebuild: 100 * mib}, 0.020 + fetch(100*mib, 4)},
		{"store same full, rebuild-bound", Input{Mode: Full, Source: SourceStore, Objects: 4, BytesFetch: 2 * mib, BytesRebuild: 1024 * mib}, 0.020 + 4},
		{"store scale-up incremental (clip, no move)", Input{Mode: Incremental, Source: SourceStore, Rescale: Up, Objects: 40, BytesFetch: 100 * mib, BytesRebuild: 0}, 0.020 + fetch(100*mib, 40)},
		{"store scale-up full", Input{Mode: Full, Source: SourceStore, Rescale: Up, Objects: 4, BytesFetch: 100 * mib, BytesRebuild: 100 * mib}, 0.020 + fetch(100*mib, 4)},
		{"store scale-down incremental", Input{Mode: Incremental, Source: SourceStore, Rescale: Down, Objects: 40, BytesFetch: 100 * mib, BytesRebuild: 50 * mib}, 0.020 + fetch(100*mib, 40) + 2*50.0/1024},
		{"store scale-down full", Input{Mode: Full, Source: SourceStore, Rescale: Down, Objects: 4, BytesFetch: 100 * mib, BytesRebuild: 100 * mib}, 0.020 + fetch(100*mib, 4)},
		{"full onto 2 slots, 2 workers", Input{Mode: Full, Source: SourceLocal, BytesRebuild: 512 * mib, Workers: 2}, 0.020 + 1},
		{"parallelism 1", Input{Mode: Incremental, Source: SourceStore, Objects: 10, BytesFetch: 10 * mib, Parallelism: 1}, 0.020 + 1 + 10*0.004},
	}
	for _, c := range cases {
		p := m.Predict(c.in)
		if !p.OK || !near(p.Seconds, c.want) || !near(p.Fetch+p.Latency+p.Rebuild+p.Open-p.Overlap, p.Seconds) {
			t.Errorf("%s: %+v, want %.6f s", c.name, p, c.want)
		}
	}
}

func TestCalibratingUntilEveryNeededTermIsKnown(t *testing.T) {
	m := New()
	p := m.Predict(Input{Mode: Incremental, Source: SourceLocal})
	if p.OK || p.Seconds != 0 || p.Short() != "calibrating" || !strings.Contains(p.Text(), "open time") {
		t.Fatalf("empty model predicted %+v %q", p, p.Text())
	}
	if _, err := m.ObserveRestore(Input{Mode: Incremental, Source: SourceLocal}, 25*time.Millisecond, "restore"); err != nil {
		t.Fatal(err)
	}
	if p := m.Predict(Input{Mode: Incremental, Source: SourceLocal}); !p.OK || !near(p.Seconds, 0.025) {
		t.Fatalf("after a local restore: %+v", p)
	}
	// The store needs a bandwidth, a full restore its decode rate, a
	// scale-down its move rate.
	for _, in := range []Input{
		{Mode: Incremental, Source: SourceStore, Objects: 1, BytesFetch: mib},
		{Mode: Full, Source: SourceLocal, BytesRebuild: mib},
		{Mode: Incremental, Source: SourceLocal, Rescale: Down, BytesRebuild: mib},
	} {
		if p := m.Predict(in); p.OK || len(p.Missing) != 1 || p.Short() != "calibrating" {
			t.Errorf("%+v: %+v", in, p)
		}
	}
	// An upload counts until a download is measured; a download replaces it.
	_ = m.ObserveTransfer(Transfer{Bytes: 4 * mib, Objects: 1, Seconds: 1, Upload: true, From: "upload"})
	if bw := m.Terms()[TermBandwidth]; !near(bw.Value, 4*mib) || bw.From != "upload" {
		t.Fatalf("upload bandwidth %+v", bw)
	}
	_ = m.ObserveTransfer(Transfer{Bytes: 8 * mib, Objects: 1, Seconds: 1, From: "standby sync"})
	if bw := m.Terms()[TermBandwidth]; !near(bw.Value, 8*mib) {
		t.Fatalf("download bandwidth %+v", bw)
	}
	if p := m.Predict(Input{Mode: Incremental, Source: SourceStore, Objects: 1, BytesFetch: 8 * mib}); !p.OK || !near(p.Seconds, 1.025) {
		t.Fatalf("store: %+v", p)
	}
}

func TestRestoresCalibrateRebuildTerms(t *testing.T) {
	m := New()
	_, _ = m.ObserveRestore(Input{Mode: Incremental, Source: SourceLocal}, 100*time.Millisecond, "drill")
	_ = m.ObserveTransfer(Transfer{Bytes: 10 * mib, Objects: 1, Seconds: 1, From: "standby sync"})
	// A full restore of 512 MiB, 10 MiB fetched: 0.1 open + max(1 fetch, 2 rebuild).
	before, err := m.ObserveRestore(Input{Mode: Full, Source: SourceStandby, Objects: 1, BytesFetch: 10 * mib, BytesRebuild: 512 * mib}, 2100*time.Millisecond, "drill")
	if err != nil || before.OK {
		t.Fatalf("before calibration: %+v %v", before, err)
	}
	if d := m.Terms()[TermDecode]; !near(d.Value, 4) {
		t.Fatalf("decode %v s/GiB, want 4", d.Value)
	}
	_, _ = m.ObserveRestore(Input{Mode: Incremental, Source: SourceLocal, Rescale: Down, BytesRebuild: 256 * mib}, 600*time.Millisecond, "drill")
	if mv := m.Terms()[TermMove]; !near(mv.Value, 2) {
		t.Fatalf("move %v s/GiB, want 2", mv.Value)
	}
	// A store restore with no rebuild is a transfer (its time less open).
	_, _ = m.ObserveRestore(Input{Mode: Incremental, Source: SourceStore, Objects: 1, BytesFetch: 30 * mib}, 3100*time.Millisecond, "restore")
	if bw, lat := m.Terms()[TermBandwidth], m.Terms()[TermLatency]; !near(bw.Value, 10*mib) || bw.Samples != 2 || lat.Value > 1e-9 {
		t.Fatalf("bandwidth %v", bw.Value)
	}
}

func TestTextNamesInputs(t *testing.T) {
	m := calibrated(t)
	p := m.Predict(Input{Mode: Full, Source: SourceStore, Objects: 4, BytesFetch: 15_300_000, BytesRebuild: 15_300_000})
	got := p.Text()
	for _, want := range []string{"4 objects", "15.3 MB at 10.5 MB/s measured 3 min ago", "rebuild (15.3 MB, scaled to 1 worker)", "ms open", "= "} {
		if !strings.Contains(got, want) {
			t.Errorf("%q lacks %q", got, want)
		}
	}
}

func TestPersisted(t *testing.T) {
	dir := t.TempDir()
	m := Load(dir)
	if _, err := m.ObserveRestore(Input{Mode: Incremental, Source: SourceLocal}, 30*time.Millisecond, "restore"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, File)); err != nil {
		t.Fatal(err)
	}
	if p := Load(dir).Predict(Input{Mode: Incremental, Source: SourceLocal}); !p.OK || !near(p.Seconds, 0.03) {
		t.Fatalf("reloaded: %+v", p)
	}
	_ = os.WriteFile(filepath.Join(dir, File), []byte("{bad"), 0o644)
	if p := Load(dir).Predict(Input{Mode: Incremental, Source: SourceLocal}); p.OK {
		t.Fatalf("a corrupt file must start over: %+v", p)
	}
}

func TestPredictionOnline(t *testing.T) {
	terms := map[string]Term{
		TermBandwidth: {Value: 100 << 20, Samples: 1}, TermLatency: {Value: 0.01, Samples: 1},
		TermOpen: {Value: 0.2, Samples: 1}, TermDecode: {Value: 3, Samples: 1}, TermMove: {Value: 2, Samples: 1},
	}
	p := predict(terms, Input{Mode: Incremental, Source: SourceStore, Objects: 80, BytesFetch: 1 << 30}, time.Now())
	first, local, ok := p.Online()
	if !ok || first != 0.2 || local < 10.53 || local > 10.55 {
		t.Fatalf("online %v %v %v, want 0.2 s and 0.2 + 10.24 + 0.1 s", first, local, ok)
	}
	for _, in := range []Input{
		{Mode: Full, Source: SourceStore, BytesFetch: 1 << 30, BytesRebuild: 1 << 30},
		{Mode: Incremental, Source: SourceStore, Rescale: Down, BytesFetch: 1 << 30, BytesRebuild: 1 << 29},
	} {
		if _, _, ok := predict(terms, in, time.Now()).Online(); ok {
			t.Fatalf("%+v: an online prediction for a restore that cannot be online", in)
		}
	}
	if _, _, ok := predict(map[string]Term{}, Input{Mode: Incremental, BytesFetch: 1}, time.Now()).Online(); ok {
		t.Fatal("an online prediction while calibrating")
	}
}

// TestRebuildRateByWorkers: a rebuild rate is kept per worker count, and a
// worker count never measured is scaled from the per-worker rate.
func TestRebuildRateByWorkers(t *testing.T) {
	m := New()
	m.SetClock(func() time.Time { return t0 })
	_, _ = m.ObserveRestore(Input{Mode: Incremental, Source: SourceLocal}, 100*time.Millisecond, "drill")
	full := func(workers int) Input {
		return Input{Mode: Full, Source: SourceStandby, BytesRebuild: 512 * mib, Workers: workers}
	}
	// Two workers: 0.1 open + 1.5 s for 0.5 GiB (3 s/GiB wall, 6 per worker).
	_, _ = m.ObserveRestore(full(2), 1600*time.Millisecond, "drill")
	// Before one worker is measured, it is scaled from the per-worker rate.
	p1 := m.Predict(full(1))
	if !p1.OK || p1.RebuildWorkers != 0 || !near(p1.Rebuild, 3) || !strings.Contains(p1.Text(), "scaled to 1 worker") {
		t.Fatalf("one worker, unmeasured: %+v %q", p1, p1.Text())
	}
	// One worker measured: 0.1 open + 2 s (4 s/GiB wall): not twice the two's.
	_, _ = m.ObserveRestore(full(1), 2100*time.Millisecond, "drill")
	terms := m.Terms()
	if !near(terms[RebuildKey(TermDecode, 1)].Value, 4) || !near(terms[RebuildKey(TermDecode, 2)].Value, 3) {
		t.Fatalf("terms %+v", terms)
	}
	for _, c := range []struct {
		workers, measuredAt int
		rebuild             float64
	}{{1, 1, 2}, {2, 2, 1.5}, {0, 1, 2}} {
		p := m.Predict(full(c.workers))
		if !p.OK || p.RebuildWorkers != c.measuredAt || !near(p.Rebuild, c.rebuild) || !near(p.Seconds, 0.1+c.rebuild) {
			t.Errorf("%d workers: %+v, want %v s rebuild measured at %d", c.workers, p, c.rebuild, c.measuredAt)
		}
	}
	if got := m.Predict(full(2)).Text(); !strings.Contains(got, "measured at 2 workers") {
		t.Errorf("text %q", got)
	}
	// Four workers were never measured: the per-worker rate (the median
	// of 6 and 4 s/GiB) ÷ 4.
	p4 := m.Predict(full(4))
	if !p4.OK || p4.RebuildWorkers != 0 || !near(p4.Rebuild, 5.0/4/2) {
		t.Errorf("four workers: %+v", p4)
	}
	// The rates survive a reload.
	st := m.State()
	if len(st.Rebuild) != 2 {
		t.Fatalf("state %+v", st)
	}
}

// TestFullRestoreOverlapsFetchAndRebuild: a full restore decodes segments as
// they arrive. It calibrates its rebuild only when the fetch cannot hide it.
func TestFullRestoreOverlapsFetchAndRebuild(t *testing.T) {
	m := New()
	m.SetClock(func() time.Time { return t0 })
	_, _ = m.ObserveRestore(Input{Mode: Incremental, Source: SourceLocal}, 100*time.Millisecond, "drill")
	_ = m.ObserveTransfer(Transfer{Bytes: 10 * mib, Objects: 1, Seconds: 1, From: "standby sync"})
	// Fetch-bound: 100 MiB at 10 MiB/s (10 s) hides a rebuild of 0.5 GiB.
	fetchBound := Input{Mode: Full, Source: SourceStore, Objects: 1, BytesFetch: 100 * mib, BytesRebuild: 512 * mib, Workers: 2}
	if _, err := m.ObserveRestore(fetchBound, 10100*time.Millisecond, "restore"); err != nil {
		t.Fatal(err)
	}
	if m.Terms()[TermDecode].Known() {
		t.Fatalf("a fetch-bound full restore calibrated decode: %+v", m.Terms())
	}
	// Rebuild-bound: 1 MiB (0.1 s) fetched, 0.1 open + 2 s: decode 4 s/GiB.
	rebuildBound := Input{Mode: Full, Source: SourceStore, Objects: 1, BytesFetch: mib, BytesRebuild: 512 * mib, Workers: 2}
	_, _ = m.ObserveRestore(rebuildBound, 2100*time.Millisecond, "restore")
	if d := m.Terms()[RebuildKey(TermDecode, 2)]; !near(d.Value, 4) {
		t.Fatalf("decode@2 %+v, want 4 s/GiB", d)
	}
	p := m.Predict(fetchBound)
	if !p.OK || !near(p.Overlap, 2) || !near(p.Seconds, 0.1+10) || !strings.HasPrefix(p.Text(), "max(1 objects") {
		t.Fatalf("fetch-bound: %+v %q", p, p.Text())
	}
	// An incremental scale-down fetches, then moves: no overlap.
	_, _ = m.ObserveRestore(Input{Mode: Incremental, Source: SourceLocal, Rescale: Down, BytesRebuild: 256 * mib, Workers: 1}, 600*time.Millisecond, "drill")
	down := m.Predict(Input{Mode: Incremental, Source: SourceStore, Rescale: Down, Objects: 1, BytesFetch: 10 * mib, BytesRebuild: 256 * mib, Workers: 1})
	if !down.OK || down.Overlap != 0 || !near(down.Seconds, 0.1+1+0.5) {
		t.Fatalf("scale-down: %+v", down)
	}
}

// TestOnlineFirstCountsRemoteFiles: an online restore's time to processing
// is the open time plus the placing of each remote file, a term measured by
// online restores.
func TestOnlineFirstCountsRemoteFiles(t *testing.T) {
	m := New()
	m.SetClock(func() time.Time { return t0 })
	_, _ = m.ObserveRestore(Input{Mode: Incremental, Source: SourceLocal}, 20*time.Millisecond, "drill")
	_ = m.ObserveTransfer(Transfer{Bytes: 10 * mib, Objects: 1, Seconds: 1, From: "standby sync"})
	in := func(objects int) Input {
		return Input{Mode: Incremental, Source: SourceStore, Objects: objects, BytesFetch: 100 * mib}
	}
	p := m.Predict(in(40))
	if first, _, ok := p.Online(); !ok || !near(first, 0.020) || !strings.Contains(p.OnlineText(), "at least 20 ms (placing remote files not measured yet)") {
		t.Fatalf("before an online restore: %v %q", first, p.OnlineText())
	}
	// 40 files placed in 0.02 + 0.04 s: 1 ms each.
	if _, err := m.ObserveOnline(in(40), 60*time.Millisecond, "drill"); err != nil {
		t.Fatal(err)
	}
	if r := m.Terms()[TermRemote]; !near(r.Value, 0.001) || r.Samples != 1 {
		t.Fatalf("remote term %+v, want 1 ms per object", r)
	}
	p = m.Predict(in(100))
	first, local, ok := p.Online()
	if !ok || !near(first, 0.120) || !near(local, 0.120+10) || p.OnlineText() != "online: processing after 120 ms, fully local after 10.12 s" {
		t.Fatalf("100 files: %v %v %v %q", first, local, ok, p.OnlineText())
	}
	// A restore that fetched nothing places nothing remote.
	if first, _, _ := m.Predict(Input{Mode: Incremental, Source: SourceLocal}).Online(); !near(first, 0.020) {
		t.Fatalf("local: %v", first)
	}
}

// TestTermIsMedianOfRecent: a term is the median of its last five
// measurements, so one outlier does not move it.
func TestTermIsMedianOfRecent(t *testing.T) {
	m := New()
	for _, ms := range []int{20, 22, 400, 21} {
		_, _ = m.ObserveRestore(Input{Mode: Incremental, Source: SourceLocal}, time.Duration(ms)*time.Millisecond, "restore")
	}
	if o := m.Terms()[TermOpen]; !near(o.Value, 0.0215) || o.Samples != 4 {
		t.Fatalf("open %+v, want the median 21.5 ms of 20, 22, 400, 21", o)
	}
	for _, ms := range []int{30, 30, 30} {
		_, _ = m.ObserveRestore(Input{Mode: Incremental, Source: SourceLocal}, time.Duration(ms)*time.Millisecond, "restore")
	}
	// The last five: 400, 21, 30, 30, 30.
	if o := m.Terms()[TermOpen]; !near(o.Value, 0.030) || len(o.Recent) != 5 || o.Samples != 7 {
		t.Fatalf("open %+v, want 30 ms over the last five", o)
	}
	// A term saved before Recent was kept starts from its value.
	old := Term{Value: 0.010, Samples: 3}
	old.observe(0.050, t0, "restore")
	if !near(old.Value, 0.030) || len(old.Recent) != 2 {
		t.Fatalf("old term %+v", old)
	}
}
