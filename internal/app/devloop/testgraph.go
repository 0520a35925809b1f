package devloop

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	goruntime "runtime"

	"cairn/internal/app/runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"cairn/engine"
	"cairn/internal/app/job"
	"cairn/wasm"
)

// `cairn test` of a job graph (several sub-topologies, a two-input stage,
// named outputs): every sub-topology runs as it does under `cairn run`
// (startSub, its own engine, data directory, checkpoints and restores),
// joined by in-memory repartition streams (testLog) instead of NATS.
//
// The graph advances one input record at a time: the record is appended
// to its input's stream, then each sub-topology in topological order gets
// what its upstreams published for it (sorted by subject and output index)
// and processes it all. Each repartition stream thus holds one order that
// follows from the input file alone — the order a running job's streams
// could have, fixed — so outputs, the replay after a restore and the
// comparison with an expect file are deterministic.
//
// A downstream's watermark is its upstreams' (carried by each message, and
// by the markers every checkpoint puts on every key group). At the end of
// the input every sub-topology, in order, takes a checkpoint, as a running
// job's periodic checkpoint would: the markers carry each upstream's final
// watermark downstream, and the timers it passed fire.

// RecordError is a line of a `cairn test` input file the job cannot take:
// the file, the line and why.
type RecordError struct {
	File   string
	Line   int
	Reason string
}

func (e *RecordError) Error() string { return fmt.Sprintf("%s:%d: %s", e.File, e.Line, e.Reason) }

// checkRecords resolves the input each record belongs to (its "input", or
// the job's only one) and refuses a record its input cannot take.
func checkRecords(j *job.Job, recs []testRecord, file string) error {
	var names []string
	for _, in := range j.InputsOf() {
		names = append(names, in.Name)
	}
	for i := range recs {
		r := &recs[i]
		bad := func(format string, a ...any) error {
			return &RecordError{File: file, Line: r.line, Reason: fmt.Sprintf(format, a...)}
		}
		if r.Tick {
			if r.Input != "" || r.Delete {
				return bad(`a tick moves the processing clock of every sub-topology: it has no "input" or "delete"`)
			}
			continue
		}
		if r.Input == "" {
			if len(names) > 1 {
				return bad(`the job has inputs %s: name the record's with "input"`, strings.Join(names, ", "))
			}
			r.Input = names[0]
		}
		in, ok := j.InputNamed(r.Input)
		if !ok {
			return bad("unknown input %q (the job's inputs: %s)", r.Input, strings.Join(names, ", "))
		}
		if in.Table == "" {
			if r.Delete {
				return bad(`"delete" removes a table's row, and input %q is a stream`, r.Input)
			}
			continue
		}
		if r.Time != nil {
			return bad(`input %q is a table (KV bucket %s): a row has no event time, its time is its ingestion time: set "ts"`, r.Input, in.Table)
		}
		if r.Delete && r.Value != "" {
			return bad(`a delete of table %q has no "value"`, r.Input)
		}
	}
	return nil
}

// isGraphTest reports whether the job needs the graph runner: several
// sub-topologies, several output targets, or a named output.
func isGraphTest(subs []job.SubTopology) bool {
	return len(subs) > 1 || len(subs[0].Targets) > 1 || subs[0].Targets[0].Output != ""
}

// graphStep is one record of the input file: its message on its stream,
// or a tick (at ts).
type graphStep struct {
	tick   bool
	stream string
	msg    engine.Message
}

// graphSteps turns checked records into messages on their inputs'
// streams; the ingestion times follow testMessages' rule.
func graphSteps(j *job.Job, recs []testRecord) []graphStep {
	var ts int64
	steps := make([]graphStep, 0, len(recs))
	for _, r := range recs {
		ts = ingestTime(ts, r)
		tsNanos := ts * int64(time.Millisecond)
		if r.Tick {
			steps = append(steps, graphStep{tick: true, msg: engine.Message{TsNanos: tsNanos}})
			continue
		}
		in, _ := j.InputNamed(r.Input)
		h := nats.Header{}
		for k, v := range r.Headers {
			h.Set(k, v)
		}
		st := graphStep{}
		if in.Table != "" {
			stream, _ := engine.TableStream(in.Table)
			st.stream = stream
			if r.Delete {
				h.Set("KV-Operation", "DEL")
			}
			st.msg = engine.Message{Subject: "$KV." + in.Table + "." + r.Key, TsNanos: tsNanos, Header: h, Data: []byte(r.Value)}
		} else {
			st.stream = in.Stream
			subject := r.Input
			if len(in.Subjects) > 0 {
				subject = strings.NewReplacer("*", "x", ">", "x").Replace(in.Subjects[0])
			}
			h.Set(engine.HeaderKey, r.Key)
			if r.Time != nil {
				h.Set(engine.HeaderTime, strconv.FormatInt(*r.Time, 10))
			}
			st.msg = engine.Message{Subject: subject, TsNanos: tsNanos, Header: h, Data: []byte(r.Value)}
		}
		steps = append(steps, st)
	}
	return steps
}

