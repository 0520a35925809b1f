package demo

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"cairn/checkpoint"
	"cairn/internal/app/cmdline"
	"cairn/internal/app/dashboard"
	"cairn/internal/app/job"
	"cairn/internal/app/runtime"
	"cairn/internal/app/storelink"
)

// maxDemoState bounds --state: a lost disk, a full checkpoint and the
// retained chain hold up to about three copies of it on a laptop's disk.
const maxDemoState = 4 << 30

// demoJobName is the demo job's name (its checkpoints are under it in the
// store).
const demoJobName = "wordcount"

// demoJobYAML is the demo's job: split and count over the input stream, a
// checkpoint every 2 s, every fullEvery-th one full (0: only when asked),
// so the dashboard shows the incremental sawtooth and both kinds of restore
// within two minutes. At scale a full checkpoint uploads the whole state
// through the link: only the presenter's button takes one.
//
// downloadRate (bytes/s, 0: unbounded) caps an online restore's background
// download: behind a link, an uncapped download queues the job's own reads
// of the state it does not hold yet behind it, and processing waits.
//
// Behind a link the background scrub (re-reading the shared objects at 2
// MiB/s) is off: on a link of a few MB/s it would take its share of every
// restore's download, and the restore would not be the one the model
// predicts from the link.
func demoJobYAML(slots, fullEvery int, downloadRate int64) string {
	restore, scrub := "", ""
	if downloadRate > 0 {
		restore = fmt.Sprintf("restore: {download_rate: %dB}\n", downloadRate)
		scrub = ", scrub_rate: \"off\""
	}
	return restore + fmt.Sprintf(`name: %s
input:  {stream: %s, subjects: [%q]}
stages:
  - {name: split, module: "builtin:split"}
  - {name: count, module: "builtin:count", keyed: true}
output: {stream: %s, subject: %s, delivery: exactly_once}
key_groups: %d
slots: %d
checkpoint: {interval: 2s, mode: incremental, retain: 3, full_every: %d%s}
`, demoJobName, demoInputStream, demoInputSubject, demoOutputStream, demoOutputSubject, demoKeyGroups, slots, fullEvery, scrub)
}

// splitDemoMemory divides the demo's budget: 3/8 to the supervisor (the
// embedded NATS server, the generator, the dashboard; a third of it is
// JetStream's memory), the rest to the job process (its memory:).
func splitDemoMemory(budget string) (supervisor, jobBytes int64) {
	if budget == "" {
		return 0, 0
	}
	n, _ := job.ParseBytes(budget) // validated with the flags
	supervisor = n * 3 / 8
	return supervisor, n - supervisor
}

// demoConfig is the demo's command line.
type demoConfig struct {
	duration  time.Duration
	rate      int
	data      string
	slots     int
	http      string
	httpSet   bool // --http given: no fallback to another port
	token     string
	natsPort  int
	vocab     int
	memory    string // the demo's memory budget, both processes ("": none)
	logLevel  string
	keysInput io.Reader // terminal keys (nil: none)
	// stateSize is the keyed state bulk-loaded before the first start (0:
	// none), link the simulated network link to the store (the job's and
	// the demo's own restores go through it).
	stateSize int64
	link      storelink.Link
}

// The workshop at scale (--scale): a state whose download from the store
// takes tens of seconds on the link, while an incremental checkpoint takes
// well under one.
const (
	scaleState = "512MiB"
	scaleLink  = "25MB/s,20ms"
)

// fullEvery is the job's full_every: every tenth checkpoint at the small
// scale; at scale only the presenter's full checkpoints (one uploads the
// whole state through the link).
func (c demoConfig) fullEvery() int {
	if c.scaled() {
		return 0
	}
	return 10
}

// scaled reports whether the demo runs at scale (a bulk state or a link).
func (c demoConfig) scaled() bool { return c.stateSize > 0 || !c.link.Off() }

