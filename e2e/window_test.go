package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"cairn/engine"
	"cairn/internal/app/job"
	"cairn/internal/app/runtime"
	"cairn/internal/testutil/wait"
)

const windowJob = `
name: windows
nats: %s
input:  {stream: EVENTS, subjects: ["events.>"]}
stages:
  - {name: win, module: "builtin:window_count", keyed: true, config: {size_ms: 1000}}
output: {stream: WINDOWS, subject: windows, delivery: exactly_once}
watermark: {max_out_of_orderness: 2s}
key_groups: 16
slots: 2
data_dir: %s
batch_size: 64
`

// TestWindowCountOutOfOrder sends events out of order within the bound
// (exact per-window counts) and late events beyond it (dead-lettered).
func TestWindowCountOutOfOrder(t *testing.T) { windowOutOfOrder(t, 0) }

// TestWindowCountAllowedLateness is the same corpus with 2 s of allowed
// lateness, through NATS: a late event less than that behind the watermark
// is admitted by the router and counted into its window, which was kept and
// emits its updated count (each window's last output is exact); later ones
// are dead-lettered.
func TestWindowCountAllowedLateness(t *testing.T) { windowOutOfOrder(t, 2000) }

func windowOutOfOrder(t *testing.T, lateness int64) {
	url := startNATS(t)
	_, js := connectJS(t, url)
	createStream(t, js, "EVENTS", "events.>")
	const bound, size = 2000, 1000
	rng := rand.New(rand.NewPCG(3, 4))
	keys := []string{"alpha", "beta", "gamma", "delta", "eps"}
	type win struct {
		key   string
		start int64
	}
	model := map[win]int{}
	var msgs []*nats.Msg
	maxT := int64(-1 << 62)
	late, admitted := 0, 0
	base := int64(1_700_000_000_000)
	for i := range 4000 {
		t0 := base + int64(i)*5 // 5 ms apart in order...
		ev := t0 - rng.Int64N(1900)
		if i%200 == 199 {
			ev = t0 - 2500 - rng.Int64N(3000) // ... some beyond the bound: late
		}
		key := keys[rng.IntN(len(keys))]
		wm := maxT - bound - 1
		if ev <= wm && wm-ev < lateness {
			admitted++
			model[win{key, ev / size * size}]++
		} else if ev <= wm {
			late++
		} else {
			model[win{key, ev / size * size}]++
			maxT = max(maxT, ev)
		}
		h := nats.Header{}
		h.Set(engine.HeaderKey, key)
		h.Set(engine.HeaderTime, strconv.FormatInt(ev, 10))
		msgs = append(msgs, &nats.Msg{Subject: "events.x", Header: h, Data: []byte("e")})
	}
	// A final event far ahead closes every window of the model.
	flushT := maxT + 100*size
	h := nats.Header{}
	h.Set(engine.HeaderKey, "flush")
	h.Set(engine.HeaderTime, strconv.FormatInt(flushT, 10))
	msgs = append(msgs, &nats.Msg{Subject: "events.x", Header: h, Data: []byte("e")})
	publishAll(t, js, msgs)
	if late == 0 || (lateness > 0) != (admitted > 0) {
		t.Fatalf("test corpus: %d late events, %d admitted", late, admitted)
	}

	jobYAML := fmt.Sprintf(windowJob, url, t.TempDir())
	if lateness > 0 {
		jobYAML = strings.Replace(jobYAML, "config: {size_ms: 1000}", fmt.Sprintf("config: {size_ms: 1000, allowed_lateness_ms: %d}", lateness), 1)
		jobYAML = strings.Replace(jobYAML, "max_out_of_orderness: 2s}", fmt.Sprintf("max_out_of_orderness: 2s, allowed_lateness: %dms}", lateness), 1)
	}
	r, stop := runJob(t, jobYAML)
	waitProcessed(t, r.Engine, uint64(len(msgs)))
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	out := readStream(t, js, "WINDOWS", streamMsgs(t, js, "WINDOWS"))
	lastValues(t, out, "windows", 16) // checks output indexes and partitions
	got := map[win]int{}
	for _, m := range out {
		key := m.Headers().Get(engine.HeaderKey)
		var start int64
		var n int
		if _, err := fmt.Sscanf(string(m.Data()), "%d,%d", &start, &n); err != nil {
			t.Fatalf("output %q of key %s: %v", m.Data(), key, err)
		}
		w := win{key, start}
		if _, dup := got[w]; dup && lateness == 0 {
			t.Errorf("window %v emitted twice", w)
		}
		got[w] = n // a kept window's update follows its first result
		if tm := m.Headers().Get(engine.HeaderTime); tm != strconv.FormatInt(start+size-1, 10) {
			t.Errorf("window %v output time %s, want window end-1 %d", w, tm, start+size-1)
		}
	}
	var missing []string
	for w, n := range model {
		if got[w] != n {
			missing = append(missing, fmt.Sprintf("%v: got %d want %d", w, got[w], n))
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 || len(got) != len(model) {
		t.Fatalf("%d windows differ (got %d windows, want %d): %v", len(missing), len(got), len(model), missing[:min(len(missing), 10)])
	}
	dl := readStream(t, js, "CAIRN_DLQ_WINDOWS", late)
	if len(dl) != late {
		t.Fatalf("dead letters: %d, want %d late events", len(dl), late)
	}
	for _, m := range dl {
		if m.Headers().Get(engine.HeaderError) == "" || m.Headers().Get(engine.HeaderStage) != "router" || m.Headers().Get(engine.HeaderSeq) == "" {
			t.Fatalf("dead letter without reason headers: %v", m.Headers())
		}
	}
	if st := r.Engine.Stats(); st.DeadLetters != uint64(late) {
		t.Errorf("dead-letter counter %d, want %d", st.DeadLetters, late)
	}
	t.Logf("%d windows exact; %d late events admitted, %d dead-lettered; %d outputs", len(model), admitted, late, len(out))
}

// procWindowJob is the processing-time windows job, built as a job.Job.
func procWindowJob(t testing.TB, url string, size, slots int, data, store, timeDomain string) string {
	j := &job.Job{
		Name: "procwindows", NATS: url,
		Input:     job.Input{Stream: "EVENTS", Subjects: []string{"events.>"}},
		Stages:    []job.Stage{{Name: "win", Module: "builtin:window_count", Keyed: true, Config: map[string]any{"size_ms": size, "time": timeDomain}}},
		Output:    job.Output{Stream: "WINDOWS", Subject: "windows", Delivery: "exactly_once"},
		KeyGroups: 16, Slots: slots, DataDir: data,
		Checkpoint: &job.Checkpoint{Store: store, Interval: time.Hour, Mode: "incremental"},
	}
	b, err := j.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestProcessingTimeWindowsAcrossRestart counts in processing-time windows,
// stops the job while windows are still open (their timers pending in
// state), and restarts it on another slot count: the timers, persisted under
// their key's key group, move with the keys and fire after the restore with
// no further input, so every event is counted exactly once.
func TestProcessingTimeWindowsAcrossRestart(t *testing.T) {
	const size = 3000
	url := startNATS(t)
	_, js := connectJS(t, url)
	createStream(t, js, "EVENTS", "events.>")
	store := "file://" + t.TempDir() + "?create_dir=true"
	data := t.TempDir()
	model := map[string]int{}
	publish := func(from, to int) {
		var msgs []*nats.Msg
		for i := from; i < to; i++ {
			k := fmt.Sprintf("k%d", i%23)
			model[k]++
			msgs = append(msgs, &nats.Msg{Subject: "events.x", Header: nats.Header{engine.HeaderKey: []string{k}}, Data: []byte("e")})
		}
		publishAll(t, js, msgs)
	}
	publish(0, 500)
	r, stop := runJob(t, procWindowJob(t, url, size, 2, data, store, "processing"))
	waitProcessed(t, r.Engine, 500)
	// The last events arrive early in a window, so that it is still open
	// (two seconds at least) when the job stops.
	wait.For(t, 2*size*time.Millisecond, "the start of a window", func() bool { return time.Now().UnixMilli()%size <= size/4 })
	publish(500, 600)
	waitProcessed(t, r.Engine, 600)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	sum := func(out []jetstream.Msg) int {
		n := 0
		for _, m := range out {
			var start, c int
			if _, err := fmt.Sscanf(string(m.Data()), "%d,%d", &start, &c); err != nil {
				t.Fatalf("output %q: %v", m.Data(), err)
			}
			n += c
		}
		return n
	}
	before := sum(readStream(t, js, "WINDOWS", 0))
	if before >= 600 {
		t.Fatalf("every window closed before the stop (%d events counted): the restart would test nothing", before)
	}

	r, stop = runJob(t, procWindowJob(t, url, size, 3, data, store, "processing"))
	if r.Restored == nil || !r.Restored.Rescaled {
		t.Fatalf("restart at 3 slots did not restore rescaled: %+v", r.Restored)
	}
	var out []jetstream.Msg
	wait.Until(t, time.Minute, "every event counted in a closed window after the restore", func() error {
		out = readStream(t, js, "WINDOWS", 0)
		if n := sum(out); n < 600 {
			return fmt.Errorf("%d of 600 events counted", n)
		}
		return nil
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	lastValues(t, out, "windows", 16) // output indexes gap-free per key group
	type win struct {
		key   string
		start int64
	}
	seen := map[win]bool{}
	got := map[string]int{}
	for _, m := range out {
		key := m.Headers().Get(engine.HeaderKey)
		var start int64
		var c int
		if _, err := fmt.Sscanf(string(m.Data()), "%d,%d", &start, &c); err != nil {
			t.Fatalf("output %q: %v", m.Data(), err)
		}
		if start%size != 0 {
			t.Errorf("window start %d of key %s is not aligned to %d", start, key, size)
		}
		if seen[win{key, start}] {
			t.Errorf("window %s@%d emitted twice", key, start)
		}
		seen[win{key, start}] = true
		got[key] += c
	}
	for k, n := range model {
		if got[k] != n {
			t.Errorf("key %s: %d events in its windows, want %d", k, got[k], n)
		}
	}
	t.Logf("%d of 600 events counted before the stop, the rest by timers fired after the restore; %d windows", before, len(out))
}

// TestWindowCountBadConfigRefused: a window_count config the operator
// cannot run is refused when the job starts, before any input is read, with
// the operator's message and the stage named.
func TestWindowCountBadConfigRefused(t *testing.T) {
	url := startNATS(t)
	yaml := procWindowJob(t, url, 1000, 2, t.TempDir(), "file://"+t.TempDir()+"?create_dir=true", "sideways")
	r, err := startJob(t, yaml, runtime.Options{})
	if err == nil {
		err = r.Engine.Run(context.Background())
		r.Close()
	}
	if err == nil || !strings.Contains(err.Error(), `"time" is "sideways"`) || !strings.Contains(err.Error(), `"win"`) {
		t.Fatalf("got %v, want a refusal naming the stage and the bad time domain", err)
	}
	t.Log(err)
}