// graphRun is one run of a job graph over an input file.
type graphRun struct {
	ctx   context.Context
	j     *job.Job
	subs  []job.SubTopology
	plan  *runtime.Plan
	tl    *engine.MemLog
	views []*engine.MemView
	rt    *wasm.Runtime
	log   *slog.Logger
	res   *testResult
	base  []int // each sub-topology's slot count in the job
	slots []int // each one's now

	// Per sub-topology while started: the Running, the cancel of its Run,
	// and its result once it stopped (stopped closed).
	running []*runtime.Running
	cancel  []context.CancelFunc
	stopped []chan struct{}
	errs    []error

	mu struct {
		sync.Mutex
		// replayDiffs are the regenerated outputs that differ from the
		// published ones (OnReplay, from the slots).
		replayDiffs []string
	}
}

// runGraphTest runs a job graph over the records as runTest runs one
// sub-topology. every > 0 checkpoints every sub-topology after every
// `every` records; with kill it then processes every/2 more, kills them
// all (no final checkpoint) and restores each from its checkpoint on its
// next slot count, so those records are replayed.
func runGraphTest(ctx context.Context, j0 *job.Job, recs []testRecord, every int, kill bool, log *slog.Logger) (*testResult, error) {
	j, tmp, err := testJobIn(j0)
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	plan, err := runtime.NewPlan(&j)
	if err != nil {
		return nil, err
	}
	subs := plan.Subs
	rt, err := runtime.NewWasmRuntime(ctx, j.DataDir)
	if err != nil {
		return nil, err
	}
	defer rt.Close(context.WithoutCancel(ctx))
	g := &graphRun{ctx: ctx, j: &j, subs: subs, plan: plan, tl: newGraphLog(), rt: rt, log: log, res: &testResult{}}
	for k := range subs {
		sj := plan.SubJob(k)
		targets := []engine.MemTarget{{Stream: sj.Output.Stream, Subject: sj.Output.Subject, Repartition: subs[k].Targets[0].Feeds >= 0}}
		for _, x := range sj.Extra {
			targets = append(targets, engine.MemTarget{Stream: x.Stream, Subject: x.Subject, Repartition: x.Repartition})
		}
		for n := range targets {
			if targets[n].Stream == "" { // core delivery: a subject, no stream
				targets[n].Stream = "core:" + targets[n].Subject
			}
		}
		g.views = append(g.views, g.tl.View(sj.Name, sj.Input.Stream, targets))
		g.base = append(g.base, sj.Slots)
	}
	defer g.stopAll(true)
	if err := g.startAll(g.base); err != nil {
		return nil, err
	}
	steps := graphSteps(&j, recs)
	if every == 0 {
		every = len(steps) + 1
	}
	for pos := 0; pos < len(steps); {
		end := min(pos+every, len(steps))
		if err := g.steps(steps[pos:end]); err != nil {
			return nil, err
		}
		if end == len(steps) {
			break
		}
		if err := g.checkpointAll(); err != nil {
			return nil, err
		}
		replay := min(end+max(every/2, 1), len(steps))
		if err := g.steps(steps[end:replay]); err != nil {
			return nil, err
		}
		pos = replay
		if pos >= len(steps) || !kill {
			continue
		}
		if err := g.stopAll(true); err != nil {
			return nil, err
		}
		g.res.restores++
		next := make([]int, len(subs))
		for k, b := range g.base {
			counts := []int{b, min(b+1, j.KeyGroups), max(b-1, 1)}
			next[k] = counts[g.res.restores%len(counts)]
		}
		if err := g.startAll(next); err != nil {
			return nil, fmt.Errorf("restore %d: %w", g.res.restores, err)
		}
		if err := g.settle(); err != nil {
			return nil, fmt.Errorf("restore %d: %w", g.res.restores, err)
		}
	}
	// The end of the input: a checkpoint of each sub-topology in order
	// carries its watermark downstream (the markers); then a graceful stop.
	if err := g.checkpointAll(); err != nil {
		return nil, err
	}
	if err := g.stopAll(false); err != nil {
		return nil, err
	}
	g.tl.ReleaseAll()
	g.mu.Lock()
	g.res.replayDiffs = g.mu.replayDiffs
	g.mu.Unlock()
	g.collect()
	for k, sub := range subs {
		st, ok := sub.Keyed()
		if !ok {
			continue
		}
		sj := plan.SubJob(k)
		sj.Slots = g.slots[k]
		lines, err := dumpState(sj, st.Name)
		if err != nil {
			return nil, err
		}
		g.res.state = append(g.res.state, lines...)
	}
	return g.res, nil
}

