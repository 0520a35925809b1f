package engine

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"cairn/wasm"
)

// clocks are the pipeline's two clocks, both functions of the input log
// alone, so that a replay after a restore sees the same times at the same
// records:
//
//   - event time: the largest event time routed (maxTime) and the watermark
//     that follows from it (Flink's bounded out-of-orderness);
//   - processing time: ingestion time, the largest JetStream timestamp
//     consumed so far (ticks included), in steps of ProcTimeResolution.
//
// Both are written into every checkpoint and restored from it.
type clocks struct {
	maxTime int64 // largest event time routed (math.MinInt64: none)
	wm      int64 // watermark: records at or before it are late
	pt      int64 // processing clock, Unix ms (math.MinInt64: none yet)
	res     int64 // processing clock step, ms
	// up, on a sub-topology fed by a repartition stream, holds the last
	// watermark of every upstream key group; wm is their least.
	up *wmTable
	// upIdx, beside up, holds the highest Cairn-Out index read of every
	// upstream key group (side-major, as up): a record repeating one is a
	// second writer's copy of an output already processed (upstreamRepeat).
	upIdx []uint64
}

// newClocks resumes the clocks of a checkpoint. upWm and upIdx, for a
// repartition input, are the upstream watermark and highest output index
// of every key group (nil otherwise).
func newClocks(maxTime, pt int64, cfg *Config, upWm []int64, upIdx []uint64) *clocks {
	c := &clocks{maxTime: math.MinInt64, wm: math.MinInt64, pt: pt, res: max(cfg.ProcTimeResolution.Milliseconds(), 1)}
	if upWm != nil {
		c.up = newWMTable(upWm)
		c.upIdx = slices.Clone(upIdx)
		c.maxTime, c.wm = maxTime, c.up.min()
		return c
	}
	c.observe(maxTime, cfg.MaxOutOfOrder.Milliseconds())
	return c
}

// upstreamRepeat reports whether a repartition message of upstream key
// group up (its index in the table) with output index idx repeats an
// output already read, and records idx as read otherwise.
//
// A key group's outputs have one writer at a time, in index order, and an
// output's content is a function of the input (what a restore's skip by
// index rests on), so two messages with one index are one output twice: a
// writer that lost the key group (a group member paused past its lease)
// and published late, after the new owner. The first read is used, the
// repeat dropped, whoever wrote which. A watermark marker repeats its key
// group's last index by design: it is never a repeat, and it raises the
// index it carries (every output at or below it is in the stream before
// it). A message without an index (idx 0) is not checked.
//
// skipped is how many of the key group's outputs the message jumps over:
// after an index was read, the next output is the next index and a
// marker repeats the last one. Outputs skipped are outputs the stream
// lost (or the writer dead-lettered after it gave them their index, an
// output the server refused): a diagnosis, not a refusal.
func (c *clocks) upstreamRepeat(up int, idx uint64, marker bool) (repeat bool, skipped uint64) {
	if idx == 0 {
		return false, 0
	}
	last := c.upIdx[up]
	if idx <= last {
		return !marker, 0
	}
	c.upIdx[up] = idx
	next := last + 1
	if marker {
		next = last
	}
	if last > 0 && idx > next {
		skipped = idx - next
	}
	return false, skipped
}

// upstream applies the watermark an upstream key group carried.
func (c *clocks) upstream(kg int, wm int64) {
	c.up.raise(kg, wm)
	c.wm = c.up.min()
}

// ingest advances the processing clock to a message's JetStream timestamp
// and returns that timestamp in Unix ms. The clock never goes back, even if
// the server's clock did.
func (c *clocks) ingest(tsNanos int64) (tsMs int64) {
	tsMs = floorDiv(tsNanos, int64(time.Millisecond))
	if q := floorDiv(tsMs, c.res) * c.res; q > c.pt {
		c.pt = q
	}
	return tsMs
}

// admit decides whether a record may be routed: nil, or the reason it is a
// dead letter (a key over max_key_bytes, an event time too far ahead of its
// ingestion time, a late event beyond the allowed lateness).
func (c *clocks) admit(r *wasm.Record, in ingested, cfg *Config) error {
	if len(r.Key) > cfg.MaxKeyBytes {
		return fmt.Errorf("engine: key of %d bytes exceeds max_key_bytes %d", len(r.Key), cfg.MaxKeyBytes)
	}
	if skew := cfg.MaxFutureSkew.Milliseconds(); cfg.MaxFutureSkew >= 0 && r.Time > in.ts && r.Time-in.ts > skew {
		return fmt.Errorf("engine: event time %d is %d ms ahead of the record's ingestion time %d (max_future_skew %v): it would move the watermark past every later record",
			r.Time, r.Time-in.ts, in.ts, cfg.MaxFutureSkew)
	}
	if tooLate(r.Time, c.wm, cfg.AllowedLateness.Milliseconds()) {
		if cfg.AllowedLateness > 0 {
			return fmt.Errorf("engine: late event: time %d is %d ms behind the watermark %d (max_out_of_orderness %d ms, allowed_lateness %d ms)",
				r.Time, uint64(c.wm)-uint64(r.Time), c.wm, cfg.MaxOutOfOrder.Milliseconds(), cfg.AllowedLateness.Milliseconds())
		}
		return fmt.Errorf("engine: late event: time %d is %d ms behind the watermark %d (max_out_of_orderness %d ms)", r.Time, c.wm-r.Time, c.wm, cfg.MaxOutOfOrder.Milliseconds())
	}
	return nil
}