// Command is `cairn demo`.
func Command(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := cmdline.NewFlagSet("demo", "cairn demo [flags]", stderr)
	var c demoConfig
	fs.DurationVar(&c.duration, "duration", 0, "stop after this long, check the outputs and print a summary (0: run until Ctrl-C or q)")
	fs.IntVar(&c.rate, "rate", 1000, "lines per second to generate (0: as fast as the job keeps up)")
	fs.StringVar(&c.data, "data", "cairn-demo", "data directory: the demo restores from it on restart (remove it to start over)")
	fs.IntVar(&c.slots, "slots", 0, "number of slots (0: the last run's, else 2)")
	fs.StringVar(&c.http, "http", "127.0.0.1:8080", "HTTP listen address of the dashboard (\"off\" disables; when the default is taken, a free port)")
	fs.StringVar(&c.token, "http-token", "", "token required by the dashboard's actions (required when --http is not loopback)")
	fs.IntVar(&c.natsPort, "nats-port", 0, "port of the embedded NATS server (0: the last run's, else 4222, else a free one)")
	fs.IntVar(&c.vocab, "vocabulary", 20000, "distinct words in the generated text (the number of keys)")
	fs.StringVar(&c.logLevel, "log-level", "warn", "debug, info, warn or error")
	fs.StringVar(&c.memory, "memory", "256MiB", "memory budget of the demo, both processes (the supervisor with NATS, the job); \"off\": none")
	scale := fs.Bool("scale", false, "the workshop at scale: --state "+scaleState+" --link "+scaleLink+" (either flag overrides its part)")
	stateFlag := fs.String("state", "0", "keyed state to bulk-load before the job's first start, like 512MiB (0: none): the job carries it, a restore from the store downloads it")
	members := fs.Int("members", 0, "run the job as a group of this many member processes (at least 2) on a 3-node NATS cluster embedded in the demo, R3 streams, a shared store; the dashboard kills a member to show the takeover (0: one job process)")
	linkFlag := fs.String("link", "off", "put the checkpoint store behind a simulated network link, BANDWIDTH/s,LATENCY like "+scaleLink+" (off: a local folder's speed)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) {
		set[f.Name] = true
		if f.Name == "http" {
			c.httpSet = true
		}
	})
	if *members != 0 {
		for _, f := range []string{"scale", "state", "link", "nats-port", "memory"} {
			if set[f] {
				return fmt.Errorf("--%s: not with --members (the group demo runs the word count on a fresh cluster without a bulk state or a link)", f)
			}
		}
		if !set["data"] {
			c.data = "cairn-demo-group"
		}
	}
	if *scale && !set["state"] {
		*stateFlag = scaleState
	}
	if *scale && !set["link"] {
		*linkFlag = scaleLink
	}
	var err error
	if c.stateSize, err = job.ParseBytes(*stateFlag); err != nil {
		return fmt.Errorf("--state %q: must be a size like 512MiB, or 0", *stateFlag)
	}
	if c.stateSize > maxDemoState {
		return fmt.Errorf("--state %s: at most %s (the demo keeps about three copies of it on disk)", *stateFlag, runtime.FormatBytes(maxDemoState))
	}
	if c.link, err = storelink.Parse(*linkFlag); err != nil {
		return fmt.Errorf("--link: %w", err)
	}
	if c.rate < 0 || c.vocab < 10 {
		return errors.New("--rate must be at least 0 and --vocabulary at least 10")
	}
	if c.memory == "off" {
		c.memory = ""
	} else if n, err := job.ParseBytes(c.memory); err != nil || n < 2*job.MinMemory {
		return fmt.Errorf("--memory %q: must be a size of at least %d MiB, or off", c.memory, 2*job.MinMemory>>20)
	}
	if cmdline.IsTerminal(os.Stdin) {
		c.keysInput = os.Stdin
		defer noEcho(os.Stdin)()
	}
	if *members != 0 {
		return runGroupDemo(ctx, c, *members, stdout, stderr)
	}
	return runDemo(ctx, c, stdout, stderr)
}

