package cli

import (
	"strings"
	"testing"
	"time"
)

// TestRestoreModel: no prediction until measured ("calibrating"), then the
// measured fixed cost plus the bytes to download at the measured rate.
func TestRestoreModel(t *testing.T) {
	m := newRestoreModel()
	if _, ok := m.predict("incremental", 0); ok {
		t.Fatal("a prediction before any measurement")
	}
	m.observe("incremental", 0, 20*time.Millisecond) // from the local copy
	if d, ok := m.predict("incremental", 0); !ok || d != 20*time.Millisecond {
		t.Fatalf("local restore predicted %v %v, want 20ms", d, ok)
	}
	if _, ok := m.predict("incremental", 1<<20); ok {
		t.Fatal("a download predicted before the rate was measured")
	}
	m.observe("incremental", 10<<20, 120*time.Millisecond) // 10 MiB in 100 ms over the fixed cost
	if d, _ := m.predict("incremental", 5<<20); d != 70*time.Millisecond {
		t.Fatalf("5 MiB predicted %v, want 20ms + 50ms", d)
	}
	if m.calibrated("full") {
		t.Fatal("full restores calibrated without a measurement")
	}
	m.observe("full", 10<<20, 300*time.Millisecond) // fixed cost: 300 - 100 ms
	if d, _ := m.predict("full", 0); d != 200*time.Millisecond {
		t.Fatalf("full fixed cost %v, want 200ms", d)
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
