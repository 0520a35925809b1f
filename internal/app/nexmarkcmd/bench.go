package nexmarkcmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"

	"cairn/engine"
	nexmarkq "cairn/examples/nexmark"
	"cairn/internal/app/job"
	"cairn/internal/base/natsembed"
	"cairn/nexmark"
)

// Started is a job the bench started: its engine, ready to Run, and what
// its start restored.
type Started interface {
	Engine() *engine.Engine
	// Engines are the engines of a job graph's sub-topologies, the first
	// (Engine) first; a job of one sub-topology has one.
	Engines() []*engine.Engine
	// RestoreDuration is how long the start's restore took (false: it
	// restored nothing).
	RestoreDuration() (time.Duration, bool)
	Close()
}

// StartFunc starts a job in this process (the runtime's Start).
type StartFunc func(ctx context.Context, j *job.Job) (Started, error)

// BenchConfig is what `cairn nexmark bench` runs.
type BenchConfig struct {
	Queries []string // default: every query of examples/nexmark
	Events  uint64
	Seed    uint64
	Slots   []int
	// Checkpoints are the settings to run: false without checkpoints, true
	// with incremental ones every Interval.
	Checkpoints []bool
	Interval    time.Duration
	// Inputs are the inputs to run each query on: Generated (in process,
	// the default) and JetStream (the same events published once, before
	// the runs, to a NATS server embedded in this process, whose CPU the
	// runs then count too).
	Inputs []string
	// WorkDir holds the runs' data directories and checkpoint stores
	// (removed after each run).
	WorkDir string
	// Modules are the modules to run every query's operators from, each
	// in a run of its own, one after the other for each setting so that
	// they are measured side by side under the same load: Builtin (the
	// module embedded in the binary, the default) or the path of a .wasm
	// built from operators/examples/nexmark (a change to the operators or
	// the SDK measured against the embedded one, say).
	Modules []string
	Start   StartFunc
	// Progress receives a line per run (nil: none).
	Progress io.Writer
}

// The bench's inputs.
const (
	Generated = "generated"
	JetStream = "jetstream"
)

// Builtin names the embedded module in BenchConfig.Modules.
const Builtin = "builtin"

// Row is one run's measurements.
type Row struct {
	Query       string
	Module      string // Builtin or the path of the module the run ran
	Input       string // Generated or JetStream
	Slots       int
	Checkpoints bool
	Events      uint64
	Outputs     uint64
	DeadLetters uint64
	Wall        time.Duration // from the engine's start to the last event processed
	CPU         time.Duration // the process's CPU time over Wall (0: unknown)
	// StateBytes is every slot's state on disk after the checkpoint taken at
	// the end (0 without checkpoints: the memtables are not counted).
	StateBytes uint64
	// Chk is the duration (barrier to commit) of a checkpoint taken once
	// every event was processed; ChkCount the checkpoints taken during
	// the run before it.
	Chk      time.Duration
	ChkCount int
	// Restore is the restore of that checkpoint by a new start of the job
	// (from the node's local checkpoint copy, as a restart on the same
	// machine does).
	Restore time.Duration
}

// EventsPerSec is the run's throughput.
func (r Row) EventsPerSec() float64 { return float64(r.Events) / r.Wall.Seconds() }

// EventsPerCPUSec is the throughput per CPU-second of the whole process:
// comparable with a per-core figure whatever the cores the run had.
func (r Row) EventsPerCPUSec() float64 {
	if r.CPU <= 0 {
		return 0
	}
	return float64(r.Events) / r.CPU.Seconds()
}

// Published are Flink's (1.13) and RisingWave's published Nexmark figures,
// events per second per core (0: not published).
var Published = map[string][2]float64{
	"q0": {155.0e3, 118.4e3}, "q1": {157.9e3, 119.4e3}, "q2": {175.2e3, 127.4e3}, "q3": {152.1e3, 97.4e3},
	"q4": {34.3e3, 13.9e3}, "q5": {22.1e3, 5.2e3}, "q7": {12.3e3, 20.4e3}, "q8": {146.1e3, 60.7e3},
	"q9": {14.2e3, 8.2e3}, "q11": {39.7e3, 0}, "q12": {75.7e3, 0}, "q13": {130.7e3, 0},
	"q14": {161.2e3, 45.4e3}, "q15": {72.4e3, 78.5e3}, "q16": {18.7e3, 8.1e3}, "q17": {116.8e3, 17.3e3},
	"q18": {53.7e3, 9.9e3}, "q19": {44.0e3, 0}, "q20": {19.0e3, 12.7e3}, "q21": {98.5e3, 89.4e3}, "q22": {130.0e3, 110.5e3},
}