func runDemo(ctx context.Context, c demoConfig, stdout, stderr io.Writer) (err error) {
	binary, err := os.Executable()
	if err != nil {
		return fmt.Errorf("demo: the cairn executable (it runs the job as a process): %w", err)
	}
	dir, err := filepath.Abs(c.data)
	if err != nil {
		return err
	}
	if err := runtime.CheckDataDir(dir); err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(dir, groupMarker)); err == nil {
		return fmt.Errorf("%w: %s holds a group demo's data (cairn demo --members); choose another --data", ErrGroupDemo, dir)
	}
	mem := loadDemoMemory(dir)
	slots := c.slots
	if slots == 0 {
		slots = max(mem.Slots, 2)
	}
	storeURL, err := checkpoint.FileStoreURL(filepath.Join(dir, "store"), true)
	if err != nil {
		return err
	}
	d := newDemo(c, dir, storeURL, binary, slots, stdout, cmdline.NewLogger(stderr, c.logLevel))
	defer d.close()

	// The dashboard first: its URL is the first line, before NATS replays
	// its streams and the job restores.
	if c.http != "off" {
		ln, err := dashboard.Listen(c.http, c.token)
		var opErr *net.OpError
		if err != nil && !c.httpSet && errors.As(err, &opErr) {
			ln, err = dashboard.Listen("127.0.0.1:0", c.token)
		}
		if err != nil {
			return err
		}
		d.serve(ln)
		fmt.Fprintf(stdout, "cairn demo: dashboard http://%s/\n", ln.Addr())
	}
	fmt.Fprintf(stdout, "cairn demo: data in %s (remove it to start over)\n", dir)
	lsURL, _ := checkpoint.FileStoreURL(filepath.Join(dir, "store"), false)
	fmt.Fprintf(stdout, "cairn demo: the checkpoints with the dashboard's predictions: cairn checkpoints ls --store %q --job %s --data-dir %q\n", lsURL, demoJobName, dir)

	want := c.natsPort
	if want == 0 {
		want = mem.NATSPort
	}
	var fellBack bool
	supervisor, _ := splitDemoMemory(c.memory)
	if supervisor > 0 {
		debug.SetMemoryLimit(supervisor)
	}
	if d.ns, fellBack, err = startDemoNATS(dir, want, supervisor/3); err != nil {
		return err
	}
	mem.NATSPort, mem.Slots = d.ns.Port(), slots
	if err := saveDemoMemory(dir, mem); err != nil {
		return err
	}
	url := d.ns.URL()
	if fellBack {
		fmt.Fprintf(stdout, "cairn demo: port %d is taken; NATS on %d (remembered for the next run)\n", max(want, defaultNATSPort), mem.NATSPort)
	}
	fmt.Fprintf(stdout, "cairn demo: NATS %s — try: nats -s %s pub lines.x \"the quick brown fox\"   and   nats -s %s sub 'counts.>'\n", url, url, url)
	if err := d.connect(ctx); err != nil {
		return err
	}
	if c.keysInput != nil {
		fmt.Fprintln(stdout, "cairn demo: keys (then Enter): "+keysHelp)
	}
	return d.run(ctx)
}

// keysHelp lists the terminal's keys.
const keysHelp = "k kill -9 · d lose the disk · o lose the disk, online restore · p N preview a rescale · r N rescale to N slots · f full checkpoint · s NAME savepoint · q stop and check"

// run runs the demo until the duration, Ctrl-C or q, then checks the outputs.
func (d *demo) run(ctx context.Context) error {
	start := time.Now()
	bg, stopBG := context.WithCancel(context.WithoutCancel(ctx))
	defer stopBG()
	go d.ver.run(bg, d.js)
	go d.poll(bg)
	go d.housekeep(bg)
	superDone := make(chan error, 1)
	go func() { superDone <- d.supervise(bg) }()

	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	if d.cfg.duration > 0 {
		runCtx, stopRun = context.WithTimeout(ctx, d.cfg.duration)
		defer stopRun()
	}
	if d.cfg.keysInput != nil {
		go d.readKeys(runCtx, d.cfg.keysInput, stopRun)
	}
	genCtx, stopGen := context.WithCancel(runCtx)
	defer stopGen()
	genDone := make(chan error, 1)
	go func() { genDone <- d.gen.run(genCtx) }()

	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var superErr error
loop:
	for {
		select {
		case <-runCtx.Done():
			break loop
		case superErr = <-superDone:
			break loop
		case <-tick.C:
			d.status()
		}
	}
	stopGen()
	genErr := <-genDone
	if superErr != nil {
		return superErr
	}
	d.say("stopping: waiting for the job to process every line, then checking the outputs")
	if err := d.finish(bg); err != nil {
		return err
	}
	if genErr != nil {
		return genErr
	}
	return d.summary(time.Since(start))
}

