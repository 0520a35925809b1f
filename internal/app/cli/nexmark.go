package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"cairn/engine"
	"cairn/internal/app/cmdline"
	"cairn/internal/app/job"
	"cairn/internal/app/nexmarkcmd"
	"cairn/internal/app/runtime"
	"cairn/nexmark"
)

// cmdNexmark is `cairn nexmark gen|bench` (internal/app/nexmarkcmd).
func cmdNexmark(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || (args[0] != "gen" && args[0] != "bench") {
		fmt.Fprintln(stderr, "usage: cairn nexmark gen --events N [--rate R] [--seed S] --nats URL\n       cairn nexmark bench [--events N] [--queries q0,q5] [--slots 1,2]")
		return fmt.Errorf("want gen or bench, not %q", strings.Join(args, " "))
	}
	if args[0] == "gen" {
		return nexmarkGen(ctx, args[1:], stdout, stderr)
	}
	return nexmarkBench(ctx, args[1:], stdout, stderr)
}

func nexmarkGen(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := cmdline.NewFlagSet("nexmark gen", "cairn nexmark gen --events N [--rate R] [--seed S] --nats URL", stderr)
	var c nexmarkcmd.GenConfig
	fs.Uint64Var(&c.Nexmark.Events, "events", 0, "events to publish")
	fs.Uint64Var(&c.Nexmark.Rate, "rate", nexmark.DefaultRate, "events per second of event time")
	fs.Uint64Var(&c.Nexmark.Seed, "seed", 1, "seed of the events")
	fs.Int64Var(&c.Nexmark.BaseTime, "base-time", nexmark.DefaultBaseTime, "event time of the first event, Unix ms")
	fs.StringVar(&c.Stream, "stream", "NEXMARK", "JetStream stream (created with subjects SUBJECT.> when missing)")
	fs.StringVar(&c.Subject, "subject", "nexmark", "subject prefix: events go to SUBJECT.<person|auction|bid>.<key>")
	fs.IntVar(&c.PublishRate, "publish-rate", 0, "at most this many events per wall-clock second (0: as fast as the server acknowledges)")
	url := fs.String("nats", "", "NATS URL (nats://host:port)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *url == "" {
		fs.Usage()
		return fmt.Errorf("nexmark gen: --nats is required")
	}
	nc, err := nats.Connect(*url, nats.Name("cairn-nexmark-gen"))
	if err != nil {
		return fmt.Errorf("nexmark gen: connect %s: %w", runtime.RedactURL(*url), err)
	}
	defer nc.Close()
	return nexmarkcmd.Gen(ctx, nc, c, stdout)
}

func nexmarkBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := cmdline.NewFlagSet("nexmark bench", "cairn nexmark bench [flags]", stderr)
	c := nexmarkcmd.BenchConfig{Interval: 10 * time.Second}
	fs.Uint64Var(&c.Events, "events", 1_000_000, "events per run")
	fs.Uint64Var(&c.Seed, "seed", 1, "seed of the events")
	queries := fs.String("queries", "", "queries to run, like q0,q5 (default: every one in examples/nexmark)")
	slots := fs.String("slots", "1,2", "slot counts to run each query with")
	chk := fs.String("checkpoints", "off,on", "checkpoint settings: off, on (incremental every --interval), or both")
	fs.DurationVar(&c.Interval, "interval", 10*time.Second, "checkpoint interval of the runs with checkpoints")
	inputs := fs.String("input", "generated", "inputs to run each query on: generated (in process), jetstream (the events published first to a NATS server in this process), or both")
	fs.StringVar(&c.WorkDir, "work", "", "directory for the runs' data (default: the system's temporary directory)")
	logLevel := fs.String("log-level", "error", "debug, info, warn or error")
	modules := fs.String("modules", nexmarkcmd.Builtin, "modules to run the queries' operators from, each query with each in turn (side by side under one load): builtin (the embedded one) or the path of a .wasm built from operators/examples/nexmark, comma separated")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the whole bench to this file (go tool pprof)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	stopProfile, err := startCPUProfile(*cpuProfile)
	if err != nil {
		return err
	}
	defer stopProfile()
	c.Modules = strings.Split(*modules, ",")
	if *queries != "" {
		c.Queries = strings.Split(*queries, ",")
	}
	for _, in := range strings.Split(*inputs, ",") {
		if in != nexmarkcmd.Generated && in != nexmarkcmd.JetStream {
			return fmt.Errorf("--input: %q is neither %s nor %s", in, nexmarkcmd.Generated, nexmarkcmd.JetStream)
		}
		c.Inputs = append(c.Inputs, in)
	}
	for _, s := range strings.Split(*slots, ",") {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			return fmt.Errorf("--slots: %q is not a slot count", s)
		}
		c.Slots = append(c.Slots, n)
	}
	for _, s := range strings.Split(*chk, ",") {
		switch s {
		case "off":
			c.Checkpoints = append(c.Checkpoints, false)
		case "on":
			c.Checkpoints = append(c.Checkpoints, true)
		default:
			return fmt.Errorf("--checkpoints: %q is neither off nor on", s)
		}
	}
	log := cmdline.NewLogger(stderr, *logLevel)
	c.Start = func(ctx context.Context, j *job.Job) (nexmarkcmd.Started, error) {
		r, err := runtime.Start(ctx, j, runtime.Options{}, log)
		if err != nil {
			return nil, err
		}
		return benchRunning{r}, nil
	}
	c.Progress = stderr
	host, _ := os.Hostname()
	fmt.Fprintf(stdout, "cairn nexmark bench: %d events per run, seed %d, host %s, %s\n", c.Events, c.Seed, host, loadAvg())
	rows, err := nexmarkcmd.Bench(ctx, c)
	nexmarkcmd.PrintTable(stdout, rows)
	fmt.Fprintf(stdout, "load after: %s\n", loadAvg())
	return err
}

// benchRunning is a Running as the bench drives it.
type benchRunning struct{ r *runtime.Running }

func (b benchRunning) Engine() *engine.Engine { return b.r.Engine }
func (b benchRunning) Engines() []*engine.Engine {
	var e []*engine.Engine
	for _, sub := range b.r.SubTopologies() {
		e = append(e, sub.Engine)
	}
	return e
}
func (b benchRunning) Close() { b.r.Close() }
func (b benchRunning) RestoreDuration() (time.Duration, bool) {
	if b.r.Restored == nil {
		return 0, false
	}
	return b.r.Restored.Duration, true
}

// loadAvg is /proc/loadavg's first three fields ("" where there is none).
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return "load " + strings.Join(f[:3], " ")
}

// startCPUProfile writes a CPU profile to path (none when path is empty)
// until the returned function is called.
func startCPUProfile(path string) (stop func(), err error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("--cpuprofile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("--cpuprofile: %w", err)
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}