// Bench runs every query with every slot count and checkpoint setting and
// returns the rows, in order.
func Bench(ctx context.Context, cfg BenchConfig) ([]Row, error) {
	queries := cfg.Queries
	if len(queries) == 0 {
		queries = nexmarkq.Queries()
	}
	inputs := cfg.Inputs
	if len(inputs) == 0 {
		inputs = []string{Generated}
	}
	natsURL := ""
	if slices.Contains(inputs, JetStream) {
		url, stop, err := publishEvents(ctx, cfg)
		if err != nil {
			return nil, err
		}
		defer stop()
		natsURL = url
	}
	modules := cfg.Modules
	if len(modules) == 0 {
		modules = []string{Builtin}
	}
	for _, m := range modules {
		if m == Builtin {
			continue
		}
		if _, err := os.Stat(m); err != nil {
			return nil, fmt.Errorf("nexmark bench: module: %w", err)
		}
	}
	var rows []Row
	for _, q := range queries {
		for _, in := range inputs {
			for _, slots := range cfg.Slots {
				for _, chk := range cfg.Checkpoints {
					url := ""
					if in == JetStream {
						url = natsURL
					} else if in != Generated {
						return rows, fmt.Errorf("nexmark bench: input %q is neither %s nor %s", in, Generated, JetStream)
					}
					for _, m := range modules {
						row, err := benchOne(ctx, cfg, q, m, slots, chk, url)
						if err != nil {
							return rows, fmt.Errorf("nexmark bench %s, module %s, %s input, %d slots, checkpoints %v: %w", q, m, in, slots, chk, err)
						}
						rows = append(rows, row)
						if cfg.Progress != nil {
							fmt.Fprintf(cfg.Progress, "%s module=%s input=%s slots=%d checkpoints=%v: %.0f events/s, %.0f events/CPU-s\n", q, m, in, slots, chk, row.EventsPerSec(), row.EventsPerCPUSec())
						}
					}
				}
			}
		}
	}
	return rows, nil
}

// publishEvents starts a NATS server in a temporary directory under
// cfg.WorkDir and publishes the bench's events to its stream NEXMARK, as
// `cairn nexmark gen` does; stop shuts it down and removes the directory.
func publishEvents(ctx context.Context, cfg BenchConfig) (url string, stop func(), err error) {
	dir, err := os.MkdirTemp(cfg.WorkDir, "nexmark-nats-")
	if err != nil {
		return "", nil, err
	}
	srv, err := natsembed.Start(natsembed.Options{Dir: dir})
	if err != nil {
		os.RemoveAll(dir)
		return "", nil, err
	}
	stop = func() { srv.Shutdown(); os.RemoveAll(dir) }
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		stop()
		return "", nil, err
	}
	defer nc.Close()
	nx := nexmark.Config{Events: cfg.Events, Seed: cfg.Seed}
	nx.SetDefaults()
	if err := Gen(ctx, nc, GenConfig{Nexmark: nx, Stream: job.NexmarkStream, Subject: "nexmark"}, io.Discard); err != nil {
		stop()
		return "", nil, err
	}
	return srv.URL(), stop, nil
}

// benchOne runs one query; natsURL, when not "", is the server whose
// stream NEXMARK is the input instead of the generator.
func benchOne(ctx context.Context, cfg BenchConfig, q, module string, slots int, chk bool, natsURL string) (Row, error) {
	row := Row{Query: q, Module: module, Input: Generated, Slots: slots, Checkpoints: chk, Events: cfg.Events}
	b, err := nexmarkq.Job(q)
	if err != nil {
		return row, err
	}
	j, err := job.Parse(b)
	if err != nil {
		return row, err
	}
	if module != Builtin {
		abs, err := filepath.Abs(module)
		if err != nil {
			return row, err
		}
		for i := range j.Stages {
			if j.Stages[i].Module == "builtin:nexmark" {
				// The same operators from a file: trusted as the embedded
				// module is (no per-call deadline), so the two compare.
				j.Stages[i].Module = abs
				j.Stages[i].Deadline = &job.Duration{}
			}
		}
	}
	dir, err := os.MkdirTemp(cfg.WorkDir, "nexmark-"+q+"-")
	if err != nil {
		return row, err
	}
	defer os.RemoveAll(dir)
	j.Input.Nexmark.Events, j.Input.Nexmark.Seed = cfg.Events, cfg.Seed
	if natsURL != "" {
		// Each run reads the stream from its start: a job of its own name.
		row.Input = JetStream
		j.Input = job.Input{Stream: job.NexmarkStream, Subjects: []string{"nexmark.>"}}
		j.NATS = natsURL
		j.Name += fmt.Sprintf("-js-%d-%v", slots, chk)
	}
	j.Slots = slots
	j.DataDir = filepath.Join(dir, "data")
	j.HTTP = "off"
	j.Checkpoint = nil
	if chk {
		j.Checkpoint = &job.Checkpoint{Store: "file://" + filepath.ToSlash(filepath.Join(dir, "store")) + "?create_dir=true", Interval: cfg.Interval, Mode: "incremental"}
	}
	j.SetDefaults()
	if err := j.Validate(); err != nil {
		return row, err
	}
	r, err := cfg.Start(ctx, j)
	if err != nil {
		return row, err
	}
	engs := r.Engines()
	eng, last := engs[0], engs[len(engs)-1]
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, len(engs))
	cpu0 := cpuTime()
	t0 := time.Now()
	for _, e := range engs {
		go func() { done <- e.Run(rctx) }()
	}
	stop := func() {
		for _, e := range engs {
			e.Kill() // no final checkpoint: the restore below reads the one taken here
		}
		cancel()
		for range engs {
			<-done
		}
		r.Close()
	}
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for !caughtUp(engs, cfg.Events) {
		select {
		case err := <-done:
			done <- err
			stop()
			return row, fmt.Errorf("the job stopped: %v", err)
		case <-ctx.Done():
			stop()
			return row, ctx.Err()
		case <-tick.C:
		}
	}
	row.Wall = time.Since(t0)
	if c := cpuTime(); c > 0 {
		row.CPU = c - cpu0
	}
	row.Outputs = last.Stats().RecordsOut
	for _, e := range engs {
		row.DeadLetters += e.Stats().DeadLetters
	}
	if chk {
		row.ChkCount = len(eng.Checkpoints())
		for _, e := range engs {
			d, err := checkpointNow(ctx, e)
			if err != nil {
				stop()
				return row, fmt.Errorf("checkpoint at the end: %w", err)
			}
			row.Chk = max(row.Chk, d)
			// The state once the checkpoint flushed it: before, the
			// slots' figures leave out what is still in the memtables.
			for _, b := range e.Stats().StateBytes {
				row.StateBytes += b
			}
		}
	}
	stop()
	if !chk {
		return row, nil
	}
	r2, err := cfg.Start(ctx, j)
	if err != nil {
		return row, fmt.Errorf("restore: %w", err)
	}
	defer r2.Close()
	d, ok := r2.RestoreDuration()
	if !ok {
		return row, errors.New("restore: the restart restored nothing")
	}
	row.Restore = d
	return row, nil
}

