package engine

import (
	"cairn/state"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
)

// windowOutputs is every output of the log but the markers, as "key value"
// in a stable order.
func windowOutputs(b *MemLog) []string {
	var outs []string
	for _, kgOuts := range b.Outputs() {
		for _, o := range kgOuts {
			if !o.Marker {
				outs = append(outs, string(o.Key)+" "+string(o.Value))
			}
		}
	}
	slices.Sort(outs)
	return outs
}

// seeded is how many timer domains each slot of the running job opened from
// the checkpoint's bounds instead of walking its timers. It takes a
// checkpoint first: its barrier passes every slot only once the slot opened.
func (tr *tracer) seeded() []int {
	tr.do(traceBlock{cmd: "checkpoint"})
	var n []int
	for _, s := range tr.e.slots {
		n = append(n, s.timersSeeded)
	}
	return n
}

func timerInput(n, from int64, keys int) []string { return keyedTimerInput("k", n, from, keys) }

func keyedTimerInput(prefix string, n, from int64, keys int) []string {
	var lines []string
	for i := range n {
		lines = append(lines, fmt.Sprintf("%s%d time=%d", prefix, i%int64(keys), from+i))
	}
	return lines
}

// TestTimerBoundsSkipTheWalkAndMissNoTimer: a job whose checkpoint says it
// holds no timer opens, rescaled, without walking its timers; timers set
// after that, and lost in a crash after the next checkpoint (so replayed),
// all fire after restores onto 3 and then 1 slot: the outputs are those of
// the same input run straight through on one slot.
func TestTimerBoundsSkipTheWalkAndMissNoTimer(t *testing.T) {
	z := keyedTimerInput("z", 9, 1, 3) // windows [0,10) of z0..z2, all fired before the first stop
	a := timerInput(40, 1, 12)         // windows [0,10) .. [40,50), pending at the checkpoint
	b := timerInput(30, 60, 7)         // replayed after the crash: later windows only, so the
	// replay's timers alone would not lead the restored slot to a's
	c := timerInput(20, 1000, 5) // moves the watermark past every window above
	start := "start op=ewindow size=10 out_of_order=100 key_groups=16 slots="

	straight := &tracer{t: t, b: NewMemLog(0), store: t.TempDir()}
	straight.do(traceBlock{cmd: start + "1"})
	for _, in := range [][]string{z, a, b, c} {
		straight.do(traceBlock{cmd: "publish", input: in})
	}
	straight.do(traceBlock{cmd: "run"})
	straight.close()
	want := windowOutputs(straight.b)
	if len(want) < 40 || !slices.Contains(want, "z0 0,3") || !slices.Contains(want, "k0 0,1") || !slices.Contains(want, "k0 60,2") {
		t.Fatalf("the straight run fired too few windows: %v", want)
	}

	tr := &tracer{t: t, b: NewMemLog(0), store: t.TempDir()}
	defer tr.close()
	// A watermark at the largest event time (a bound of -1 ms: the
	// watermark is the largest time minus the bound minus 1): z's windows
	// all fire as it is processed, so the stop's checkpoint, which has
	// state to write, bounds every key group at "none".
	tr.do(traceBlock{cmd: "start op=ewindow size=10 out_of_order=-1 key_groups=16 slots=2"})
	if got := tr.seeded(); !slices.Equal(got, []int{0, 0}) {
		t.Fatalf("fresh state: seeded %v, want a walk (0) in every slot: no bound was written", got)
	}
	tr.do(traceBlock{cmd: "publish", input: z})
	tr.do(traceBlock{cmd: "run"})
	tr.do(traceBlock{cmd: "stop"})

	tr.do(traceBlock{cmd: start + "3"})
	if got := tr.seeded(); !slices.Equal(got, []int{2, 2, 2}) {
		t.Fatalf("restored onto 3 slots from a checkpoint without timers: seeded %v, want both domains of every slot", got)
	}
	if s := tr.e.slots[0]; s.nextET != maxInt64 || s.timerFloor[0] != maxInt64 {
		t.Fatalf("slot 0 after a restore without timers: next %d, floor %d", s.nextET, s.timerFloor[0])
	}
	tr.do(traceBlock{cmd: "publish", input: a})
	tr.do(traceBlock{cmd: "run"})
	tr.checkBounds()                     // timers set after the checkpoint said "none"
	tr.do(traceBlock{cmd: "checkpoint"}) // bounds: the earliest pending window's end
	tr.do(traceBlock{cmd: "publish", input: b})
	tr.do(traceBlock{cmd: "run"})
	tr.do(traceBlock{cmd: "crash"})

	tr.do(traceBlock{cmd: start + "1"})
	if got := tr.seeded(); !slices.Equal(got, []int{2}) {
		t.Fatalf("restored onto 1 slot: seeded %v, want both domains", got)
	}
	if s := tr.e.slots[0]; s.nextET != 9 {
		t.Fatalf("restored slot's next event-time timer %d, want 9 (the end of window [0,10), the earliest pending)", s.nextET)
	}
	tr.checkBounds()
	tr.do(traceBlock{cmd: "publish", input: c})
	tr.do(traceBlock{cmd: "run"})
	tr.do(traceBlock{cmd: "stop"})
	if got := windowOutputs(tr.b); !slices.Equal(got, want) {
		t.Fatalf("outputs through restores:\n%v\nstraight:\n%v", got, want)
	}
	if err := checkIndexes(tr.b); err != nil {
		t.Fatal(err)
	}
}

