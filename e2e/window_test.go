package e2e

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"strconv"
	"testing"

	"github.com/nats-io/nats.go"

	"cairn/engine"
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
func TestWindowCountOutOfOrder(t *testing.T) {
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
	late := 0
	base := int64(1_700_000_000_000)
	for i := range 4000 {
		t0 := base + int64(i)*5 // 5 ms apart in order...
		ev := t0 - rng.Int64N(1900)
		if i%200 == 199 {
			ev = t0 - 2500 - rng.Int64N(3000) // ... some beyond the bound: late
		}
		key := keys[rng.IntN(len(keys))]
		wm := maxT - bound - 1
		if ev <= wm {
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
	if late == 0 {
		t.Fatal("test corpus has no late events")
	}

	r, stop := runJob(t, fmt.Sprintf(windowJob, url, t.TempDir()))
	waitProcessed(t, r.Engine, uint64(len(msgs)))
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	out := readStream(t, js, "WINDOWS", len(model))
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
		if _, dup := got[w]; dup {
			t.Errorf("window %v emitted twice", w)
		}
		got[w] = n
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
}
