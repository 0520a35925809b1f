package demo

import (
	"strings"
	"testing"
	"time"

	"cairn/checkpoint"
	"cairn/recovery"
)

// TestRestoreModel: the demo's adapter over recovery/model — no
// prediction until measured ("calibrating"), then the local restore's open
// time plus the download at the measured rate.
func TestRestoreModel(t *testing.T) {
	m := newRestoreModel("")
	plan := recovery.Plan{Mode: checkpoint.ModeIncremental, FromSlots: 1, ToSlots: 1, BytesLocal: 1 << 20}
	if _, ok := m.predictPlan(plan); ok || m.calibrated("incremental") {
		t.Fatal("a prediction before any measurement")
	}
	m.observeResult(&recovery.Result{Mode: checkpoint.ModeIncremental, FromSlots: 1, ToSlots: 1, BytesLocal: 1 << 20, Duration: 20 * time.Millisecond})
	if d, ok := m.predictPlan(plan); !ok || d != 20*time.Millisecond {
		t.Fatalf("local restore predicted %v %v, want 20ms", d, ok)
	}
	store := recovery.Plan{Mode: checkpoint.ModeIncremental, FromSlots: 1, ToSlots: 1, BytesDownload: 5 << 20, ObjectsDownload: 1}
	if _, ok := m.predictPlan(store); ok {
		t.Fatal("a download predicted before the rate was measured")
	}
	// 10 MiB in 100 ms over the open time.
	m.observeResult(&recovery.Result{Mode: checkpoint.ModeIncremental, FromSlots: 1, ToSlots: 1, BytesDownloaded: 10 << 20, FilesDownloaded: 1, Duration: 120 * time.Millisecond})
	if d, _ := m.predictPlan(store); d != 70*time.Millisecond {
		t.Fatalf("5 MiB predicted %v, want 20ms + 50ms", d)
	}
	if m.calibrated("full") {
		t.Fatal("full restores calibrated without a measurement")
	}
	if got := fmtPrediction(0, false); got != "calibrating" {
		t.Fatalf("fmtPrediction without one = %q", got)
	}
}

// TestSplitWords: the verifier's model of builtin:split gives back the
// corpus's words, whatever capitals and punctuation a line has.
func TestSplitWords(t *testing.T) {
	c := NewCorpus(7, 500)
	for range 1000 {
		line, words := c.Line()
		var got []string
		splitWords([]byte(line), func(w string) { got = append(got, w) })
		if strings.Join(got, " ") != strings.Join(words, " ") {
			t.Fatalf("split %q = %v, want %v", line, got, words)
		}
	}
	var got []string
	splitWords([]byte("  Hello, World!  -- 42 "), func(w string) { got = append(got, w) })
	if strings.Join(got, "|") != "hello|world|42" {
		t.Fatalf("split = %v", got)
	}
}