// startAll starts every sub-topology on its slot count in slots, each
// restoring its latest checkpoint.
func (g *graphRun) startAll(slots []int) error {
	g.tl.ReleaseAll() // a restart reads what every stream holds
	g.slots = slots
	g.res.subSlots = append(g.res.subSlots, slots)
	n := len(g.subs)
	g.running, g.cancel, g.stopped, g.errs = make([]*runtime.Running, n), make([]context.CancelFunc, n), make([]chan struct{}, n), make([]error, n)
	for k := range g.subs {
		sj := g.plan.SubJob(k)
		sj.Slots = slots[k]
		onReplay := func(kg int, idx uint64, key, value []byte, evTime int64) {
			if err := g.views[k].Replayed(0, kg, idx, key, value, evTime); err != nil {
				g.mu.Lock()
				g.mu.replayDiffs = append(g.mu.replayDiffs, "sub-topology "+sj.Name+": "+err.Error())
				g.mu.Unlock()
			}
		}
		r, err := g.plan.StartSub(g.ctx, k, sj, runtime.Options{Broker: g.views[k], OnReplay: onReplay}, g.log, g.rt)
		if err != nil {
			_ = g.stopAll(true)
			return fmt.Errorf("sub-topology %d (%s): %w", k, sj.Name, err)
		}
		rctx, cancel := context.WithCancel(g.ctx)
		g.running[k], g.cancel[k], g.stopped[k] = r, cancel, make(chan struct{})
		go func() {
			g.errs[k] = r.RunEngine(rctx) // with an online restore's download, as cairn run
			close(g.stopped[k])
		}()
	}
	return nil
}

// stopAll stops every started sub-topology, killed (no final checkpoint)
// or gracefully, and closes it.
func (g *graphRun) stopAll(kill bool) error {
	var errs []error
	for k, r := range g.running {
		if r == nil {
			continue
		}
		if kill {
			r.Engine.Kill()
		}
		g.cancel[k]()
		<-g.stopped[k]
		r.Close()
		if err := g.errs[k]; err != nil && !(kill && errors.Is(err, context.Canceled)) {
			errs = append(errs, fmt.Errorf("sub-topology %s: %w", r.Job.Name, err))
		}
		g.running[k] = nil
	}
	return errors.Join(errs...)
}

// steps processes records one at a time through the whole graph.
func (g *graphRun) steps(steps []graphStep) error {
	for _, st := range steps {
		g.tl.SetNow(st.msg.TsNanos)
		if st.tick {
			for k, v := range g.views {
				if tick := v.TickSubject(); tick != "" {
					g.tl.AppendTo(g.views[k].Input(), engine.Message{Subject: tick, TsNanos: st.msg.TsNanos})
				}
			}
		} else {
			g.tl.AppendTo(st.stream, st.msg)
		}
		if err := g.settle(); err != nil {
			return err
		}
	}
	return nil
}

// settle lets each sub-topology, in topological order, take what its
// upstreams published and process everything it has.
func (g *graphRun) settle() error {
	for k := range g.subs {
		g.tl.Release(g.views[k].Input())
		if err := g.wait(k); err != nil {
			return err
		}
	}
	g.tl.ReleaseAll() // the outputs
	return nil
}