// finish stops the job gracefully once it processed the whole input, and
// waits for the verifier to read both streams to their ends.
func (d *demo) finish(ctx context.Context) error {
	reply := make(chan string, 1)
	select {
	case d.cmds <- demoCmd{kind: cmdFinish, reply: reply}:
	case <-time.After(5 * time.Minute):
		return errors.New("demo: the supervisor did not stop")
	}
	if msg := <-reply; msg != "" {
		return errors.New(msg)
	}
	in, err := d.lastSeq(ctx, demoInputStream)
	if err != nil {
		return err
	}
	out, err := d.lastSeq(ctx, demoOutputStream)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(2 * time.Minute)
	for !d.ver.caughtUp(in, out) {
		if time.Now().After(deadline) {
			p := d.ver.pos()
			return fmt.Errorf("demo: the verifier read input to %d of %d and output to %d of %d in 2 minutes", p.Input, in, p.Output, out)
		}
		time.Sleep(20 * time.Millisecond)
	}
	_, err = d.ver.save()
	return err
}

func (d *demo) summary(elapsed time.Duration) error {
	r, err := d.ver.check()
	d.mu.Lock()
	restores, dead := len(d.mu.restores), d.mu.snap.DeadLetters
	d.mu.Unlock()
	fmt.Fprintf(d.out, "summary: this run %s, %d lines published (%.0f/s), %s; since %s was created: %d words, %d distinct, %d outputs\n",
		elapsed.Round(time.Millisecond), d.gen.published.Load(), float64(d.gen.published.Load())/elapsed.Seconds(), plural(restores, "restore"), d.dir, r.Words, r.Keys, r.Outputs)
	if err != nil {
		return fmt.Errorf("demo: outputs are not exactly once: %w", err)
	}
	fmt.Fprintf(d.out, "verified: %d outputs, one per word of the input; every key's last count exact; Cairn-Out gap-free in every key group; dead letters %d\n", r.Outputs, dead)
	return nil
}

func (d *demo) lastSeq(ctx context.Context, stream string) (uint64, error) {
	st, err := d.js.Stream(ctx, stream)
	if err != nil {
		return 0, err
	}
	return st.CachedInfo().State.LastSeq, nil
}

// connect connects to the embedded server, sets up the streams, the store,
// the verifier and the generator.
func (d *demo) connect(ctx context.Context) error {
	var err error
	if d.nc, err = nats.Connect(d.ns.URL(), nats.Name("cairn-demo"), nats.MaxReconnects(-1)); err != nil {
		return fmt.Errorf("demo: nats: %w", err)
	}
	if d.js, err = jetstream.New(d.nc); err != nil {
		return err
	}
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := ensureDemoStreams(sctx, d.js, 1); err != nil {
		return err
	}
	if d.store, err = checkpoint.OpenStore(sctx, d.storeURL); err != nil {
		return err
	}
	d.linked = d.cfg.link.Wrap(d.store)
	if err := d.seed(ctx); err != nil {
		return err
	}
	if d.ver, err = newVerifier(d.dir); err != nil {
		return err
	}
	if v := d.ver.violation(); v != "" {
		return fmt.Errorf("demo: an earlier run in %s found the outputs not exactly once: %s (remove the directory to start over)", d.dir, v)
	}
	gjs, err := jetstream.New(d.nc, jetstream.WithPublishAsyncMaxPending(4096),
		jetstream.WithPublishAsyncErrHandler(func(jetstream.JetStream, *nats.Msg, error) { d.gen.rejected.Add(1) }))
	if err != nil {
		return err
	}
	d.gen = &generator{js: gjs, rate: d.cfg.rate, corpus: NewCorpus(uint64(time.Now().UnixNano()), d.cfg.vocab), lag: d.lag}
	d.storeCheckpoints(sctx)
	return nil
}

// serve serves the dashboard and the actions on ln.
func (d *demo) serve(ln net.Listener) {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	mux.Handle("/", dashboard.Handler(d, dashboard.Options{Token: d.cfg.token, Actions: d.actions()}))
	d.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = d.srv.Serve(ln) }()
}

