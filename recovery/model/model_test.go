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
	// Two large transfers measure the bandwidth, a small one (a standby's
	// sync of a small delta) the latency: s = bytes/10MiB + objects/8 × 0.004.
	for _, tr := range []Transfer{{Bytes: 10 * mib, Objects: 8}, {Bytes: 20 * mib, Objects: 800}, {Bytes: 64 << 10, Objects: 16}} {
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
	if !near(terms[TermBandwidth].Value, 10*mib) || !near(terms[TermLatency].Value, 0.004) || terms[TermLatency].Samples != 1 || terms[TermBandwidth].Samples != 2 {
		t.Fatalf("bandwidth %+v latency %+v, want 10 MiB/s from 2 transfers and 4 ms from 1", terms[TermBandwidth], terms[TermLatency])
	}
}

// TestFitLatencyOnlyFromSmallTransfers: the drill's throttled file store,
// where a token bucket lets each transfer's first 0.5 MB through at
// once (seconds = (bytes − 0.5 MB) ÷ 10 MB/s), a request costs nothing, and
// a node's large transfers have nearly proportional bytes and objects. A
// joint fit of bandwidth and latency read 25–31 ms "per object" into them
// (the burst spread over the objects), which × 130 ranged reads ÷ 8 put
// 0.4–0.5 s into a 0.73 s full restore. Measured apart, the latency comes
// from the small transfers alone, and the full restore is predicted within
// a few percent.
func TestFitLatencyOnlyFromSmallTransfers(t *testing.T) {
	const rate, burst = 10e6, 0.5e6
	m := New()
	m.SetClock(func() time.Time { return t0 })
	_, _ = m.ObserveRestore(Input{Mode: Incremental, Source: SourceLocal}, 7*time.Millisecond, "drill")
	link := func(bytes int64) float64 { return max(0, float64(bytes)-burst) / rate }
	// Syncs: the chain's first checkpoint, two small deltas (read within
	// the burst: 0.3 ms for their few requests), the full checkpoint.
	for _, tr := range []Transfer{
		{Bytes: 16_119_081, Objects: 18, Seconds: link(16_119_081)},
		{Bytes: 95_000, Objects: 7, Seconds: 0.0003},
		{Bytes: 90_000, Objects: 7, Seconds: 0.0003},
		{Bytes: 7_541_881, Objects: 4, Seconds: link(7_541_881)},
	} {
		tr.From, tr.Parallelism = "standby sync", 8
		_ = m.ObserveTransfer(tr)
	}
	// Three incremental restores from the store: 24 files, 16.5 MB.
	inc := Input{Mode: Incremental, Source: SourceStore, Objects: 24, SSTs: 14, BytesFetch: 16_473_711}
	for range 3 {
		_, _ = m.ObserveRestore(inc, time.Duration((0.007+link(inc.BytesFetch))*float64(time.Second)), "drill")
	}
	terms := m.Terms()
	if lat := terms[TermLatency]; !lat.Known() || lat.Value > 0.001 {
		t.Fatalf("latency %+v: the small syncs say under 1 ms", lat)
	}
	if bw := terms[TermBandwidth].Value; bw < rate || bw > 1.08*rate {
		t.Fatalf("bandwidth %.0f B/s, want the link's 10 MB/s within its burst's 8%%", bw)
	}
	// The joint least-squares fit the model had, for comparison: it gives
	// tens of ms per object on the same transfers.
	if _, jointLat := jointFit(m.State().Transfers); jointLat < 0.02 {
		t.Fatalf("joint fit latency %v: the fixture no longer reproduces the collinear case", jointLat)
	}
	full := Input{Mode: Full, Source: SourceStore, Requests: 130, BytesFetch: 7_541_881, BytesRebuild: 7_541_881, Workers: 2}
	m.st.Rebuild = map[string]Term{RebuildKey(TermDecode, 2): {Value: 17, Samples: 1}}
	measured := 0.007 + link(full.BytesFetch)
	p := m.Predict(full)
	if e := (measured - p.Seconds) / p.Seconds; !p.OK || math.Abs(e) > 0.1 {
		t.Fatalf("full restore predicted %v s (%q), measured %v s: %+.0f%%", p.Seconds, p.Text(), measured, e*100)
	}
	if e := (0.007 + link(inc.BytesFetch) - m.Predict(inc).Seconds) / m.Predict(inc).Seconds; math.Abs(e) > 0.02 {
		t.Fatalf("incremental restore off by %+.1f%%", e*100)
	}
}