// checkpointAll checkpoints each sub-topology in order, once it has
// processed what its upstreams published before their checkpoints
// (their markers included).
func (g *graphRun) checkpointAll() error {
	for k := range g.subs {
		g.tl.Release(g.views[k].Input())
		if err := g.wait(k); err != nil {
			return err
		}
		e := g.running[k].Engine
		id, ok := e.TriggerCheckpoint(g.ctx, engine.CheckpointRequest{})
		if !ok {
			return fmt.Errorf("sub-topology %s: checkpoint: one is in flight", g.running[k].Job.Name)
		}
		if ev, err := e.WaitCheckpoint(g.ctx, id); err != nil || ev.Err != nil {
			return fmt.Errorf("sub-topology %s: checkpoint %d: %w", g.running[k].Job.Name, id, errors.Join(err, ev.Err))
		}
	}
	g.tl.ReleaseAll()
	return nil
}

// wait waits until sub-topology k has processed everything visible on its
// input.
func (g *graphRun) wait(k int) error {
	r := g.running[k]
	pause := 20 * time.Microsecond
	// A minute without progress fails the run; a slow machine that makes
	// progress does not.
	deadline, last := time.Now().Add(time.Minute), r.Engine.Stats().ProcessedSeq
	for spin := 0; ; spin++ {
		at := r.Engine.Stats().ProcessedSeq
		if want, ok := g.views[k].CaughtUpTo(); ok && at >= want {
			return nil
		}
		if at > last {
			deadline, last = time.Now().Add(time.Minute), at
		}
		if spin < 50 {
			// A record crosses a sub-topology in tens of microseconds:
			// yield before sleeping (a timer sleeps 50µs at the least).
			goruntime.Gosched()
			continue
		}
		select {
		case <-g.stopped[k]:
			return fmt.Errorf("sub-topology %s stopped: %v", r.Job.Name, g.errs[k])
		case <-g.ctx.Done():
			return g.ctx.Err()
		case <-time.After(pause):
		}
		pause = min(2*pause, time.Millisecond)
		if time.Now().After(deadline) {
			want, _ := g.views[k].CaughtUpTo()
			return fmt.Errorf("sub-topology %s: its input not processed through %d: no progress in a minute (at %d)", r.Job.Name, want, r.Engine.Stats().ProcessedSeq)
		}
	}
}

// collect reads the job's outputs (in the order of the job's outputs:
// `output:`, then `outputs:`, each by key group and index) and the dead
// letters.
func (g *graphRun) collect() {
	order := map[string]int{"": 0}
	for i, o := range g.j.Outputs {
		order[o.Name] = i + 1
	}
	var outs []testOutput
	for k, sub := range g.subs {
		for n, t := range sub.Targets {
			if t.Feeds >= 0 {
				continue
			}
			tg := g.views[k].Targets()[n]
			for _, m := range g.tl.StreamOutputs(tg.Stream, tg.Subject) {
				if !m.Marker {
					outs = append(outs, testOutput{Output: t.Output, KeyGroup: m.KeyGroup, Index: m.Index, Key: m.Key, Value: m.Value, Time: m.Time})
				}
			}
		}
	}
	slices.SortStableFunc(outs, func(a, b testOutput) int {
		if a.Output != b.Output {
			return order[a.Output] - order[b.Output]
		}
		if a.KeyGroup != b.KeyGroup {
			return a.KeyGroup - b.KeyGroup
		}
		return cmp.Compare(a.Index, b.Index)
	})
	for _, o := range outs {
		g.res.lines = append(g.res.lines, o.line())
	}
	for _, d := range g.tl.JobDeadLetters() {
		h := d.Msg.Header
		g.res.dead = append(g.res.dead, fmt.Sprintf("sub-topology %s seq %s stage %s: %s", d.Job, h.Get(engine.HeaderSeq), h.Get(engine.HeaderStage), h.Get(engine.HeaderError)))
	}
}

// newGraphLog is the log a job graph runs on in `cairn test`: what a
// sub-topology publishes is held until the driver releases it, so that
// every stream's order follows from the input file alone.
func newGraphLog() *engine.MemLog {
	l := engine.NewMemLog(0)
	l.HoldPublishes()
	return l
}