// readKeys turns terminal lines into actions.
func (d *demo) readKeys(ctx context.Context, in io.Reader, stop func()) {
	sc := bufio.NewScanner(in)
	for sc.Scan() && ctx.Err() == nil {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		arg := ""
		if len(f) > 1 {
			arg = f[1]
		}
		// The terminal does not echo keys (noEcho): say what was typed.
		d.say("> " + strings.Join(f, " "))
		var msg string // failures tell their own story: msg is for the others
		var err error
		switch f[0] {
		case "k":
			_, err = d.request(ctx, demoCmd{kind: cmdKill})
		case "d":
			_, err = d.request(ctx, demoCmd{kind: cmdLoseDisk})
		case "o":
			_, err = d.request(ctx, demoCmd{kind: cmdLoseDiskOnline})
		case "p":
			n, perr := strconv.Atoi(arg)
			if perr != nil {
				err = errors.New("p N: N is the slot count to preview, for example p 3")
				break
			}
			_, err = d.previewRescale(ctx, n)
		case "r":
			n, perr := strconv.Atoi(arg)
			if perr != nil {
				err = errors.New("r N: N is the slot count, for example r 3")
				break
			}
			_, err = d.request(ctx, demoCmd{kind: cmdRescale, slots: n})
		case "f":
			msg, err = d.jobAction(ctx, "checkpoint", "mode=full")
			msg = "full " + msg
		case "s":
			msg, err = d.savepoint(ctx, arg)
		case "q":
			stop()
			return
		default:
			err = fmt.Errorf("unknown key %q: %s", f[0], keysHelp)
		}
		if err != nil {
			msg = err.Error()
		}
		if msg != "" {
			d.say(msg)
		}
	}
}

// status prints the one-line status: redrawn in place on a terminal.
func (d *demo) status() {
	d.mu.Lock()
	s := d.mu.snap
	lag := d.lagLocked()
	phase := d.mu.story.Phase
	prog := d.mu.progress
	var ck string
	for i := len(d.mu.history) - 1; i >= 0; i-- {
		if c := d.mu.history[i]; !c.Failed {
			ck = fmt.Sprintf(" | checkpoint #%d (%s) in %s", c.ID, chainText(c.Mode, c.ChainLength), fmtDuration(c.SyncDuration+c.AsyncDuration))
			if p, ok := d.model.predictCheckpoint(c, d.mu.slots); ok {
				ck += " | from the store ≈ " + fmtDuration(p)
			}
			break
		}
	}
	d.sampleLocked(lag)
	pr := d.presenterLocked()
	// The budget line is said again when its numbers change by more than
	// a rounding.
	budget := ""
	if pr.StoreRestore > 0 || pr.Budget != d.mu.budgetSaid && strings.Contains(pr.Budget, "measured") {
		budget = pr.Budget
	}
	if budget != "" && budgetChanged(d.mu.budgetSaid, budget) {
		d.mu.budgetSaid = budget
	} else {
		budget = ""
	}
	in, out := s.RecordsIn-min(s.RecordsIn, d.mu.prevIn), s.RecordsOut-min(s.RecordsOut, d.mu.prevOut)
	d.mu.prevIn, d.mu.prevOut = s.RecordsIn, s.RecordsOut
	d.mu.Unlock()
	var size uint64
	for _, b := range s.StateBytes {
		size += b
	}
	if budget != "" {
		d.say(budget)
	}
	line := fmt.Sprintf("%-11s in %6d lines/s | out %7d words/s | lag %6d | state %s%s", phase, in, out, lag, runtime.FormatBytes(size), ck)
	if phase == phaseRestoring && prog != nil {
		line = phaseRestoring + " " + prog.line
	}
	d.print(line, false)
}

// say prints one line of the story above the status line.
func (d *demo) say(line string) { d.print(line, true) }

// print writes a line; on a terminal over the status line, which a line that
// does not stay is redrawn in place of.
func (d *demo) print(line string, stays bool) {
	d.outMu.Lock()
	defer d.outMu.Unlock()
	switch {
	case !d.tty:
		fmt.Fprintln(d.out, line)
	case stays:
		fmt.Fprintf(d.out, "\r\033[K%s\n", line)
	default:
		fmt.Fprintf(d.out, "\r\033[K%s", line)
	}
}

func (d *demo) close() {
	if d.srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = d.srv.Shutdown(ctx)
		cancel()
	}
	d.mu.Lock()
	child := d.mu.child
	d.mu.Unlock()
	if child != nil {
		child.Kill()
	}
	if d.nc != nil {
		d.nc.Close()
	}
	if d.ns != nil {
		d.ns.Shutdown()
	}
	if d.store != nil {
		_ = d.store.Close(context.Background())
	}
	if d.jobLog != nil {
		_ = d.jobLog.Close()
	}
	if d.tty {
		fmt.Fprintln(d.out)
	}
}
