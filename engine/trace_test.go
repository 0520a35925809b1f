package engine

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"cairn/state"
	"cairn/wasm"
)

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

var rewrite = flag.Bool("rewrite", false, "rewrite the expected output of engine/testdata/trace-* files and write missing format fixtures")

// TestTraces drives the engine through the trace files in testdata/: input
// messages, checkpoints, crashes, restarts (also on another slot count) and
// ticks in; outputs, dead letters and checkpoint cuts out. No server: the
// log is memBroker, the operators are native Go, the state is real Pebble
// in a temporary directory. Run with -rewrite to refresh the expected
// output after a deliberate change, and read the diff.
//
// Commands (one per block; a block is the command, its input lines, "----"
// and the expected output up to a blank line):
//
//	start slots=N op=count|ewindow|pwindow|dedupe [delivery=exactly_once|transactional] [emit=all|latest] [key_groups=K] [size=MS] [ttl=MS] [out_of_order=MS] [skew=MS|off] [max_key=N] [max_payload=N] [upstream=1]
//	    start the job; it restores the newest committed checkpoint, rescaled
//	    when N differs from its slot count; upstream=1: the input is a
//	    repartition stream
//	publish          one record per line: KEY [time=T] [ts=T] [value=V] [header=NAME:VALUE] [up=KG out=N [wm=W] [marker]]
//	                 (ts: ingestion time, ms; default the previous ts + 1;
//	                 up: a repartition message of upstream key group KG, output index N)
//	tick ts=T        log a processing-time tick
//	run              wait until every input is processed; print new outputs and dead letters
//	checkpoint       take a checkpoint and wait for its commit
//	crash            stop with no final checkpoint: what was published stays, state since the last checkpoint is lost
//	commit-crash     take a checkpoint that commits in the store, then crash before the job learns of the commit
//	                 (transactional: between the commit and the publish of its outbox)
//	stop             graceful stop (final checkpoint)
func TestTraces(t *testing.T) {
	files, err := filepath.Glob("testdata/trace-*")
	if err != nil || len(files) == 0 {
		t.Fatalf("no trace files: %v", err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) { runTraceFile(t, f) })
	}
}

type traceBlock struct {
	cmd    string
	input  []string
	expect string
}

func parseTrace(t *testing.T, path string) []traceBlock {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var blocks []traceBlock
	var cur *traceBlock
	inExpect := false
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case cur == nil && (line == "" || strings.HasPrefix(line, "#")):
		case cur == nil:
			blocks = append(blocks, traceBlock{cmd: line})
			cur = &blocks[len(blocks)-1]
		case !inExpect && line == "----":
			inExpect = true
		case !inExpect:
			cur.input = append(cur.input, line)
		case line == "":
			cur, inExpect = nil, false
		default:
			cur.expect += line + "\n"
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return blocks
}