// jointFit is the least-squares fit through the origin of seconds = bytes/bw
// + objects/par × latency over the large downloads: the fit the model used
// before it measured the two apart (kept here to show what it gave).
func jointFit(ts []Transfer) (bw, lat float64) {
	var sxx, sxy, syy, sxz, syz float64
	for _, t := range ts {
		if t.Upload || t.small() {
			continue
		}
		x, y, z := float64(t.Bytes), float64(t.Objects)/float64(max(1, t.Parallelism)), t.Seconds
		sxx, sxy, syy, sxz, syz = sxx+x*x, sxy+x*y, syy+y*y, sxz+x*z, syz+y*z
	}
	det := sxx*syy - sxy*sxy
	return det / (sxz*syy - syz*sxy), (sxx*syz - sxy*sxz) / det
}

// TestLatencyUnknownWithoutSmallTransfers: large transfers alone measure the
// bandwidth with the per-object costs in it; the latency term stays
// unmeasured (0), and the text says so.
func TestLatencyUnknownWithoutSmallTransfers(t *testing.T) {
	m := New()
	m.SetClock(func() time.Time { return t0 })
	_, _ = m.ObserveRestore(Input{Mode: Incremental, Source: SourceLocal}, 10*time.Millisecond, "drill")
	_ = m.ObserveTransfer(Transfer{Bytes: 10 * mib, Objects: 10, Seconds: 1.1, From: "standby sync"})
	_ = m.ObserveTransfer(Transfer{Bytes: 30 * mib, Objects: 10, Seconds: 3.1, From: "standby sync"})
	terms := m.Terms()
	if terms[TermLatency].Known() || terms[TermLatency].Value != 0 || !near(terms[TermBandwidth].Value, 40*mib/4.2) {
		t.Fatalf("terms %+v", terms)
	}
	p := m.Predict(Input{Mode: Incremental, Source: SourceStore, Objects: 10, BytesFetch: 10 * mib})
	if !p.OK || !near(p.Seconds, 0.010+4.2/4) || !strings.Contains(p.Text(), "per-object latency not measured yet") {
		t.Fatalf("%+v %q", p, p.Text())
	}
	// Only small transfers: the latency, no bandwidth: calibrating.
	s := New()
	_, _ = s.ObserveRestore(Input{Mode: Incremental, Source: SourceLocal}, 10*time.Millisecond, "drill")
	_ = s.ObserveTransfer(Transfer{Bytes: 1000, Objects: 8, Parallelism: 8, Seconds: 0.002, From: "standby sync"})
	if p := s.Predict(Input{Mode: Incremental, Source: SourceStore, Objects: 1, BytesFetch: mib}); p.OK || !near(s.Terms()[TermLatency].Value, 0.002) {
		t.Fatalf("small transfers only: %+v %+v", p, s.Terms())
	}
}

// TestSmallTransfersKeepTheLargeOnes: frequent small syncs do not push the
// bandwidth's transfers out of the kept window, nor the reverse.
func TestSmallTransfersKeepTheLargeOnes(t *testing.T) {
	m := New()
	for i := range 5 {
		_ = m.ObserveTransfer(Transfer{Bytes: 10 * mib, Objects: 1, Seconds: float64(i + 1), From: "standby sync"})
	}
	for range 3 * maxTransfers {
		_ = m.ObserveTransfer(Transfer{Bytes: 1000, Objects: 2, Seconds: 0.001, From: "standby sync"})
	}
	var large, small int
	for _, tr := range m.State().Transfers {
		if tr.small() {
			small++
		} else {
			large++
		}
	}
	if large != 5 || small != maxTransfers {
		t.Fatalf("%d large, %d small kept, want 5 and %d", large, small, maxTransfers)
	}
	for i := range 2 * maxTransfers {
		_ = m.ObserveTransfer(Transfer{Bytes: 10 * mib, Objects: 1, Seconds: float64(i + 1), From: "standby sync"})
	}
	st := m.State().Transfers
	if len(st) != 2*maxTransfers || st[len(st)-1].Seconds != 2*maxTransfers {
		t.Fatalf("%d kept, last %+v", len(st), st[len(st)-1])
	}
}

