package engine

import (
	"encoding/binary"
	"fmt"

	"cairn/state"
)

// OutputTarget is one destination of a sub-topology's outputs: a stream
// partitioned by key group (<Subject>.<key group>), fed by one output
// port of the last stage.
type OutputTarget struct {
	Stream, Subject string
	// Repartition: a repartition stream read by another sub-topology (see
	// Config.Repartition).
	Repartition bool
	// Port is the output port whose emits go here (0: the stage's first,
	// or only, one).
	Port int
}

// targets returns every output target: target 0 (OutputStream,
// OutputSubject, Repartition, port 0), then Extra.
func (c *Config) targets() []OutputTarget {
	t := []OutputTarget{{Stream: c.OutputStream, Subject: c.OutputSubject, Repartition: c.Repartition}}
	return append(t, c.Extra...)
}

// portTargets maps each output port to the targets it feeds, in target
// order.
func (c *Config) portTargets() [][]int {
	var pt [][]int
	for t, tg := range c.targets() {
		for len(pt) <= tg.Port {
			pt = append(pt, nil)
		}
		pt[tg.Port] = append(pt[tg.Port], t)
	}
	return pt
}

// lane is one output target of a slot: its publisher and, per key group of
// the slot, the outputs so far, what the stream already holds, the fence
// of the next publish and (a table's forwarder) the last entry forwarded.
//
// INVARIANT: each lane's key group subjects have one writer, this slot, in
// output index order, exactly as a job with one output: the per-target
// count is what makes a replay regenerate the same index for the same
// output of the same target.
type lane struct {
	target OutputTarget
	sink   Publisher
	count  []uint64 // per key group in rng: outputs so far
	skipTo []uint64 // per key group: outputs the stream already holds (exactly_once)
	// lastSrc, on a table forwarder (Config.InputTable), is per key group
	// the stream sequence of the last KV entry forwarded: entries at or
	// below it are skipped (nil otherwise).
	lastSrc  []uint64
	fenceSeq []uint64 // per key group: expected last subject sequence of the next publish (0: none)
	// heldWm is per key group the watermark the stream's last message
	// carried at start: a marker taken while the slot still regenerates
	// what the stream holds carries at least it, so a subject's watermark
	// never goes back.
	heldWm []int64
	// counterSub is the state entry of the count of a target after the
	// first (SystemStage, key outputsKey, sub = the target's subject): keyed
	// by the subject, so reordering a job's outputs keeps each count with
	// its stream. nil for target 0, whose count is state.CounterOutputs.
	counterSub []byte
	// dirty lists the key groups (index in rng) whose count changed since
	// the lane's counts were last written into a batch (isDirty marks
	// them): a batch writes each key group's count once, its last value,
	// instead of once per output (writeDirtyCounts).
	dirty   []int
	isDirty []bool
}

// outputsKey is the state key of the output counts of targets after the
// first.
var outputsKey = []byte("outputs")

// readCount reads the lane's output count of key group kg.
func (l *lane) readCount(db *state.DB, kg int) (uint64, error) {
	if l.counterSub == nil {
		return db.Counter(kg, state.CounterOutputs)
	}
	v, ok, err := db.Get(state.SystemStage, kg, outputsKey, l.counterSub)
	if err != nil || !ok {
		return 0, err
	}
	n, k := binary.Uvarint(v)
	if k <= 0 {
		return 0, fmt.Errorf("output count of %s: malformed entry %x", l.counterSub, v)
	}
	return n, nil
}

// writeCount writes the lane's output count of key group kg into b.
func (l *lane) writeCount(b *state.Batch, kg int, n uint64) {
	if l.counterSub == nil {
		b.SetCounter(kg, state.CounterOutputs, n)
		return
	}
	b.Put(state.SystemStage, kg, outputsKey, l.counterSub, binary.AppendUvarint(nil, n))
}

// touch marks key group index i (kg - rng.First) as changed since the
// last writeDirtyCounts.
func (l *lane) touch(i int) {
	if len(l.isDirty) != len(l.count) {
		l.isDirty = make([]bool, len(l.count))
		l.dirty = l.dirty[:0]
	}
	if !l.isDirty[i] {
		l.isDirty[i] = true
		l.dirty = append(l.dirty, i)
	}
}

// writeDirtyCounts writes the count of every key group touched since the
// last call into b (first is the slot's first key group).
//
// INVARIANT: a batch holds the final count of every key group it made
// outputs for, so the committed count and the committed outputs (state
// writes, outbox) always match, as if each output had written its own.
// (A count a call moved before failing, its batch never committed, is
// written by the next commit: the count in memory is what the next output
// continues from either way.)
func (l *lane) writeDirtyCounts(b *state.Batch, first int) {
	for _, i := range l.dirty {
		l.writeCount(b, first+i, l.count[i])
		l.isDirty[i] = false
	}
	l.dirty = l.dirty[:0]
}

// mergeFences returns a channel closed once every one of fences is.
func mergeFences(fences []<-chan struct{}) <-chan struct{} {
	if len(fences) == 1 {
		return fences[0]
	}
	all := make(chan struct{})
	go func() {
		for _, f := range fences {
			<-f
		}
		close(all)
	}()
	return all
}