// tooLate reports whether an event at t is a dead letter under the
// watermark wm with lateness ms of allowed lateness: it is not after
// wm - lateness. With lateness 0 that is every late event (t <= wm). The
// distance is taken unsigned, so no extreme of t or wm overflows.
func tooLate(t, wm, lateness int64) bool {
	return t <= wm && uint64(wm)-uint64(t) >= uint64(lateness)
}

// observe moves the event clock past a routed record's time.
func (c *clocks) observe(t, bound int64) {
	if t <= c.maxTime {
		return
	}
	c.maxTime = t
	if c.up != nil {
		return // the watermark is the upstream's
	}
	// Flink's bounded out-of-orderness: the watermark promises no more
	// events at or before it.
	if w := t - bound - 1; t > math.MinInt64+bound+1 && w > c.wm {
		c.wm = w
	}
}

// ingested is the ingestion time of one input message and the processing
// clock at it; on a repartition input also the upstream key group and the
// watermark the message carried (upKG -1: none).
type ingested struct {
	seq    uint64
	ts, pt int64
	// arrivedNs is the message's JetStream timestamp (Unix ns), for the
	// record latency (latency.go).
	arrivedNs int64
	upKG      int // index in the upstream watermark table (side*key_groups + kg)
	upWm      int64
	side      uint8 // the upstream side of a two-sided repartition input
}

// wmTable keeps the last watermark of every upstream key group and their
// least, in a segment tree: a message updates it in O(log key_groups).
type wmTable struct {
	n    int
	tree []int64 // tree[n+i]: key group i; tree[i]: min of its children
}

func newWMTable(wms []int64) *wmTable {
	n := len(wms)
	t := &wmTable{n: n, tree: make([]int64, 2*n)}
	copy(t.tree[n:], wms)
	for i := n - 1; i >= 1; i-- {
		t.tree[i] = min(t.tree[2*i], t.tree[2*i+1])
	}
	return t
}

// raise moves key group kg's watermark up to wm (never down).
func (t *wmTable) raise(kg int, wm int64) {
	i := t.n + kg
	if wm <= t.tree[i] {
		return
	}
	t.tree[i] = wm
	for i /= 2; i >= 1; i /= 2 {
		t.tree[i] = min(t.tree[2*i], t.tree[2*i+1])
	}
}

// min is the least watermark (with one key group, tree[1] is its leaf).
func (t *wmTable) min() int64 { return t.tree[1] }

// snapshot copies the table, indexed by key group.
func (t *wmTable) snapshot() []int64 { return append([]int64(nil), t.tree[t.n:]...) }

// upstreamMeta reads a repartition message's upstream key group (the last
// token of its subject) and, with two sides, its side (the token before),
// the watermark it carried and whether it is a marker (no record). up is
// the writer's key group's index in the watermark table: side*keyGroups+kg.
// idx is the message's Cairn-Out (0: none).
func upstreamMeta(m *Message, keyGroups, sides int) (up, side int, wm int64, idx uint64, marker bool, err error) {
	dot := strings.LastIndexByte(m.Subject, '.')
	kg, err := strconv.Atoi(m.Subject[dot+1:])
	if err != nil || kg < 0 || kg >= keyGroups {
		return 0, 0, 0, 0, false, fmt.Errorf("%w: repartition subject %q does not end in a key group below %d", ErrMalformed, m.Subject, keyGroups)
	}
	if sides > 1 {
		rest := m.Subject[:max(dot, 0)]
		side, err = strconv.Atoi(rest[strings.LastIndexByte(rest, '.')+1:])
		if err != nil || side < 0 || side >= sides {
			return 0, 0, 0, 0, false, fmt.Errorf("%w: repartition subject %q does not name a side below %d before its key group", ErrMalformed, m.Subject, sides)
		}
	}
	wm = math.MinInt64
	if v := m.Header.Get(HeaderWatermark); v != "" {
		if wm, err = strconv.ParseInt(v, 10, 64); err != nil {
			return 0, 0, 0, 0, false, fmt.Errorf("%w: header %s=%q", ErrMalformed, HeaderWatermark, v)
		}
	}
	if v := m.Header.Get(HeaderOut); v != "" {
		if idx, err = strconv.ParseUint(v, 10, 64); err != nil {
			return 0, 0, 0, 0, false, fmt.Errorf("%w: header %s=%q", ErrMalformed, HeaderOut, v)
		}
	}
	return side*keyGroups + kg, side, wm, idx, m.Header.Get(HeaderMarker) != "", nil
}