// TestEveryPath checks the sum of terms for each restore path.
func TestEveryPath(t *testing.T) {
	m := calibrated(t)
	fetch := func(b int64, n int) float64 { return float64(b)/(10*mib) + float64(n)/8*0.004 }
	// A full checkpoint's reads write no file: Requests, at the per-object
	// latency until a full restore measures the request term.
	cases := []struct {
		name string
		in   Input
		want float64
	}{
		{"local same incremental", Input{Mode: Incremental, Source: SourceLocal}, 0.020},
		{"local same full", Input{Mode: Full, Source: SourceLocal, BytesRebuild: 512 * mib}, 0.020 + 2},
		{"standby incremental delta", Input{Mode: Incremental, Source: SourceStandby, Objects: 3, BytesFetch: 5 * mib}, 0.020 + fetch(5*mib, 3)},
		// A full checkpoint's fetch and rebuild overlap: the slower counts.
		{"standby full", Input{Mode: Full, Source: SourceStandby, Requests: 2, BytesFetch: 1 * mib, BytesRebuild: 256 * mib}, 0.020 + 1},
		{"store same incremental", Input{Mode: Incremental, Source: SourceStore, Objects: 40, BytesFetch: 100 * mib}, 0.020 + fetch(100*mib, 40)},
		{"store same full", Input{Mode: Full, Source: SourceStore, Requests: 130, BytesFetch: 100 * mib, BytesRebuild: 100 * mib}, 0.020 + fetch(100*mib, 130)},
		{"store same full, rebuild-bound", Input{Mode: Full, Source: SourceStore, Requests: 4, BytesFetch: 2 * mib, BytesRebuild: 1024 * mib}, 0.020 + 4},
		{"store scale-up incremental (clip, no move)", Input{Mode: Incremental, Source: SourceStore, Rescale: Up, Objects: 40, BytesFetch: 100 * mib, BytesRebuild: 0}, 0.020 + fetch(100*mib, 40)},
		// 2 → 3: the middle slot scans the key groups of the old slot
		// that is not its base.
		{"local scale-up incremental, key groups moved", Input{Mode: Incremental, Source: SourceLocal, Rescale: Up, BytesRebuild: 256 * mib}, 0.020 + 2*256.0/1024},
		{"store scale-up full", Input{Mode: Full, Source: SourceStore, Rescale: Up, Requests: 130, BytesFetch: 100 * mib, BytesRebuild: 100 * mib}, 0.020 + fetch(100*mib, 130)},
		{"store scale-down incremental", Input{Mode: Incremental, Source: SourceStore, Rescale: Down, Objects: 40, BytesFetch: 100 * mib, BytesRebuild: 50 * mib}, 0.020 + fetch(100*mib, 40) + 2*50.0/1024},
		{"store scale-down full", Input{Mode: Full, Source: SourceStore, Rescale: Down, Requests: 130, BytesFetch: 100 * mib, BytesRebuild: 100 * mib}, 0.020 + fetch(100*mib, 130)},
		{"full onto 2 slots, 2 workers", Input{Mode: Full, Source: SourceLocal, BytesRebuild: 512 * mib, Workers: 2}, 0.020 + 1},
		{"parallelism 1", Input{Mode: Incremental, Source: SourceStore, Objects: 10, BytesFetch: 10 * mib, Parallelism: 1}, 0.020 + 1 + 10*0.004},
	}
	check := func(name string, in Input, want float64) {
		t.Helper()
		p := m.Predict(in)
		if !p.OK || !near(p.Seconds, want) || !near(p.Fetch+p.Latency+p.Rebuild+p.Open-p.Overlap, p.Seconds) {
			t.Errorf("%s: %+v, want %.6f s", name, p, want)
		}
	}
	for _, c := range cases {
		check(c.name, c.in, c.want)
	}
	// A fetch-bound full restore from the store measures the request term:
	// 100 MiB (10 s) + 130 reads ÷ 8 × 1 ms + 20 ms open.
	full := Input{Mode: Full, Source: SourceStore, Requests: 130, BytesFetch: 100 * mib, BytesRebuild: 100 * mib}
	if _, err := m.ObserveRestore(full, time.Duration((0.020+10+130.0/8*0.001)*float64(time.Second)), "drill"); err != nil {
		t.Fatal(err)
	}
	if r := m.Terms()[TermRequest]; !near(r.Value, 0.001) || r.Samples != 1 {
		t.Fatalf("request term %+v, want 1 ms", r)
	}
	check("store same full, request term measured", full, 0.020+10+130.0/8*0.001)
	check("store scale-down full, request term measured", Input{Mode: Full, Source: SourceStore, Rescale: Down, Requests: 66, BytesFetch: 50 * mib, BytesRebuild: 50 * mib}, 0.020+5+66.0/8*0.001)
	// Whole objects keep the per-object latency.
	check("store same incremental, request term measured", Input{Mode: Incremental, Source: SourceStore, Objects: 40, BytesFetch: 100 * mib}, 0.020+fetch(100*mib, 40))
}