// TestTimerBoundsIdleCheckpointWritesNothing: checkpoints of a slot that
// wrote nothing since the last one write no bound and no stamp, so they
// add nothing to upload; a restore of such a checkpoint does not trust the
// older stamp and walks, and the timers pending all along still fire.
func TestTimerBoundsIdleCheckpointWritesNothing(t *testing.T) {
	start := "start op=ewindow size=10 out_of_order=100 key_groups=8 slots=1"
	tr := &tracer{t: t, b: NewMemLog(0), store: t.TempDir()}
	defer tr.close()
	tr.do(traceBlock{cmd: start})
	tr.do(traceBlock{cmd: "publish", input: timerInput(20, 1, 4)})
	tr.do(traceBlock{cmd: "run"})
	tr.do(traceBlock{cmd: "stop"}) // wrote state: bounds and stamp written

	tr.do(traceBlock{cmd: start})
	if got := tr.seeded(); !slices.Equal(got, []int{2}) {
		t.Fatalf("restored the checkpoint that wrote its bounds: seeded %v, want both domains", got)
	}
	s := tr.e.slots[0]
	w := s.db.Writes()
	tr.do(traceBlock{cmd: "checkpoint"})
	if got := s.db.Writes(); got != w {
		t.Fatalf("an idle checkpoint committed %d batches, want none", got-w)
	}
	tr.do(traceBlock{cmd: "stop"})

	tr.do(traceBlock{cmd: start})
	if got := tr.seeded(); !slices.Equal(got, []int{0}) {
		t.Fatalf("restored an idle checkpoint (its stamp is an older one's): seeded %v, want a walk", got)
	}
	if s := tr.e.slots[0]; s.nextET != 9 {
		t.Fatalf("walked slot's next event-time timer %d, want 9", s.nextET)
	}
	tr.do(traceBlock{cmd: "publish", input: timerInput(4, 1000, 4)})
	tr.do(traceBlock{cmd: "run"})
	want := []string{"k0 0,3", "k0 10,2", "k1 0,2", "k1 10,3", "k2 0,2", "k2 10,3", "k3 0,2", "k3 10,2", "k3 20,1"}
	if got := windowOutputs(tr.b); !slices.Equal(got, want) {
		t.Fatalf("windows fired: %v, want %v", got, want)
	}
}

// checkBounds checks the invariant of the bounds in every running slot's
// DB: no key group holds a timer earlier than its bound.
func (tr *tracer) checkBounds() {
	tr.t.Helper()
	for _, s := range tr.e.slots {
		n := 0
		err := s.db.ScanRaw(s.rng, func(k, _ []byte) error {
			key, err := state.DecodeKey(k)
			if err != nil || key.Kind != state.KindTimer {
				return err
			}
			n++
			v, err := s.db.Counter(key.KeyGroup, state.TimerLowCounter(key.Domain))
			if err != nil {
				return err
			}
			if low := decodeClock(v); low > key.Time {
				return fmt.Errorf("key group %d: timer at %d, bound %d", key.KeyGroup, key.Time, low)
			}
			return nil
		})
		if err != nil {
			tr.t.Fatalf("slot %d: %v", s.idx, err)
		}
		if n == 0 {
			tr.t.Fatalf("slot %d holds no timer to check", s.idx)
		}
	}
}

const maxInt64 = 1<<63 - 1

// TestTimerBoundsOfAnotherCheckpointAreNotTrusted: state whose bounds say
// "no timer" but were stamped by another checkpoint than the one restored
// (what a binary that does not know the bounds leaves behind after setting
// timers) is walked, and its timers fire.
func TestTimerBoundsOfAnotherCheckpointAreNotTrusted(t *testing.T) {
	start := "start op=ewindow size=10 out_of_order=100 key_groups=8 slots=1"
	tr := &tracer{t: t, b: NewMemLog(0), store: t.TempDir()}
	defer tr.close()
	tr.do(traceBlock{cmd: start})
	tr.do(traceBlock{cmd: "publish", input: timerInput(20, 1, 4)})
	tr.do(traceBlock{cmd: "stop"})
	id, _ := tr.newest()
	db, err := state.Open(filepath.Join(tr.store, fmt.Sprintf("chk-%020d", id), "slot-0"), state.Options{KeyGroups: 8, Range: state.SlotRange(0, 1, 8)})
	if err != nil {
		t.Fatal(err)
	}
	b := db.NewBatch()
	for kg := range 8 {
		b.SetCounter(kg, state.CounterTimerLowEventTime, encodeClock(maxInt64))
		b.SetCounter(kg, state.CounterTimerLowProcTime, encodeClock(maxInt64))
		b.SetCounter(kg, state.CounterTimerLowStamp, id-1)
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	b.Close()
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	tr.do(traceBlock{cmd: start})
	if got := tr.seeded(); !slices.Equal(got, []int{0}) {
		t.Fatalf("bounds stamped by checkpoint %d, restored %d: seeded %v, want a walk", id-1, id, got)
	}
	tr.do(traceBlock{cmd: "publish", input: timerInput(4, 1000, 4)})
	tr.do(traceBlock{cmd: "run"})
	// Times 1..20 over k0..k3 (k0: 1, 5, 9, 13, 17): every window of them.
	want := []string{"k0 0,3", "k0 10,2", "k1 0,2", "k1 10,3", "k2 0,2", "k2 10,3", "k3 0,2", "k3 10,2", "k3 20,1"}
	if got := windowOutputs(tr.b); !slices.Equal(got, want) {
		t.Fatalf("windows fired: %v, want %v", got, want)
	}
}