// ingestedAt finds the input message a record came from (a stateless stage
// keeps its emits' input sequence). ing is in sequence order.
func ingestedAt(ing []ingested, seq uint64) ingested {
	i := sort.Search(len(ing), func(i int) bool { return ing[i].seq >= seq })
	if i < len(ing) && ing[i].seq == seq {
		return ing[i]
	}
	// Not reachable for records of this batch; the clock is still defined.
	if i > 0 {
		return ing[i-1]
	}
	return ingested{seq: seq, ts: math.MaxInt64, pt: math.MinInt64}
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

// tickRetry is how long the pipeline waits for a logged tick to come back
// through the input before it logs another.
const tickRetry = 5 * time.Second

// TickSubject is the subject on which the engine logs processing-time ticks
// into a job's input stream.
func TickSubject(job string) string { return tickPrefix + job }

// tickPrefix starts every job's tick subject.
const tickPrefix = "cairn.tick."

// foreignTick reports whether subject is another job's tick subject that
// the job's input subjects do not take: a message on it would not reach a
// source that filtered by the input subjects.
func (e *Engine) foreignTick(subject string) bool {
	return strings.HasPrefix(subject, tickPrefix) && subject != e.tickSubject &&
		len(e.cfg.InputSubjects) > 0 && !anyMatches(e.cfg.InputSubjects, subject)
}

// withoutForeignTicks returns the stream subjects less the tick subjects of
// other jobs that filters do not take (filters include the job's own).
// ReadsWholeStream reports whether a consumer with the input subjects
// filters takes every message of a stream with streamSubjects (no filter:
// all), leaving aside other jobs' processing-time tick subjects, which a
// job drops without effect.
func ReadsWholeStream(filters, streamSubjects []string) bool {
	return len(filters) == 0 || coversAll(filters, withoutForeignTicks(filters, streamSubjects))
}

func withoutForeignTicks(filters, streamSubjects []string) []string {
	var kept []string
	for _, s := range streamSubjects {
		if strings.HasPrefix(s, tickPrefix) && !anyMatches(filters, s) {
			continue
		}
		kept = append(kept, s)
	}
	return kept
}

// maybeTick logs a tick into the input stream when a slot has a
// processing-time timer that the wall clock has passed but the processing
// clock (pt, which only the input moves) has not: the input is idle. The
// tick comes back through the source like any message and moves the
// processing clock to its JetStream timestamp at its place in the log, so
// a replay fires the same timers at the same position. It reports whether
// it tried (the caller then waits tickRetry before the next try).
func (e *Engine) maybeTick(ctx context.Context, pt int64) bool {
	due := int64(math.MaxInt64)
	for _, s := range e.slots {
		due = min(due, s.ptDue.Load())
	}
	// The tick's timestamp becomes the clock in steps of the resolution:
	// a tick before the step that reaches due would fire nothing.
	res := max(e.cfg.ProcTimeResolution.Milliseconds(), 1)
	if due == math.MaxInt64 || due <= pt || floorDiv(e.cfg.Now().UnixMilli(), res)*res < due {
		return false
	}
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := e.tick(pctx); err != nil {
		e.log.Warn("processing-time tick not logged: timers fire with the next record", "subject", e.tickSubject, "err", err)
		return true // retry after tickRetry, not every interval
	}
	return true
}

// needsTicks reports whether the job's keyed stage runs on the ingestion
// clock (and so may need ticks on an idle input).
func (c *Config) needsTicks() bool {
	k := c.keyedStage()
	return k >= 0 && !c.Stages[k].WallClock
}

// SubjectMatches reports whether a NATS subject filter (with * and >)
// matches a literal subject.
func SubjectMatches(filter, subject string) bool {
	f, s := strings.Split(filter, "."), strings.Split(subject, ".")
	for i, t := range f {
		if t == ">" {
			return len(s) > i
		}
		if i >= len(s) || (t != "*" && t != s[i]) {
			return false
		}
	}
	return len(f) == len(s)
}

// coversAll reports whether every subject of a stream (possibly with
// wildcards) is taken by one of the filters: equal to it, ">", or a
// "<prefix>.>" the subject starts with. Conservative: false when unsure.
func coversAll(filters, streamSubjects []string) bool {
	if len(filters) == 0 || len(streamSubjects) == 0 {
		return false
	}
	for _, s := range streamSubjects {
		ok := false
		for _, f := range filters {
			if f == s || f == ">" || (strings.HasSuffix(f, ".>") && strings.HasPrefix(s, f[:len(f)-1])) {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	return true
}

func anyMatches(filters []string, subject string) bool {
	for _, f := range filters {
		if SubjectMatches(f, subject) {
			return true
		}
	}
	return false
}

// sourceFilters are the subjects the source consumes: the job's, plus the
// tick subject when no filter already covers it.
func (e *Engine) sourceFilters() []string {
	f := e.cfg.InputSubjects
	if e.tickSubject != "" && len(f) > 0 && !anyMatches(f, e.tickSubject) {
		f = append(append([]string(nil), f...), e.tickSubject)
	}
	return f
}