// TestRequestTermOnlyFromFetchBoundFullRestores: a rebuild-bound full
// restore measures its decode rate, not its requests; a full restore
// without a request count (a Result's) measures neither.
func TestRequestTermOnlyFromFetchBoundFullRestores(t *testing.T) {
	m := calibrated(t)
	_, _ = m.ObserveRestore(Input{Mode: Full, Source: SourceStore, Requests: 130, BytesFetch: mib, BytesRebuild: 512 * mib}, 2020*time.Millisecond, "drill")
	if m.Terms()[TermRequest].Known() {
		t.Fatalf("rebuild-bound restore measured requests: %+v", m.Terms()[TermRequest])
	}
	_, _ = m.ObserveRestore(Input{Mode: Full, Source: SourceStore, BytesFetch: 100 * mib, BytesRebuild: 100 * mib}, 11*time.Second, "restore")
	if m.Terms()[TermRequest].Known() {
		t.Fatalf("no request count, yet measured: %+v", m.Terms()[TermRequest])
	}
	p := m.Predict(Input{Mode: Full, Source: SourceStore, Requests: 130, BytesFetch: 100 * mib, BytesRebuild: 100 * mib})
	if !p.RequestsAtObject || !near(p.Requests, 130.0/8*0.004) || !strings.Contains(p.Text(), "ranged reads not measured yet") {
		t.Fatalf("%+v %q", p, p.Text())
	}
	// A fetch faster than its bytes at the bandwidth measures 0, not less.
	_, _ = m.ObserveRestore(Input{Mode: Full, Source: SourceStore, Requests: 130, BytesFetch: 100 * mib, BytesRebuild: 100 * mib}, 9*time.Second, "drill")
	if r := m.Terms()[TermRequest]; !r.Known() || r.Value != 0 {
		t.Fatalf("request term %+v, want 0", r)
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
	p := m.Predict(Input{Mode: Full, Source: SourceStore, Requests: 130, BytesFetch: 15_300_000, BytesRebuild: 15_300_000})
	got := p.Text()
	for _, want := range []string{"130 requests", "15.3 MB at 10.5 MB/s measured 3 min ago", "65 ms per-request latency (at the per-object latency", "rebuild (15.3 MB, scaled to 1 worker)", "ms open", "= "} {
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
	fetchBound := Input{Mode: Full, Source: SourceStore, Requests: 1, BytesFetch: 100 * mib, BytesRebuild: 512 * mib, Workers: 2}
	if _, err := m.ObserveRestore(fetchBound, 10100*time.Millisecond, "restore"); err != nil {
		t.Fatal(err)
	}
	if m.Terms()[TermDecode].Known() {
		t.Fatalf("a fetch-bound full restore calibrated decode: %+v", m.Terms())
	}
	// Rebuild-bound: 1 MiB (0.1 s) fetched, 0.1 open + 2 s: decode 4 s/GiB.
	rebuildBound := Input{Mode: Full, Source: SourceStore, Requests: 1, BytesFetch: mib, BytesRebuild: 512 * mib, Workers: 2}
	_, _ = m.ObserveRestore(rebuildBound, 2100*time.Millisecond, "restore")
	if d := m.Terms()[RebuildKey(TermDecode, 2)]; !near(d.Value, 4) {
		t.Fatalf("decode@2 %+v, want 4 s/GiB", d)
	}
	p := m.Predict(fetchBound)
	if !p.OK || !near(p.Overlap, 2) || !near(p.Seconds, 0.1+10) || !strings.HasPrefix(p.Text(), "max(1 requests") {
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
	m := openAndBandwidth(20 * time.Millisecond)
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

// TestOnlineFirstCountsMetadataDownloads: with the SSTs known, an online
// restore's time to processing is the open, its metadata downloads (the
// objects that are not SSTs, at the per-object latency) and its SSTs placed
// (the remote term); learning subtracts the downloads before dividing by
// the SSTs.
func TestOnlineFirstCountsMetadataDownloads(t *testing.T) {
	m := calibrated(t) // 4 ms per object, 20 ms open
	in := Input{Mode: Incremental, Source: SourceStore, Objects: 24, SSTs: 14, BytesFetch: 16 * mib}
	// 10 metadata files ÷ 8 × 4 ms = 5 ms; remote not measured yet.
	if first, _, ok := m.Predict(in).Online(); !ok || !near(first, 0.020+0.005) {
		t.Fatalf("before: %v", first)
	}
	// Measured 39 ms: 20 open + 5 metadata + 14 × 1 ms placed.
	if _, err := m.ObserveOnline(in, 39*time.Millisecond, "drill"); err != nil {
		t.Fatal(err)
	}
	if r := m.Terms()[TermRemote]; !near(r.Value, 0.001) {
		t.Fatalf("remote %+v, want 1 ms per SST", r)
	}
	// A longer chain: 30 SSTs, the same 10 metadata files.
	first, local, ok := m.Predict(Input{Mode: Incremental, Source: SourceStore, Objects: 40, SSTs: 30, BytesFetch: 16 * mib}).Online()
	if !ok || !near(first, 0.020+0.005+0.030) || !near(local, first+1.6+40.0/8*0.004) {
		t.Fatalf("chain: %v %v", first, local)
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

// TestOnlineOpenFasterThanLocal: an online restore links and checks no
// local SSTs, so it can open faster than the local restores that measure
// the open term. Its time is then its own online open, not the open term
// plus a per-file cost that cannot go below zero (which over-predicted
// 4–5 ms restores by 1–2 ms in the drill).
func TestOnlineOpenFasterThanLocal(t *testing.T) {
	m := New()
	m.SetClock(func() time.Time { return t0 })
	_, _ = m.ObserveRestore(Input{Mode: Incremental, Source: SourceLocal}, 7*time.Millisecond, "drill")
	in := func(ssts int) Input {
		return Input{Mode: Incremental, Source: SourceStore, Objects: ssts, SSTs: ssts, BytesFetch: 100 * mib}
	}
	for _, ms := range []int{4, 5, 4} {
		if _, err := m.ObserveOnline(in(10), time.Duration(ms)*time.Millisecond, "drill"); err != nil {
			t.Fatal(err)
		}
	}
	if o, r := m.Terms()[TermOnlineOpen], m.Terms()[TermRemote]; !near(o.Value, 0.004) || r.Value != 0 || o.Samples != 3 {
		t.Fatalf("online open %+v, remote %+v: want 4 ms and 0 per file", o, r)
	}
	_ = m.ObserveTransfer(Transfer{Bytes: 10 * mib, Objects: 1, Seconds: 1, From: "standby sync"})
	if first, _, ok := m.Predict(in(12)).Online(); !ok || !near(first, 0.004) {
		t.Fatalf("first %v, want the 4 ms online open", first)
	}
	// The open term of a restore that is not online is untouched.
	if p := m.Predict(Input{Mode: Incremental, Source: SourceLocal}); !near(p.Seconds, 0.007) {
		t.Fatalf("local restore %v", p.Seconds)
	}
}

// TestOnlineFitSeparatesOpenFromFiles: online restores of different sizes
// separate the online open from the per-file cost (least squares), so a
// larger checkpoint is predicted by its file count.
func TestOnlineFitSeparatesOpenFromFiles(t *testing.T) {
	m := openAndBandwidth(50 * time.Millisecond)
	in := func(ssts int) Input {
		return Input{Mode: Incremental, Source: SourceStore, Objects: ssts, SSTs: ssts, BytesFetch: 100 * mib}
	}
	// 3 ms to open and 0.5 ms per file (the local open, 50 ms, is not it).
	for _, n := range []int{10, 40, 100, 20} {
		_, _ = m.ObserveOnline(in(n), time.Duration((3+0.5*float64(n))*float64(time.Millisecond)), "drill")
	}
	if o, r := m.Terms()[TermOnlineOpen], m.Terms()[TermRemote]; !near(o.Value, 0.003) || !near(r.Value, 0.0005) {
		t.Fatalf("online open %v, remote %v: want 3 ms + 0.5 ms per file", o.Value, r.Value)
	}
	if first, _, _ := m.Predict(in(400)).Online(); !near(first, 0.203) {
		t.Fatalf("400 files: %v, want 203 ms", first)
	}
	// Times that fall with the file count (noise) fit no negative slope.
	m2 := New()
	for _, s := range []struct{ n, ms int }{{10, 9}, {30, 6}, {60, 3}} {
		_, _ = m2.ObserveOnline(in(s.n), time.Duration(s.ms)*time.Millisecond, "drill")
	}
	if _, _, ok := m2.Predict(in(5)).Online(); ok {
		t.Fatal("predicted without an open term or bandwidth")
	}
	if o, r := fitOnline(m2.st.Online, Term{}, Term{}); !near(o.Value, 0.006) || r.Value != 0 {
		t.Fatalf("falling times: open %v, per file %v", o.Value, r.Value)
	}
}

// openAndBandwidth is a model that measured a local restore's open time
// and the store's bandwidth (10 MiB/s), as an online prediction needs.
func openAndBandwidth(open time.Duration) *Model {
	m := New()
	m.SetClock(func() time.Time { return t0 })
	_, _ = m.ObserveRestore(Input{Mode: Incremental, Source: SourceLocal}, open, "drill")
	_ = m.ObserveTransfer(Transfer{Bytes: 10 * mib, Objects: 1, Seconds: 1, From: "standby sync"})
	return m
}

// TestOnlineLegacyModelFile: a model file written before the online
// restores were kept (a per-SST remote term over the open term) predicts
// as it did: the local open plus the remote term per SST.
func TestOnlineLegacyModelFile(t *testing.T) {
	dir := t.TempDir()
	legacy := `{"transfers":[{"bytes":10485760,"objects":1,"parallelism":8,"seconds":1,"from":"standby sync","time":"2026-12-01T00:00:00Z"}],
"open":{"value":0.02,"samples":3,"measured":"2026-12-01T00:00:00Z","from":"restore"},
"remote":{"value":0.001,"samples":2,"measured":"2026-12-01T00:00:00Z","from":"online restore"}}`
	if err := os.WriteFile(filepath.Join(dir, File), []byte(legacy), 0o644); err != nil {
		t.Fatal(err)
	}
	m := Load(dir)
	in := Input{Mode: Incremental, Source: SourceStore, Objects: 40, SSTs: 40, BytesFetch: 100 * mib}
	if first, _, ok := m.Predict(in).Online(); !ok || !near(first, 0.020+0.040) {
		t.Fatalf("legacy model: first %v (ok %v), want 20 ms open + 40 × 1 ms", first, ok)
	}
	// The first online restore after it is a sample like any other.
	if _, err := m.ObserveOnline(in, 30*time.Millisecond, "online restore"); err != nil {
		t.Fatal(err)
	}
	if o := m.Terms()[TermOnlineOpen]; !near(o.Value, 0.020) || o.Samples != 1 {
		t.Fatalf("after one online restore: online open %+v", o)
	}
}
