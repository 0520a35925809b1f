package e2e

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"cairn/engine"
	"cairn/internal/app/job"
)

// TestSlidingSessionAcrossRestart runs builtin:sliding_count and
// builtin:session_count by event time over a real JetStream stream with
// exactly_once delivery: events out of order within the bound, some late
// (dead-lettered); the job stops (a checkpoint) while windows and sessions
// are open, more events are published, and it restarts on another slot
// count, so the open windows' buckets, sessions and timers move with their
// keys. Every output must be the model's, each key's in order, with
// gap-free output indexes.
func TestSlidingSessionAcrossRestart(t *testing.T) {
	const (
		bound       = 200
		size, slide = 600, 200
		gap         = 150
		n           = 1200
	)
	for _, tc := range []struct {
		module string
		config map[string]any
	}{
		{"builtin:sliding_count", map[string]any{"size_ms": size, "slide_ms": slide}},
		{"builtin:session_count", map[string]any{"gap_ms": gap}},
	} {
		t.Run(strings.TrimPrefix(tc.module, "builtin:"), func(t *testing.T) {
			url := startNATS(t)
			_, js := connectJS(t, url)
			createStream(t, js, "EVENTS", "events.>")
			rng := rand.New(rand.NewPCG(5, 6))
			keys := []string{"alpha", "beta", "gamma", "delta", "eps"}
			base := int64(1_700_000_000_000)
			admitted := map[string][]int64{}
			maxT, late := int64(-1<<62), 0
			var msgs []*nats.Msg
			clock := base
			for i := range n {
				clock += 7
				if i%151 == 150 {
					clock += 2000 // a pause: sessions end, windows close
				}
				ev := clock - rng.Int64N(bound)
				if i%97 == 96 {
					ev = clock - bound - 50 - rng.Int64N(500) // behind the watermark
				}
				key := keys[rng.IntN(len(keys))]
				if ev <= maxT-bound-1 {
					late++
				} else {
					maxT = max(maxT, ev)
					admitted[key] = append(admitted[key], ev)
				}
				h := nats.Header{}
				h.Set(engine.HeaderKey, key)
				h.Set(engine.HeaderTime, strconv.FormatInt(ev, 10))
				msgs = append(msgs, &nats.Msg{Subject: "events.x", Header: h, Data: []byte("e")})
			}
			h := nats.Header{}
			h.Set(engine.HeaderKey, "flush")
			h.Set(engine.HeaderTime, strconv.FormatInt(maxT+100*size, 10))
			msgs = append(msgs, &nats.Msg{Subject: "events.x", Header: h, Data: []byte("e")})
			if late == 0 {
				t.Fatal("no late events in the corpus")
			}

			want := map[string][]string{} // per key, "value@time" in order
			for k, ts := range admitted {
				if tc.module == "builtin:sliding_count" {
					want[k] = slidingModel(ts, size, slide)
				} else {
					want[k] = sessionModel(ts, gap)
				}
			}

			store := "file://" + t.TempDir() + "?create_dir=true"
			data := t.TempDir()
			yaml := func(slots int) string {
				j := &job.Job{
					Name: "ss", NATS: url,
					Input:     job.Input{Stream: "EVENTS", Subjects: []string{"events.>"}},
					Stages:    []job.Stage{{Name: "win", Module: tc.module, Keyed: true, Config: tc.config}},
					Output:    job.Output{Stream: "WINDOWS", Subject: "windows", Delivery: "exactly_once"},
					Watermark: job.Watermark{MaxOutOfOrderness: bound * time.Millisecond},
					KeyGroups: 16, Slots: slots, DataDir: data, BatchSize: 32,
					Checkpoint: &job.Checkpoint{Store: store, Interval: time.Hour, Mode: "incremental"},
				}
				b, err := j.Marshal()
				if err != nil {
					t.Fatal(err)
				}
				return string(b)
			}
			half := len(msgs) / 2
			publishAll(t, js, msgs[:half])
			r, stop := runJob(t, yaml(2))
			waitProcessed(t, r.Engine, uint64(half))
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			before := len(readStream(t, js, "WINDOWS", 0))
			publishAll(t, js, msgs[half:])
			r, stop = runJob(t, yaml(3))
			if r.Restored == nil || !r.Restored.Rescaled {
				t.Fatalf("restart at 3 slots did not restore rescaled: %+v", r.Restored)
			}
			waitProcessed(t, r.Engine, uint64(len(msgs)))
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			total := 0
			for _, w := range want {
				total += len(w)
			}
			out := readStream(t, js, "WINDOWS", total)
			lastValues(t, out, "windows", 16) // output indexes gap-free per key group
			got := map[string][]string{}
			for _, m := range out {
				k := m.Headers().Get(engine.HeaderKey)
				got[k] = append(got[k], string(m.Data())+"@"+m.Headers().Get(engine.HeaderTime))
			}
			for k, w := range want {
				if !slices.Equal(got[k], w) {
					t.Errorf("key %s:\n got %v\nwant %v", k, got[k], w)
				}
			}
			if len(got) != len(want) {
				t.Errorf("outputs for %d keys, want %d", len(got), len(want))
			}
			if dl := readStream(t, js, "CAIRN_DLQ_SS", late); len(dl) != late {
				t.Errorf("dead letters: %d, want %d late events", len(dl), late)
			}
			t.Logf("%d outputs (%d before the restart), %d late events", len(out), before, late)
			if before == 0 || before == len(out) {
				t.Errorf("%d of %d outputs before the restart: the restart tests nothing", before, len(out))
			}
		})
	}
}

// slidingModel: every window [s, s+size) (s a multiple of slide) holding
// some of ts, "s,count@s+size-1", in order.
func slidingModel(ts []int64, size, slide int64) []string {
	buckets := map[int64]int{}
	lo, hi := int64(1<<62), int64(-1<<62)
	for _, t := range ts {
		b := t / slide * slide // positive times
		buckets[b]++
		lo, hi = min(lo, b), max(hi, b)
	}
	var out []string
	for s := lo - size + slide; s <= hi; s += slide {
		c := 0
		for b := s; b < s+size; b += slide {
			c += buckets[b]
		}
		if c > 0 {
			out = append(out, fmt.Sprintf("%d,%d@%d", s, c, s+size-1))
		}
	}
	return out
}

// sessionModel: the runs of ts with gaps < gap, "first,last,count@last+gap-1",
// in order.
func sessionModel(ts []int64, gap int64) []string {
	s := slices.Clone(ts)
	slices.Sort(s)
	var out []string
	first := 0
	for i := 1; i <= len(s); i++ {
		if i == len(s) || s[i]-s[i-1] >= gap {
			out = append(out, fmt.Sprintf("%d,%d,%d@%d", s[first], s[i-1], i-first, s[i-1]+gap-1))
			first = i
		}
	}
	return out
}