func runTraceFile(t *testing.T, path string) {
	blocks := parseTrace(t, path)
	tr := &tracer{t: t, b: NewMemLog(0), store: t.TempDir()}
	defer tr.close()
	var out strings.Builder
	failed := false
	for _, bl := range blocks {
		got := tr.do(bl)
		if !*rewrite && got != bl.expect {
			t.Errorf("%s: %s\ngot:\n%swant:\n%s", path, bl.cmd, got, bl.expect)
			failed = true
		}
		out.WriteString(bl.cmd + "\n")
		for _, l := range bl.input {
			out.WriteString(l + "\n")
		}
		out.WriteString("----\n" + got + "\n")
		if failed {
			break
		}
	}
	if err := checkIndexes(tr.b); err != nil {
		t.Errorf("%s: output indexes: %v", path, err)
	}
	if *rewrite {
		head := traceHeader(t, path)
		if err := os.WriteFile(path, []byte(head+out.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// traceHeader keeps a trace file's leading comment block on rewrite.
func traceHeader(t *testing.T, path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var head strings.Builder
	for _, l := range strings.SplitAfter(string(b), "\n") {
		if !strings.HasPrefix(l, "#") && l != "\n" {
			break
		}
		head.WriteString(l)
	}
	return head.String()
}

// tracer runs one trace: the broker and the store outlive every start.
type tracer struct {
	t      *testing.T
	b      *MemLog
	store  string // committed checkpoints: <store>/chk-<id>/slot-<i>, newest wins
	cursor memCursor
	lastTs int64

	e      *Engine
	cancel context.CancelFunc
	done   chan error
	com    *traceCommitter
	kgs    int
}

func (tr *tracer) close() {
	if tr.e != nil {
		tr.stop(true)
	}
}

func (tr *tracer) do(bl traceBlock) string {
	f := strings.Fields(bl.cmd)
	args := map[string]string{}
	for _, a := range f[1:] {
		k, v, _ := strings.Cut(a, "=")
		args[k] = v
	}
	switch f[0] {
	case "start":
		return tr.start(args)
	case "publish":
		var msgs []Message
		for _, l := range bl.input {
			msgs = append(msgs, tr.message(l))
		}
		last := tr.b.Append(msgs...)
		return fmt.Sprintf("seq %d..%d\n", last-uint64(len(msgs))+1, last)
	case "tick":
		ts, _ := strconv.ParseInt(args["ts"], 10, 64)
		tr.lastTs = ts
		seq := tr.b.Append(Message{Subject: TickSubject("trace"), TsNanos: ts * int64(time.Millisecond)})
		return fmt.Sprintf("seq %d\n", seq)
	case "run":
		tr.waitProcessed()
		return newSince(tr.b, &tr.cursor)
	case "checkpoint":
		tr.waitProcessed()
		id, ok := tr.e.TriggerCheckpoint(context.Background(), CheckpointRequest{})
		if !ok {
			tr.t.Fatal("checkpoint: one is in flight")
		}
		ev := tr.waitCheckpoint(id)
		if tr.e.cfg.Delivery == Transactional {
			// The checkpoint's outputs are published once it committed.
			deadline := time.Now().Add(10 * time.Second)
			for _, s := range tr.e.slots {
				for s.outboxThrough.Load() < id {
					if time.Now().After(deadline) {
						tr.t.Fatalf("slot %d did not publish the outbox of checkpoint %d", s.idx, id)
					}
					time.Sleep(time.Millisecond)
				}
			}
		}
		return fmt.Sprintf("checkpoint %d source_seq=%d\n", ev.ID, ev.SourceSeq) + newSince(tr.b, &tr.cursor)
	case "crash":
		tr.stop(false)
		return "crashed\n" + newSince(tr.b, &tr.cursor)
	case "commit-crash":
		tr.waitProcessed()
		tr.com.mu.Lock()
		tr.com.failAfterCommit = true
		tr.com.mu.Unlock()
		id, ok := tr.e.TriggerCheckpoint(context.Background(), CheckpointRequest{})
		if !ok {
			tr.t.Fatal("commit-crash: a checkpoint is in flight")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		ev, err := tr.e.WaitCheckpoint(ctx, id)
		cancel()
		if err != nil || ev.Err == nil {
			tr.t.Fatalf("commit-crash: checkpoint %d: %v, %v (want it committed but failed)", id, err, ev.Err)
		}
		tr.stop(false)
		return fmt.Sprintf("committed %d source_seq=%d, crashed\n", ev.ID, ev.SourceSeq) + newSince(tr.b, &tr.cursor)
	case "stop":
		tr.stop(true)
		return "stopped\n" + newSince(tr.b, &tr.cursor)
	}
	tr.t.Fatalf("unknown trace command %q", bl.cmd)
	return ""
}

// message parses "KEY [time=T] [ts=T] [value=V] [header=NAME:VALUE]
// [up=KG out=N [wm=W] [marker]]". up makes it a repartition message of
// upstream key group KG (subject in.KG, the key in Cairn-Key) with output
// index N; marker makes it a watermark marker.
func (tr *tracer) message(line string) Message {
	f := strings.Fields(line)
	ts := tr.lastTs + 1
	m := Message{Subject: "in." + f[0], Header: nats.Header{}}
	var value string = f[0]
	for _, a := range f[1:] {
		k, v, _ := strings.Cut(a, "=")
		switch k {
		case "time":
			m.Header[HeaderTime] = []string{v}
		case "ts":
			ts, _ = strconv.ParseInt(v, 10, 64)
		case "value":
			value = v
		case "header":
			n, hv, _ := strings.Cut(v, ":")
			m.Header[n] = append(m.Header[n], hv)
		case "keylen":
			n, _ := strconv.Atoi(v)
			m.Header[HeaderKey] = []string{strings.Repeat(f[0], n)}
		case "up":
			m.Subject = "in." + v
			m.Header[HeaderKey] = []string{f[0]}
		case "out":
			m.Header[HeaderOut] = []string{v}
		case "wm":
			m.Header[HeaderWatermark] = []string{v}
		case "marker":
			m.Header[HeaderMarker] = []string{"wm"}
			delete(m.Header, HeaderKey)
		default:
			tr.t.Fatalf("publish: unknown field %q", a)
		}
	}
	tr.lastTs = ts
	m.TsNanos = ts * int64(time.Millisecond)
	m.Data = []byte(value)
	return m
}

func (tr *tracer) start(args map[string]string) string {
	if tr.e != nil {
		tr.t.Fatal("start: the job is running")
	}
	num := func(k string, def int) int {
		if v, ok := args[k]; ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				tr.t.Fatalf("start %s=%q: %v", k, v, err)
			}
			return n
		}
		return def
	}
	slots, kgs, size := num("slots", 1), num("key_groups", 8), num("size", 1000)
	tr.kgs = kgs
	if v, ok := args["max_payload"]; ok {
		n, _ := strconv.ParseInt(v, 10, 64)
		tr.b.mu.Lock()
		tr.b.maxPayload = n
		tr.b.mu.Unlock()
	}
	var factory OperatorFactory
	switch op := args["op"]; op {
	case "count":
		factory = NewNativeCount
	case "ewindow", "pwindow":
		domain := wasm.EventTime
		if op == "pwindow" {
			domain = wasm.ProcessingTime
		}
		factory = func(context.Context, int) (Operator, error) {
			return &nativeWindow{size: int64(size), domain: domain}, nil
		}
	case "dedupe":
		factory = func(context.Context, int) (Operator, error) { return nativeDedupe{}, nil }
	default:
		tr.t.Fatalf("start: unknown op %q", op)
	}
	data := tr.t.TempDir()
	restored, startSeq := tr.restore(data, slots)
	var restoredID uint64
	if restored != "none" {
		restoredID, _ = tr.newest()
	}
	tr.com = &traceCommitter{store: tr.store}
	cfg := Config{
		Job: "trace", KeyGroups: kgs, Slots: slots,
		InputStream: "IN", InputSubjects: []string{"in.>"},
		Stages:       []Stage{{Name: "op", Keyed: true, New: factory, TTL: time.Duration(num("ttl", 0)) * time.Millisecond}},
		OutputStream: "OUT", OutputSubject: "out", Delivery: Delivery(cmp.Or(args["delivery"], string(ExactlyOnce))), Emit: Emit(args["emit"]),
		DataDir: data, StartSeq: startSeq, BatchSize: 4, RestoredCheckpoint: restoredID,
		MaxOutOfOrder: time.Duration(num("out_of_order", 0)) * time.Millisecond,
		MaxKeyBytes:   num("max_key", 0),
		// upstream=1: the input is a repartition stream (in.<kg>).
		UpstreamWatermarks: args["upstream"] == "1",
		Checkpoint:         &CheckpointConfig{Interval: time.Hour, Committer: tr.com},
		Logger:             quietLogger(),
		// The wall clock stays at the epoch: no idle tick is ever due, so
		// every tick is the trace's own.
		Now:                     func() time.Time { return time.Unix(0, 0) },
		ProcessingTimerInterval: time.Hour,
		TTLSweepInterval:        time.Hour,
	}
	switch v := args["skew"]; v {
	case "":
	case "off":
		cfg.MaxFutureSkew = -1
	default:
		n, _ := strconv.Atoi(v)
		cfg.MaxFutureSkew = time.Duration(n) * time.Millisecond
	}
	e, err := NewWithBroker(cfg, tr.b)
	if err != nil {
		tr.t.Fatal(err)
	}
	e.SetNextCheckpointID(tr.com.next())
	ctx, cancel := context.WithCancel(context.Background())
	tr.e, tr.cancel, tr.done = e, cancel, make(chan error, 1)
	go func() { tr.done <- e.Run(ctx) }()
	return fmt.Sprintf("started slots=%d restored=%s start_seq=%d\n", slots, restored, startSeq)
}

// stop ends the running job: gracefully (final checkpoint), or as a crash
// (the committer refuses, so nothing after the last checkpoint is kept).
func (tr *tracer) stop(graceful bool) {
	if !graceful {
		tr.com.crash()
	}
	tr.cancel()
	err := <-tr.done
	if graceful && err != nil {
		tr.t.Fatalf("stop: %v", err)
	}
	if !graceful && err != nil && !errors.Is(err, ErrFinalCheckpoint) {
		tr.t.Fatalf("crash: %v", err)
	}
	tr.e = nil
}

func (tr *tracer) waitProcessed() {
	want := tr.b.LastSeq()
	deadline := time.Now().Add(10 * time.Second)
	for tr.e.Stats().ProcessedSeq < want {
		if time.Now().After(deadline) {
			tr.t.Fatalf("input not processed through seq %d within 10s (at %d)", want, tr.e.Stats().ProcessedSeq)
		}
		select {
		case err := <-tr.done:
			tr.t.Fatalf("the job stopped: %v", err)
		case <-time.After(time.Millisecond):
		}
	}
}

func (tr *tracer) waitCheckpoint(id uint64) CheckpointEvent {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ev, err := tr.e.WaitCheckpoint(ctx, id)
	if err != nil {
		tr.t.Fatalf("checkpoint %d: %v", id, err)
	}
	if ev.Err != nil {
		tr.t.Fatalf("checkpoint %d: %v", id, ev.Err)
	}
	return ev
}

// restore builds the slot directories of data from the newest committed
// checkpoint, rescaled to slots: each new slot's DB is ingested from the
// key groups of the old slots that overlap it.
func (tr *tracer) restore(data string, slots int) (string, uint64) {
	id, meta := tr.newest()
	if id == 0 {
		return "none", 1
	}
	chk := filepath.Join(tr.store, fmt.Sprintf("chk-%020d", id))
	for i := range slots {
		rng := state.SlotRange(i, slots, tr.kgs)
		dir := filepath.Join(data, "state", fmt.Sprintf("slot-%d", i))
		var kvs [][2][]byte
		for j := range meta.slots {
			old := state.SlotRange(j, meta.slots, tr.kgs)
			if !old.Overlaps(rng) {
				continue
			}
			db, err := state.Open(filepath.Join(chk, fmt.Sprintf("slot-%d", j)), state.Options{KeyGroups: tr.kgs, Range: old, ReadOnly: true})
			if err != nil {
				tr.t.Fatal(err)
			}
			err = db.ScanRaw(rng, func(k, v []byte) error {
				kvs = append(kvs, [2][]byte{append([]byte(nil), k...), append([]byte(nil), v...)})
				return nil
			})
			db.Close()
			if err != nil {
				tr.t.Fatal(err)
			}
		}
		db, err := state.IngestSorted(dir, state.Options{KeyGroups: tr.kgs, Range: rng}, func(yield func(k, v []byte) error) error {
			for _, kv := range kvs {
				if err := yield(kv[0], kv[1]); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			tr.t.Fatal(err)
		}
		db.Close()
	}
	rescaled := ""
	if meta.slots != slots {
		rescaled = fmt.Sprintf(" rescaled=%d->%d", meta.slots, slots)
	}
	return fmt.Sprintf("%d%s", id, rescaled), meta.sourceSeq + 1
}

type chkMeta struct {
	slots     int
	sourceSeq uint64
}

func (tr *tracer) newest() (uint64, chkMeta) {
	b, err := os.ReadFile(filepath.Join(tr.store, "NEWEST"))
	if errors.Is(err, fs.ErrNotExist) {
		return 0, chkMeta{}
	}
	if err != nil {
		tr.t.Fatal(err)
	}
	var id uint64
	var m chkMeta
	if _, err := fmt.Sscanf(string(b), "%d %d %d", &id, &m.slots, &m.sourceSeq); err != nil {
		tr.t.Fatal(err)
	}
	return id, m
}

// traceCommitter "uploads" a barrier's snapshots by copying them into the
// store and commits it by writing NEWEST; after crash it refuses.
type traceCommitter struct {
	store   string
	mu      sync.Mutex
	crashed bool
	// failAfterCommit: the next Commit commits, then reports a failure
	// (commit-crash), and every later one refuses.
	failAfterCommit bool
}

func (c *traceCommitter) crash() {
	c.mu.Lock()
	c.crashed = true
	c.mu.Unlock()
}

func (c *traceCommitter) next() uint64 {
	b, err := os.ReadFile(filepath.Join(c.store, "NEWEST"))
	if err != nil {
		return 1
	}
	var id uint64
	fmt.Sscanf(string(b), "%d", &id)
	return id + 1
}

func (c *traceCommitter) Commit(_ context.Context, b Barrier) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.crashed {
		return errors.New("trace: crashed")
	}
	chk := filepath.Join(c.store, fmt.Sprintf("chk-%020d", b.ID))
	for _, s := range b.Slots {
		if err := os.CopyFS(filepath.Join(chk, fmt.Sprintf("slot-%d", s.Slot)), os.DirFS(s.Dir)); err != nil {
			return err
		}
	}
	if err := os.WriteFile(filepath.Join(c.store, "NEWEST"), fmt.Appendf(nil, "%d %d %d", b.ID, len(b.Slots), b.SourceSeq), 0o644); err != nil {
		return err
	}
	if c.failAfterCommit {
		c.crashed = true
		return errors.New("trace: crashed after the commit")
	}
	return nil
}

// nativeWindow counts records per key in tumbling windows of size ms, by
// event time or by processing time, and emits "start,count" when the
// window's timer fires: the logic of the builtin window_count.
type nativeWindow struct {
	size   int64
	domain wasm.TimerDomain
}

func (w *nativeWindow) Process(_ context.Context, b *wasm.Batch, st wasm.State) (*wasm.Output, error) {
	out := &wasm.Output{}
	type cell struct{ key, sub string }
	counts := map[cell]int{}
	var order []cell
	for i, tm := range b.Timers {
		start := tm.Time - w.size + 1
		sub := strconv.FormatInt(start, 10)
		v, ok, err := st.Get(tm.Key, []byte(sub))
		if err != nil {
			return nil, err
		}
		if !ok {
			continue
		}
		out.Emits = append(out.Emits, wasm.Emit{Key: tm.Key, Value: fmt.Appendf(nil, "%d,%s", start, v), Time: tm.Time, Input: -1, Timer: i})
		out.State = append(out.State, wasm.StateOp{Key: tm.Key, Sub: []byte(sub), Delete: true})
	}
	for _, r := range b.Records {
		t := r.Time
		if w.domain == wasm.ProcessingTime {
			t = b.ProcTime
		}
		start := floorDiv(t, w.size) * w.size
		c := cell{string(r.Key), strconv.FormatInt(start, 10)}
		if _, seen := counts[c]; !seen {
			v, ok, err := st.Get(r.Key, []byte(c.sub))
			if err != nil {
				return nil, err
			}
			if ok {
				counts[c], _ = strconv.Atoi(string(v))
			} else {
				counts[c] = 0
			}
			order = append(order, c)
			out.Timers = append(out.Timers, wasm.TimerOp{Key: []byte(c.key), Time: start + w.size - 1, Domain: w.domain})
		}
		counts[c]++
	}
	for _, c := range order {
		out.State = append(out.State, wasm.StateOp{Key: []byte(c.key), Sub: []byte(c.sub), Value: strconv.AppendInt(nil, int64(counts[c]), 10)})
	}
	return out, nil
}

func (w *nativeWindow) Close(context.Context) error { return nil }

// nativeDedupe emits a record the first time its key is seen while the
// key's state lives (the stage's TTL): the logic of the builtin dedupe.
type nativeDedupe struct{}

func (nativeDedupe) Process(_ context.Context, b *wasm.Batch, st wasm.State) (*wasm.Output, error) {
	out := &wasm.Output{}
	seen := map[string]bool{}
	for i, r := range b.Records {
		if seen[string(r.Key)] {
			continue
		}
		_, ok, err := st.Get(r.Key, nil)
		if err != nil {
			return nil, err
		}
		seen[string(r.Key)] = true
		if ok {
			continue
		}
		out.State = append(out.State, wasm.StateOp{Key: r.Key, Value: []byte("1")})
		out.Emits = append(out.Emits, wasm.Emit{Key: r.Key, Value: r.Value, Time: r.Time, Input: i})
	}
	return out, nil
}

func (nativeDedupe) Close(context.Context) error { return nil }
