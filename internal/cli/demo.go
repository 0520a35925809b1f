package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"cairn/internal/dashboard"
	"cairn/internal/job"
)

// demoJob is the embedded wordcount job of `cairn demo`.
const demoJob = `
name: wordcount
nats: embedded
input:  {stream: LINES, subjects: ["lines.>"]}
stages:
  - {name: split, module: "builtin:split"}
  - {name: count, module: "builtin:count", keyed: true}
output: {stream: COUNTS, subject: counts, delivery: exactly_once}
key_groups: 128
slots: 2
checkpoint: {interval: 2s, mode: incremental, retain: 3}
`

func cmdDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("demo", "cairn demo [flags]", stderr)
	duration := fs.Duration("duration", 0, "stop after this long and print a summary (0: run until Ctrl-C)")
	rate := fs.Int("rate", 0, "lines per second to generate (0: as fast as the pipeline takes)")
	data := fs.String("data", "", "data directory (default: a temporary directory, removed at exit)")
	slots := fs.Int("slots", 0, "number of slots")
	httpAddr := fs.String("http", "127.0.0.1:0", "HTTP listen address for stats (\"off\" disables)")
	logLevel := fs.String("log-level", "warn", "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return err
	}
	j, err := job.Parse([]byte(demoJob))
	if err != nil {
		return err
	}
	if *data == "" {
		d, err := os.MkdirTemp("", "cairn-demo-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		*data = d
	}
	if err := (Overrides{Data: *data, Slots: *slots, HTTP: *httpAddr}).Apply(j); err != nil {
		return err
	}
	log := newLogger(stderr, *logLevel)
	var ln net.Listener
	if j.HTTP != "off" {
		if ln, err = dashboard.Listen(j.HTTP, ""); err != nil {
			return err
		}
	}
	r, err := Start(ctx, j, RunOptions{}, log)
	if err != nil {
		if ln != nil {
			_ = ln.Close()
		}
		return err
	}
	defer r.Close()
	if ln != nil {
		stop := serveHTTP(ln, "", r)
		defer stop()
		fmt.Fprintf(stdout, "cairn demo: stats on http://%s/api/stats\n", ln.Addr())
	}

	runCtx, stopRun := context.WithCancel(context.WithoutCancel(ctx))
	defer stopRun()
	engDone := make(chan error, 1)
	go func() { engDone <- r.Engine.Run(runCtx) }()

	js, err := jetstream.New(r.NC)
	if err != nil {
		return err
	}
	genCtx, stopGen := context.WithCancel(ctx)
	defer stopGen()
	if *duration > 0 {
		genCtx, stopGen = context.WithTimeout(ctx, *duration)
		defer stopGen()
	}
	g := &generator{js: js, subject: "lines.demo", rate: *rate, corpus: NewCorpus(42, 5000), counts: map[string]uint64{}}
	start := time.Now()
	genDone := make(chan error, 1)
	go func() { genDone <- g.run(genCtx, r) }()

	tty := isTerminal(stdout)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var prevIn, prevOut uint64
	var genErr error
loop:
	for {
		select {
		case genErr = <-genDone:
			break loop
		case err := <-engDone:
			return fmt.Errorf("job stopped: %w", err)
		case <-tick.C:
			st := r.Engine.Stats()
			var size uint64
			for _, s := range st.StateBytes {
				size += s
			}
			line := fmt.Sprintf("in %7d lines/s | out %8d words/s | lag %6d | state %s | dead letters %d",
				st.RecordsIn-prevIn, st.RecordsOut-prevOut, g.published.Load()-st.ProcessedSeq, fmtBytes(size), st.DeadLetters)
			prevIn, prevOut = st.RecordsIn, st.RecordsOut
			if tty {
				fmt.Fprintf(stdout, "\r%s   ", line)
			} else {
				fmt.Fprintln(stdout, line)
			}
		}
	}
	if tty {
		fmt.Fprintln(stdout)
	}
	if genErr != nil && !errors.Is(genErr, context.Canceled) && !errors.Is(genErr, context.DeadlineExceeded) {
		return fmt.Errorf("generator: %w", genErr)
	}
	// Drain: wait until everything published is processed.
	lines := g.published.Load()
	drainBy := time.Now().Add(2 * time.Minute)
	for r.Engine.Stats().ProcessedSeq < lines && time.Now().Before(drainBy) && ctx.Err() == nil {
		time.Sleep(20 * time.Millisecond)
	}
	elapsed := time.Since(start)
	stopRun()
	if err := <-engDone; err != nil {
		return err
	}
	st := r.Engine.Stats()
	var words uint64
	for _, n := range g.counts {
		words += n
	}
	fmt.Fprintf(stdout, "summary: lines %d, words %d, distinct words %d, elapsed %s, %.0f lines/s, %.0f words/s\n",
		lines, words, len(g.counts), elapsed.Round(time.Millisecond), float64(st.ProcessedSeq)/elapsed.Seconds(), float64(st.RecordsOut)/elapsed.Seconds())
	if st.RecordsOut != words {
		return fmt.Errorf("outputs %d differ from the %d words generated", st.RecordsOut, words)
	}
	fmt.Fprintf(stdout, "verified: %d outputs, one per generated word; dead letters %d\n", st.RecordsOut, st.DeadLetters)
	return nil
}

// generator publishes the corpus and keeps the model of the expected counts.
type generator struct {
	js        jetstream.JetStream
	subject   string
	rate      int
	corpus    *Corpus
	counts    map[string]uint64
	published atomicU64
}

func (g *generator) run(ctx context.Context, r *Running) error {
	const maxLag = 50000
	var interval time.Duration
	if g.rate > 0 {
		interval = time.Second / time.Duration(g.rate)
	}
	next := time.Now()
	for ctx.Err() == nil {
		if g.rate > 0 {
			if d := time.Until(next); d > 0 {
				time.Sleep(d)
			}
			next = next.Add(interval)
		} else if g.published.Load() > r.Engine.ConsumedSeq()+maxLag {
			time.Sleep(time.Millisecond)
			continue
		}
		line, words := g.corpus.Line()
		if _, err := g.js.PublishMsgAsync(&nats.Msg{Subject: g.subject, Data: []byte(line)}, jetstream.WithStallWait(30*time.Second)); err != nil {
			return err
		}
		for _, w := range words {
			g.counts[w]++
		}
		g.published.Add(1)
	}
	select {
	case <-g.js.PublishAsyncComplete():
	case <-time.After(30 * time.Second):
		return errors.New("publishes not acknowledged after 30s")
	}
	return ctx.Err()
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

func fmtBytes(n uint64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

type atomicU64 = atomic.Uint64
