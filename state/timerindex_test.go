package state

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// timerModel is the timers a test wrote, as the DB should hold them.
type timerModel map[string]bool // "kg/ts/key"

type modelTimer struct {
	kg  int
	ts  int64
	key string
}

func (m timerModel) sorted() []modelTimer {
	var out []modelTimer
	for s := range m {
		var t modelTimer
		fmt.Sscanf(s, "%d/%d/%s", &t.kg, &t.ts, &t.key)
		out = append(out, t)
	}
	slices.SortFunc(out, func(a, b modelTimer) int {
		if a.kg != b.kg {
			return a.kg - b.kg
		}
		if a.ts != b.ts {
			if a.ts < b.ts {
				return -1
			}
			return 1
		}
		return strings.Compare(a.key, b.key) // keys of one length in these tests
	})
	return out
}

// checkWalk runs DueTimersFrom(from, upTo) and compares it with the model:
// the due timers exactly, and the next time a lower bound of the model's
// (never later, never missing).
func checkWalk(t *testing.T, d *DB, m timerModel, from, upTo int64, fn func(kg int, ts int64, key []byte)) []modelTimer {
	t.Helper()
	var got []string
	var due []modelTimer
	next, ok, err := d.DueTimersFrom(1, DomainEventTime, from, upTo, func(kg int, ts int64, key []byte) error {
		got = append(got, fmt.Sprintf("%d/%d/%s", kg, ts, key))
		due = append(due, modelTimer{kg, ts, string(key)})
		if fn != nil {
			fn(kg, ts, key)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("DueTimersFrom(%d, %d): %v", from, upTo, err)
	}
	var want []string
	wantNext, wantOK := int64(math.MaxInt64), false
	for _, tm := range m.sorted() {
		if tm.ts >= from && tm.ts <= upTo {
			want = append(want, fmt.Sprintf("%d/%d/%s", tm.kg, tm.ts, tm.key))
		}
		if tm.ts > upTo && tm.ts >= from && tm.ts < wantNext {
			wantNext, wantOK = tm.ts, true
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("DueTimersFrom(%d, %d) = %v, want %v", from, upTo, got, want)
	}
	if wantOK && (!ok || next > wantNext) {
		t.Fatalf("DueTimersFrom(%d, %d): next %d %v, want at most %d", from, upTo, next, ok, wantNext)
	}
	if ok && next <= upTo {
		t.Fatalf("DueTimersFrom(%d, %d): next %d not after upTo", from, upTo, next)
	}
	return due
}

// TestDueTimeIndex: walks through the due-time index return exactly what a
// walk over every key group returns, under a random mix of timer sets,
// deletes (some of timers not yet due, which leave the index early), walks
// that delete what fired (the engine's), walks that do not (DueTimers),
// and reopens of the DB (a restore), with the index's key groups skipped
// once known.
func TestDueTimeIndex(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	dir := t.TempDir()
	o := testOptions()
	o.Range = KeyGroupRange{First: 2, Last: 13}
	d := openDB(t, dir, o)
	m := timerModel{}
	floor := int64(math.MinInt64) // no timer of the model is below it
	wm := int64(0)
	set := func(b *Batch, kg int, ts int64, key string) {
		b.SetTimer(1, kg, DomainEventTime, ts, []byte(key))
		m[fmt.Sprintf("%d/%d/%s", kg, ts, key)] = true
		floor = min(floor, ts)
	}
	for step := range 3000 {
		switch r := rng.IntN(100); {
		case r < 45: // a batch of new timers, a few in the past
			b := d.NewBatch()
			for range 1 + rng.IntN(4) {
				set(b, 2+rng.IntN(12), wm-20+rng.Int64N(200), fmt.Sprintf("k%03d", rng.IntN(1000)))
			}
			commit(t, b)
		case r < 55: // a handler deletes timers, due or not
			b := d.NewBatch()
			for _, tm := range m.sorted() {
				if rng.IntN(8) == 0 {
					b.DeleteTimer(1, tm.kg, DomainEventTime, tm.ts, []byte(tm.key))
					delete(m, fmt.Sprintf("%d/%d/%s", tm.kg, tm.ts, tm.key))
				}
			}
			commit(t, b)
		case r < 90: // the watermark advances: the engine's walk
			wm += rng.Int64N(15)
			b := d.NewBatch()
			for _, tm := range checkWalk(t, d, m, floor, wm, nil) {
				b.DeleteTimer(1, tm.kg, DomainEventTime, tm.ts, []byte(tm.key))
				delete(m, fmt.Sprintf("%d/%d/%s", tm.kg, tm.ts, tm.key))
			}
			commit(t, b)
			floor = wm + 1
		case r < 97: // a walk that deletes nothing, from the start
			checkWalk(t, d, m, math.MinInt64, wm+rng.Int64N(100), nil)
		default: // a restore: the index starts over from what Pebble holds
			if err := d.Close(); err != nil {
				t.Fatal(err)
			}
			d = openDB(t, dir, o)
			if e := d.timers.entries(1, DomainEventTime); e != nil {
				t.Fatalf("step %d: a reopened DB has an index", step)
			}
		}
	}
	// The index learned: a walk where nothing is due seeks nothing.
	checkWalk(t, d, m, floor, wm, nil)
	b := d.NewBatch()
	for _, tm := range m.sorted() {
		b.DeleteTimer(1, tm.kg, DomainEventTime, tm.ts, []byte(tm.key))
	}
	commit(t, b)
	clear(m)
	// A batch never committed lowers the index all the same: a walk
	// tightens it again.
	b = d.NewBatch()
	b.SetTimer(1, 5, DomainEventTime, wm+1000, []byte("k999"))
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	checkWalk(t, d, m, math.MinInt64, math.MaxInt64, nil)
	for i, e := range d.timers.entries(1, DomainEventTime) {
		if !e.skip(wm+1, wm+500) {
			t.Fatalf("key group %d: %+v after a full walk of an empty DB; want it skipped", o.Range.First+i, e)
		}
	}
}

// TestDueTimeIndexWriteDuringWalk: a timer set while a walk runs (by the
// walk's own callback, into a key group the walk has not reached) is found
// by the next walk, though the walk's iterator did not see it.
func TestDueTimeIndexWriteDuringWalk(t *testing.T) {
	o := testOptions()
	o.Range = KeyGroupRange{First: 2, Last: 9}
	d := openDB(t, t.TempDir(), o)
	m := timerModel{"3/10/k001": true}
	b := d.NewBatch()
	b.SetTimer(1, 3, DomainEventTime, 10, []byte("k001"))
	commit(t, b)
	checkWalk(t, d, m, math.MinInt64, 5, nil) // every key group known
	checkWalk(t, d, m, 6, 10, func(kg int, ts int64, key []byte) {
		b := d.NewBatch()
		b.DeleteTimer(1, kg, DomainEventTime, ts, key)
		b.SetTimer(1, 8, DomainEventTime, 20, []byte("k002"))
		commit(t, b)
	})
	m = timerModel{"8/20/k002": true}
	checkWalk(t, d, m, 11, 25, nil)
}

// TestDueTimeIndexBypass: timers that reach the DB around the batches (an
// ingest of key groups, as a rescaled restore does) and key groups clipped
// away are seen by the next walk, though the index had learned the DB.
// The walks start at 0 (no timer is earlier), so the index may skip.
func TestDueTimeIndexBypass(t *testing.T) {
	root := t.TempDir()
	src := openDB(t, filepath.Join(root, "src"), testOptions())
	b := src.NewBatch()
	b.SetTimer(1, 3, DomainEventTime, 10, []byte("k001"))
	b.SetTimer(1, 12, DomainEventTime, 30, []byte("k002"))
	commit(t, b)

	o := testOptions()
	o.Range = KeyGroupRange{First: 2, Last: 9}
	d := openDB(t, filepath.Join(root, "dst"), o)
	b = d.NewBatch()
	b.SetTimer(1, 7, DomainEventTime, 50, []byte("k003"))
	commit(t, b)
	checkWalk(t, d, timerModel{"7/50/k003": true}, 0, 40, nil)
	// Through PutRaw, as a copy writes entries back.
	b = d.NewBatch()
	if err := src.ScanRaw(KeyGroupRange{First: 3, Last: 3}, func(k, v []byte) error {
		b.PutRaw(k, v)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	commit(t, b)
	checkWalk(t, d, timerModel{"3/10/k001": true, "7/50/k003": true}, 0, 40, nil)
	b = d.NewBatch()
	b.DeleteTimer(1, 3, DomainEventTime, 10, []byte("k001"))
	commit(t, b)
	checkWalk(t, d, timerModel{"7/50/k003": true}, 0, 40, nil)
	// Through an ingest.
	if err := d.IngestSorted(ingestFrom(src, KeyGroupRange{First: 3, Last: 3})); err != nil {
		t.Fatal(err)
	}
	checkWalk(t, d, timerModel{"3/10/k001": true, "7/50/k003": true}, 0, 40, nil)
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}

	// A wider DB clipped to a narrower range (a scale-up's slot).
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}
	wide := openDB(t, filepath.Join(root, "src"), testOptions())
	checkWalk(t, wide, timerModel{"3/10/k001": true, "12/30/k002": true}, 0, 40, nil)
	if err := wide.Close(); err != nil {
		t.Fatal(err)
	}
	o.Range = KeyGroupRange{First: 10, Last: 15}
	narrow := openDB(t, filepath.Join(root, "src"), o)
	checkWalk(t, narrow, timerModel{"12/30/k002": true}, 0, 20, nil)
	if err := narrow.DeleteOutsideRange(context.Background()); err != nil {
		t.Fatal(err)
	}
	checkWalk(t, narrow, timerModel{"12/30/k002": true}, 21, 40, nil)
}
