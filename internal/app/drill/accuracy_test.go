package drill

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"cairn/internal/app/job"
	"cairn/internal/testutil/testbin"
)

var (
	accuracyDrills = flag.String("drill.accuracy", "32MiB,64MiB@20MB,128MiB@50MB",
		"BenchmarkDrillAccuracy: the drills, comma-separated, each STATE[@BANDWIDTH] (no bandwidth: unthrottled)")
	accuracyRepeat = flag.Int("drill.repeat", 5, "BenchmarkDrillAccuracy: restores per scenario (the row is the median)")
	accuracyChain  = flag.Int("drill.chain", 3, "BenchmarkDrillAccuracy: incremental checkpoints before the full one")
	accuracyOut    = flag.String("drill.out", "", "BenchmarkDrillAccuracy: directory for each drill's report (default: a temp dir)")
)

// BenchmarkDrillAccuracy measures the restore model's prediction error (a
// prediction users plan by must be near the restore they get): it runs real drills (a cairn child process killed
// with SIGKILL, real Pebble, a file store throttled as configured) of
// different state sizes and bandwidths, and prints one error table, every
// scenario × drill, for docs/bench/drill.md:
//
//	go test ./internal/app/drill/ -run '^$' -bench DrillAccuracy -benchtime 1x -timeout 30m
func BenchmarkDrillAccuracy(b *testing.B) {
	specs, err := parseAccuracyDrills(*accuracyDrills)
	if err != nil {
		b.Fatal(err)
	}
	bin, err := testbin.Build("cairn", "cairn")
	if err != nil {
		b.Fatal(err)
	}
	out := *accuracyOut
	if out == "" {
		out = b.TempDir()
	}
	for range b.N {
		var runs []AccuracyRun
		for i, sp := range specs {
			load0 := loadAverage()
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
			start := time.Now()
			rep, err := Run(ctx, Config{
				StateBytes: sp.state, Bandwidth: sp.bandwidth, Change: 0.01, Slots: 2, RescaleTo: 1, Chain: *accuracyChain,
				ValueBytes: 100, Repeat: *accuracyRepeat, Out: filepath.Join(out, fmt.Sprintf("drill-%d", i+1)),
				WorkDir: b.TempDir(), Binary: bin, Seed: uint64(i + 1),
			})
			cancel()
			if err != nil {
				b.Fatalf("drill %s: %v", sp.text, err)
			}
			b.Logf("drill %s: %s, load %s → %s", sp.text, time.Since(start).Round(time.Second), load0, loadAverage())
			runs = append(runs, AccuracyRun{Report: rep, Note: "load " + load0})
		}
		var table bytes.Buffer
		worst := AccuracyTable(&table, runs)
		fmt.Fprintf(os.Stdout, "\nrestore-time prediction error, %d restores per scenario (measured median (range) / predicted / Δ):\n\n%s\n", *accuracyRepeat, table.String())
		b.ReportMetric(worst*100, "worst-err-%")
	}
}

type accuracySpec struct {
	text             string
	state, bandwidth int64
}

// parseAccuracyDrills reads "32MiB,64MiB@20MB".
func parseAccuracyDrills(s string) ([]accuracySpec, error) {
	var out []accuracySpec
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		state, bw, _ := strings.Cut(f, "@")
		sp := accuracySpec{text: f}
		var err error
		if sp.state, err = job.ParseBytes(state); err != nil || sp.state <= 0 {
			return nil, fmt.Errorf("-drill.accuracy %q: state %q: %v", s, state, err)
		}
		if bw != "" {
			if sp.bandwidth, err = job.ParseBytes(strings.TrimSuffix(bw, "/s")); err != nil {
				return nil, fmt.Errorf("-drill.accuracy %q: bandwidth %q: %v", s, bw, err)
			}
		}
		out = append(out, sp)
	}
	return out, nil
}

// loadAverage is the 1-minute load average (the machine is shared).
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return "?"
	}
	return f[0]
}

func TestParseAccuracyDrills(t *testing.T) {
	got, err := parseAccuracyDrills("32MiB, 64MiB@20MB,1GiB@8MiB/s")
	if err != nil {
		t.Fatal(err)
	}
	want := []accuracySpec{{"32MiB", 32 << 20, 0}, {"64MiB@20MB", 64 << 20, 20e6}, {"1GiB@8MiB/s", 1 << 30, 8 << 20}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for _, bad := range []string{"", "x", "32MiB@fast"} {
		if _, err := parseAccuracyDrills(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

// TestAccuracyTable checks the table's cells, its verdict and the worst
// error from two synthetic drills.
func TestAccuracyTable(t *testing.T) {
	row := func(name string, measured, predicted float64, calib string) Scenario {
		s := Scenario{Name: name, RestoreSeconds: measured, PredictedRestoreSeconds: predicted, CalibratesOpenTime: calib, StateEqual: true,
			Restores: 3, RestoreMinSeconds: measured * 0.9, RestoreMaxSeconds: measured * 1.2}
		if predicted > 0 {
			s.PredictionError = (measured - predicted) / predicted
		}
		return s
	}
	small := &Report{Config: ReportConfig{StateBytes: 32 << 20, Slots: 2, RescaleTo: 1}, Scenarios: []Scenario{
		row("store-incremental", 0.110, 0.100, ""), row("local-disk", 0.020, 0, "open"),
	}}
	big := &Report{Config: ReportConfig{StateBytes: 128 << 20, BandwidthBytesPerSec: 50e6, Slots: 2, RescaleTo: 1}, Scenarios: []Scenario{
		row("store-incremental", 2.6, 2.0, ""), row("local-disk", 0.030, 0, "open"), row("rescaled-full-1", 1.0, 1.0, ""),
	}}
	var b bytes.Buffer
	worst := AccuracyTable(&b, []AccuracyRun{{Report: small, Note: "load 0.5"}, {Report: big}})
	got := b.String()
	for _, want := range []string{
		"| scenario | 32.0MiB unthrottled, 2→1 slots (load 0.5) | 128.0MiB at 50 MB/s, 2→1 slots |",
		"| store-incremental | 110ms (99ms–132ms) / 100ms / +10% | 2.60s (2.34s–3.12s) / 2.00s / +30% |",
		"| local-disk | 20ms (18ms–24ms) / — / (calib) | 30ms (27ms–36ms) / — / (calib) |",
		"| rescaled-full-1 | — | 1.00s (900ms–1.20s) / 1.00s / +0% |",
		"| worst \\|Δ\\| | 10% | 30% |",
		"OUTSIDE ±25%: store-incremental in 128.0MiB at 50 MB/s, 2→1 slots (+30%); worst 30%",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("table lacks %q:\n%s", want, got)
		}
	}
	if worst < 0.2999 || worst > 0.3001 {
		t.Errorf("worst %v, want 0.30", worst)
	}
	b.Reset()
	big.Scenarios[0] = row("store-incremental", 2.2, 2.0, "")
	if worst := AccuracyTable(&b, []AccuracyRun{{Report: small}, {Report: big}}); worst > 0.25 || !strings.Contains(b.String(), "every predicted scenario within ±25%: worst 10%") {
		t.Errorf("worst %v:\n%s", worst, b.String())
	}
}