// caughtUp reports whether the first engine processed every event and each
// engine after it (a job graph's chain of sub-topologies) read every
// record the one before it wrote.
func caughtUp(engs []*engine.Engine, events uint64) bool {
	if engs[0].Stats().ProcessedSeq < events {
		return false
	}
	for k := 1; k < len(engs); k++ {
		if engs[k].Stats().RecordsIn < engs[k-1].Stats().RecordsOut {
			return false
		}
	}
	return true
}

// checkpointNow takes a checkpoint of e and returns its duration.
func checkpointNow(ctx context.Context, e *engine.Engine) (time.Duration, error) {
	id, ok := e.TriggerCheckpoint(ctx, engine.CheckpointRequest{})
	for !ok { // one is in flight: the next is taken after it
		time.Sleep(5 * time.Millisecond)
		id, ok = e.TriggerCheckpoint(ctx, engine.CheckpointRequest{})
	}
	ev, err := e.WaitCheckpoint(ctx, id)
	if err == nil {
		err = ev.Err
	}
	return ev.Duration, err
}

// PrintTable prints the rows beside the published per-core figures.
func PrintTable(w io.Writer, rows []Row) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	modules := false
	for _, r := range rows {
		modules = modules || (r.Module != "" && r.Module != Builtin)
	}
	if modules {
		// Several modules side by side: the module column first.
		fmt.Fprint(tw, "module\t")
	}
	fmt.Fprintln(tw, "query\tinput\tslots\tcheckpoints\tevents/s\tevents/CPU-s\tFlink/core\tRisingWave/core\tvs Flink\tstate\tcheckpoint\trestore\toutputs\t")
	for _, r := range rows {
		pub := Published[r.Query]
		chk, cd, rd, state := "off", "-", "-", "-"
		if r.Checkpoints {
			chk = "incremental"
			cd, rd = r.Chk.Round(time.Millisecond).String(), r.Restore.Round(time.Millisecond).String()
			state = bytes(r.StateBytes)
		}
		vs := "-"
		if pub[0] > 0 && r.EventsPerCPUSec() > 0 {
			vs = fmt.Sprintf("%.2fx", r.EventsPerCPUSec()/pub[0])
		}
		if modules {
			fmt.Fprintf(tw, "%s\t", filepath.Base(r.Module))
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t\n", r.Query, r.Input, r.Slots, chk, kilo(r.EventsPerSec()), kilo(r.EventsPerCPUSec()),
			kilo(pub[0]), kilo(pub[1]), vs, state, cd, rd, r.Outputs)
	}
	tw.Flush()
	fmt.Fprintln(w, strings.TrimSpace(`
Flink: nexmark/nexmark README (Flink 1.13, RocksDB, incremental checkpoints every 3 min, 8 x 1 slot);
RisingWave: its stream-processing benchmark page (one 8-vCPU node, state on S3). Per-core figures from
different machines: compare ratios measured on one machine, not these columns, where it matters.`))
}

func kilo(v float64) string {
	if v <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f K", v/1000)
}

func bytes(n uint64) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
