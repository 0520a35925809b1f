package demo

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"cairn/checkpoint"
	"cairn/internal/app/cmdline"
	"cairn/internal/app/dashboard"
	"cairn/internal/app/group"
	"cairn/internal/app/jobproc"
	"cairn/internal/app/runtime"
	"cairn/internal/base/datadir"
	"cairn/internal/base/natsembed"
)

// The group demo (`cairn demo --members N`) runs the demo's word count as
// a group of N `cairn run` processes on a three-node NATS cluster embedded
// in the demo's process: R3 input, output and repartition streams, the
// group's KV bucket R3, and a file store every member shares. The job is
// the word count in graph form (groupJobYAML), cut into three
// sub-topologies, because a group divides a job by whole sub-topologies.

// ErrGroupDemo is a group demo that cannot start or act as asked.
var ErrGroupDemo = errors.New("demo: group")

const (
	// groupNodes is the embedded cluster's size: the smallest that keeps
	// R3 streams and the group's bucket through the loss of a node.
	groupNodes = 3
	// groupLeaseTTL is the members' lease: short, so that a kill's
	// takeover shows within seconds on the dashboard, but not so short
	// that a laptop busy with three members and a cluster misses a
	// renewal (at 2 s, on a loaded 2-core machine, members lost their
	// leases without a kill).
	groupLeaseTTL = 5 * time.Second
	// groupRestartAfter is how long a killed member stays down before the
	// demo starts it again (it then gets sub-topologies back by a
	// handoff): long enough to watch the takeover settle.
	groupRestartAfter = 15 * time.Second
	// groupMarker in a data directory says it is a group demo's.
	groupMarker = "group-demo.json"
	// groupSubTopologies is the graph job's sub-topology count.
	groupSubTopologies = 3
	// groupStatusEvery is how often the terminal gets a status line.
	groupStatusEvery = 5 * time.Second
)

// groupJobYAML is the demo's word count as a job graph of three
// sub-topologies: split and route (keyed by word), pass (keyed by word),
// count. route and pass are builtin:union, which emits every record
// unchanged: marked keyed, each ends a sub-topology, so the graph has
// three parts to spread over the members while its outputs stay the word
// count's (key = word, value = its running count, on the word's key group),
// which the verifier checks as it does the one-chain job's.
func groupJobYAML(urls, store string, slots int) string {
	return fmt.Sprintf(`name: %s
nats: %q
input:  {stream: %s, subjects: [%q]}
stages:
  - {name: split, module: "builtin:split"}
  - {name: route, module: "builtin:union", keyed: true}
  - {name: pass,  module: "builtin:union", keyed: true}
  - {name: count, module: "builtin:count", keyed: true}
output: {stream: %s, subject: %s, delivery: exactly_once}
key_groups: %d
slots: %d
checkpoint: {store: %q, interval: 2s, mode: incremental, retain: 3}
group: {members: auto, lease_ttl: %s, replicas: %d}
`, demoJobName, urls, demoInputStream, demoInputSubject, demoOutputStream, demoOutputSubject, demoKeyGroups, slots, store, groupLeaseTTL, groupNodes)
}

// groupMember is one member process of the group demo.
type groupMember struct {
	name string
	dir  string
	proc *jobproc.Process // nil while down
	// killedAt is when the demo killed it (zero: running or never killed).
	killedAt time.Time
}

// groupDemo is a running group demo.
type groupDemo struct {
	cfg      demoConfig
	n        int
	dir      string
	binary   string
	storeURL string
	jobFile  string
	out      io.Writer
	outMu    sync.Mutex
	log      *slog.Logger
	jobLog   *os.File

	cl  *natsembed.Cluster
	nc  *nats.Conn
	js  jetstream.JetStream
	gen *generator
	ver *verifier
	srv *http.Server

	// bg is the members' and the watchers' context: it ends when the demo
	// returns.
	bg context.Context

	mu struct {
		sync.Mutex
		members []*groupMember
		story   []string
		phase   string
		// st is the group as /api/group last answered.
		st group.Status
	}
}

// runGroupDemo runs the group demo until the duration, Ctrl-C or q, then
// checks the outputs as the one-process demo does.
func runGroupDemo(ctx context.Context, c demoConfig, members int, stdout, stderr io.Writer) error {
	if members < 2 {
		return fmt.Errorf("%w: --members %d: at least 2 (0: the one-process demo)", ErrGroupDemo, members)
	}
	binary, err := os.Executable()
	if err != nil {
		return fmt.Errorf("demo: the cairn executable (it runs the members as processes): %w", err)
	}
	dir, err := filepath.Abs(c.data)
	if err != nil {
		return err
	}
	if err := runtime.CheckDataDir(dir); err != nil {
		return err
	}
	if _, err := os.Stat(demoMemoryPath(dir)); err == nil {
		return fmt.Errorf("%w: %s holds a one-process demo's data; choose another --data for the group demo (its default is cairn-demo-group)", ErrGroupDemo, dir)
	}
	if err := datadir.WriteFileAtomic(filepath.Join(dir, groupMarker), fmt.Appendf(nil, "{\"members\": %d}\n", members)); err != nil {
		return err
	}
	storeURL, err := checkpoint.FileStoreURL(filepath.Join(dir, "store"), true)
	if err != nil {
		return err
	}
	slots := c.slots
	if slots == 0 {
		slots = 2
	}
	g := &groupDemo{cfg: c, n: members, dir: dir, binary: binary, storeURL: storeURL, out: stdout, log: cmdline.NewLogger(stderr, c.logLevel)}
	g.mu.phase = phaseStarting
	bg, stopBG := context.WithCancel(context.WithoutCancel(ctx))
	defer stopBG()
	g.bg = bg
	defer g.close()
	// The dashboard's address first; it is served once the cluster and the
	// streams are up (a browser's request waits in the listener's queue
	// until then).
	var ln net.Listener
	if c.http != "off" {
		ln, err = dashboard.Listen(c.http, c.token)
		var opErr *net.OpError
		if err != nil && !c.httpSet && errors.As(err, &opErr) {
			ln, err = dashboard.Listen("127.0.0.1:0", c.token)
		}
		if err != nil {
			return err
		}
		g.say(fmt.Sprintf("cairn demo: dashboard http://%s/ (the group card shows the members and every takeover)", ln.Addr()))
	}
	g.say(fmt.Sprintf("cairn demo: data in %s (remove it to start over)", dir))
	g.say(fmt.Sprintf("cairn demo: what runs: %d cairn member processes (cairn run --member m1 … m%d, each with its own data directory) "+
		"sharing the word count as a group; a %d-node NATS cluster in this process (routes on 127.0.0.1); "+
		"R3 input, output and repartition streams and an R3 group bucket; the checkpoint store %s shared by all", members, members, groupNodes, filepath.Join(dir, "store")))
	if g.jobLog, err = os.OpenFile(filepath.Join(dir, "members.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); err != nil {
		return err
	}
	if g.cl, err = natsembed.StartCluster(natsembed.ClusterOptions{Name: "cairn-demo", Dir: filepath.Join(dir, "nats"), Nodes: groupNodes, Hint: natsHint}); err != nil {
		return err
	}
	g.say("cairn demo: NATS cluster " + g.cl.URLs())
	g.jobFile = filepath.Join(dir, "wordcount-group.yaml")
	if err := os.WriteFile(g.jobFile, []byte(groupJobYAML(g.cl.URLs(), storeURL, slots)), 0o644); err != nil {
		return err
	}
	g.say(fmt.Sprintf("cairn demo: the job (%d sub-topologies: split+route | pass | count): %s; members log to %s; try: cairn group status --job %s",
		groupSubTopologies, g.jobFile, g.jobLog.Name(), g.jobFile))
	if err := g.connect(ctx); err != nil {
		if ln != nil {
			ln.Close()
		}
		return err
	}
	if ln != nil {
		g.serve(ln)
	}
	if c.keysInput != nil {
		g.say("cairn demo: keys (then Enter): " + groupKeysHelp)
	}
	return g.run(ctx)
}

// groupKeysHelp lists the group demo's terminal keys.
var groupKeysHelp = fmt.Sprintf("m [NAME] kill -9 a member (default: one that runs the most sub-topologies; it restarts after %v) · q stop and check", groupRestartAfter)

// connect connects to the cluster, creates the R3 streams, the verifier
// and the generator.
func (g *groupDemo) connect(ctx context.Context) error {
	var err error
	if g.nc, err = nats.Connect(g.cl.URLs(), nats.Name("cairn-demo"), nats.MaxReconnects(-1)); err != nil {
		return fmt.Errorf("demo: nats: %w", err)
	}
	if g.js, err = jetstream.New(g.nc); err != nil {
		return err
	}
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := ensureDemoStreams(sctx, g.js, groupNodes); err != nil {
		return err
	}
	if g.ver, err = newVerifier(g.dir); err != nil {
		return err
	}
	if v := g.ver.violation(); v != "" {
		return fmt.Errorf("demo: an earlier run in %s found the outputs not exactly once: %s (remove the directory to start over)", g.dir, v)
	}
	gjs, err := jetstream.New(g.nc, jetstream.WithPublishAsyncMaxPending(4096),
		jetstream.WithPublishAsyncErrHandler(func(jetstream.JetStream, *nats.Msg, error) { g.gen.rejected.Add(1) }))
	if err != nil {
		return err
	}
	g.gen = &generator{js: gjs, rate: g.cfg.rate, corpus: NewCorpus(uint64(time.Now().UnixNano()), g.cfg.vocab), lag: g.lag}
	return nil
}

// lag is the words the verifier counted in the input that have no output
// yet.
func (g *groupDemo) lag() uint64 {
	g.ver.mu.Lock()
	defer g.ver.mu.Unlock()
	st := &g.ver.mu.st
	return st.Words - min(st.Words, st.Outputs)
}

// run starts the members, the verifier and the generator, and runs until
// the duration, Ctrl-C or q.
func (g *groupDemo) run(ctx context.Context) error {
	start := time.Now()
	bg := g.bg
	go g.ver.run(bg, g.js)
	for i := range g.n {
		m := &groupMember{name: fmt.Sprintf("m%d", i+1), dir: filepath.Join(g.dir, "members", fmt.Sprintf("m%d", i+1))}
		g.mu.Lock()
		g.mu.members = append(g.mu.members, m)
		g.mu.Unlock()
	}
	for _, m := range g.members() {
		if err := g.startMember(bg, m); err != nil {
			return err
		}
	}
	g.say(fmt.Sprintf("cairn demo: %d members running; the group divides %d sub-topologies among them", g.n, groupSubTopologies))
	g.setPhase(phaseRunning)

	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	if g.cfg.duration > 0 {
		runCtx, stopRun = context.WithTimeout(ctx, g.cfg.duration)
		defer stopRun()
	}
	if g.cfg.keysInput != nil {
		go g.readKeys(runCtx, g.cfg.keysInput, stopRun)
	}
	genCtx, stopGen := context.WithCancel(runCtx)
	defer stopGen()
	genDone := make(chan error, 1)
	go func() { genDone <- g.gen.run(genCtx) }()
	tick := time.NewTicker(groupStatusEvery)
	defer tick.Stop()
	var prevOut uint64
loop:
	for {
		select {
		case <-runCtx.Done():
			break loop
		case <-tick.C:
			prevOut = g.status(prevOut)
		}
	}
	stopGen()
	genErr := <-genDone
	g.setPhase(phaseStopping)
	g.say("stopping: waiting for the group to process every line, then checking the outputs")
	if err := g.finish(bg); err != nil {
		return err
	}
	if genErr != nil {
		return genErr
	}
	return g.summary(time.Since(start))
}

func (g *groupDemo) members() []*groupMember {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.mu.members)
}

// startMember starts m's process and waits until it serves HTTP.
func (g *groupDemo) startMember(ctx context.Context, m *groupMember) error {
	p, err := jobproc.Start(ctx, jobproc.Options{
		Binary: g.binary, Log: prefixWriter{w: g.jobLog, prefix: m.name + " "}, WithParent: true,
		Args: []string{"--job", g.jobFile, "--data", m.dir, "--member", m.name, "--http", "127.0.0.1:0",
			"--log-level", "info", "--exit-with-parent"},
	})
	if err != nil {
		return fmt.Errorf("demo: member %s: %w", m.name, err)
	}
	g.mu.Lock()
	m.proc, m.killedAt = p, time.Time{}
	g.mu.Unlock()
	_ = os.WriteFile(filepath.Join(g.dir, m.name+".pid"), fmt.Appendf(nil, "%d\n", p.Pid()), 0o644)
	return nil
}

// prefixWriter writes each Write (a log line) to w after prefix.
type prefixWriter struct {
	w      io.Writer
	prefix string
}

func (p prefixWriter) Write(b []byte) (int, error) {
	// One write per line: the members' lines go to one file at once.
	if _, err := p.w.Write(append([]byte(p.prefix), b...)); err != nil {
		return 0, err
	}
	return len(b), nil
}

// KillMember kills member name (kill -9), or, with name "", the running
// member that runs the most sub-topologies; it returns what it says. The
// dashboard's button and the terminal's key both come here. A watcher
// then tells the takeover, and the member is started again after
// groupRestartAfter.
func (g *groupDemo) KillMember(ctx context.Context, name string) (string, error) {
	st, err := group.ReadStatus(ctx, g.js, demoJobName)
	if err != nil {
		return "", err
	}
	units := st.Assignment.Units()
	g.mu.Lock()
	var victim *groupMember
	for _, m := range g.mu.members {
		if m.proc == nil {
			continue
		}
		if name != "" && m.name == name || name == "" && (victim == nil || len(units[m.name]) > len(units[victim.name])) {
			victim = m
		}
	}
	if victim == nil {
		g.mu.Unlock()
		if name != "" {
			return "", fmt.Errorf("%w: no running member %q (members m1 … m%d; a killed one restarts after %v)", ErrGroupDemo, name, g.n, groupRestartAfter)
		}
		return "", fmt.Errorf("%w: no member is running", ErrGroupDemo)
	}
	p := victim.proc
	victim.proc, victim.killedAt = nil, time.Now()
	killedAt := victim.killedAt
	g.mu.Unlock()
	p.Kill()
	ran := subNames(units[victim.name])
	msg := fmt.Sprintf("killed %s (kill -9, pid %d), which ran %s; its lease expires within %v, then the others restore what it ran from the store; it restarts in %v",
		victim.name, p.Pid(), orNothing(ran), groupLeaseTTL, groupRestartAfter)
	g.storyLine(msg)
	go g.watchTakeover(victim.name, killedAt, units[victim.name])
	go func() {
		select {
		case <-g.bg.Done():
			return
		case <-time.After(groupRestartAfter):
		}
		g.storyLine(fmt.Sprintf("restarting %s: it joins again and the group hands it sub-topologies back", victim.name))
		if err := g.startMember(g.bg, victim); err != nil && g.bg.Err() == nil {
			g.storyLine(fmt.Sprintf("%s did not start again: %v", victim.name, err))
		}
	}()
	return msg, nil
}

// watchTakeover follows the group after member killed was killed at t
// until every sub-topology it ran runs on another member, and tells who
// took what and how long until it ran again.
func (g *groupDemo) watchTakeover(killed string, t time.Time, ran []int) {
	if len(ran) == 0 {
		return
	}
	deadline := time.Now().Add(2 * time.Minute)
	var runningAt time.Time // when every part ran again (zero: not yet)
	for g.bg.Err() == nil && time.Now().Before(deadline) {
		time.Sleep(time.Second)
		ctx, cancel := context.WithTimeout(g.bg, 5*time.Second)
		st, err := g.groupStatus(ctx)
		cancel()
		if err != nil {
			continue
		}
		owners := map[int]string{}
		for _, o := range st.Assignment.Ranges {
			if o.Sub == group.Units && o.Next == "" {
				for k := o.Lo; k < o.Hi; k++ {
					owners[k] = o.Owner
				}
			}
		}
		// Each taken sub-topology must run on its new owner: an event
		// after the kill that gained it and ran again.
		var parts []string
		done, caught := true, true
		for _, k := range ran {
			o := owners[k]
			if o == "" || o == killed {
				done = false
				break
			}
			ev, ok := gainedAfter(st.Events, o, subName(k), t)
			if !ok {
				done = false
				break
			}
			part := fmt.Sprintf("%s took %s, running again %s after its change", o, subName(k), fmtDuration(ev.RunningAfter))
			for _, r := range ev.Restores {
				if r.SubTopology == subName(k) {
					pred := "no prediction yet"
					if r.Predicted > 0 {
						pred = "predicted " + fmtDuration(r.Predicted)
					}
					part += fmt.Sprintf(" (restored checkpoint #%d in %s, %s)", r.Checkpoint, fmtDuration(r.Took), pred)
				}
			}
			if !ev.At.IsZero() {
				part += fmt.Sprintf(", %s after the kill", fmtDuration(ev.At.Add(ev.RunningAfter).Sub(t)))
			}
			if ev.CaughtUpAfter > 0 {
				part += fmt.Sprintf("; caught up %s after its change (%d records had waited)", fmtDuration(ev.CaughtUpAfter), ev.Backlog)
			} else {
				caught = false
			}
			parts = append(parts, part)
		}
		// Told once every part caught up too, or 30 s after they ran
		// again without (a catch-up that was not measured).
		if done && !caught && (runningAt.IsZero() || time.Since(runningAt) < 30*time.Second) {
			if runningAt.IsZero() {
				runningAt = time.Now()
			}
			continue
		}
		if done {
			g.storyLine("takeover: " + strings.Join(parts, "; "))
			return
		}
	}
	if g.bg.Err() == nil {
		g.storyLine(fmt.Sprintf("no takeover of what %s ran within 2 minutes", killed))
	}
}

// gainedAfter is member's first event after t that gained sub.
func gainedAfter(evs []group.Event, member, sub string, t time.Time) (group.Event, bool) {
	for _, e := range evs {
		if e.Member == member && e.At.After(t) && slices.Contains(e.Gained, sub) && e.Err == "" {
			return e, true
		}
	}
	return group.Event{}, false
}

// subName is sub-topology k's name, as the members' events say it.
func subName(k int) string { return runtime.SubTopologyName(demoJobName, k) }

func subNames(ks []int) []string {
	var out []string
	for _, k := range ks {
		out = append(out, subName(k))
	}
	return out
}

func orNothing(s []string) string {
	if len(s) == 0 {
		return "nothing (it stood by)"
	}
	return strings.Join(s, ", ")
}

// groupStatus is the group as its bucket holds it, with every running
// member's events (each member's /api/group), oldest first: the demo's
// /api/group, which the dashboard's group card shows.
func (g *groupDemo) groupStatus(ctx context.Context) (group.Status, error) {
	st, err := group.ReadStatus(ctx, g.js, demoJobName)
	if err != nil {
		return st, err
	}
	st.Member = "the demo (every member's events)"
	var procs []*jobproc.Process
	g.mu.Lock()
	for _, m := range g.mu.members {
		if m.proc != nil {
			procs = append(procs, m.proc)
		}
	}
	g.mu.Unlock()
	// Every member at once: each answer waits for the members' reports
	// (up to 2 s when one does not answer).
	answers := make([]*group.Status, len(procs))
	var wg sync.WaitGroup
	for i, p := range procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b, err := p.Get(ctx, "/api/group")
			if err != nil {
				return // starting, or killed just now
			}
			var ms group.Status
			if json.Unmarshal(b, &ms) == nil {
				answers[i] = &ms
			}
		}()
	}
	wg.Wait()
	reported := false
	for _, ms := range answers {
		if ms == nil {
			continue
		}
		st.Events = append(st.Events, ms.Events...)
		// A member's answer has each member's report of what it runs
		// (lag, newest checkpoint); the bucket alone has not.
		if !reported && slices.ContainsFunc(ms.Members, func(m group.MemberStatus) bool { return m.Reported }) {
			st.Members, reported = ms.Members, true
		}
	}
	slices.SortStableFunc(st.Events, func(a, b group.Event) int { return a.At.Compare(b.At) })
	g.mu.Lock()
	g.mu.st = st
	g.mu.Unlock()
	return st, nil
}

// status prints the one-line status and returns the outputs so far.
func (g *groupDemo) status(prevOut uint64) uint64 {
	ctx, cancel := context.WithTimeout(g.bg, 2*time.Second)
	st, err := group.ReadStatus(ctx, g.js, demoJobName)
	cancel()
	units := st.Assignment.Units()
	var who []string
	for _, m := range g.members() {
		g.mu.Lock()
		down := m.proc == nil
		g.mu.Unlock()
		switch {
		case down:
			who = append(who, m.name+" killed")
		case err != nil:
			who = append(who, m.name+" ?")
		default:
			var ks []string
			for _, k := range units[m.name] {
				ks = append(ks, fmt.Sprintf("s%d", k))
			}
			if len(ks) == 0 {
				ks = []string{"standby"}
			}
			who = append(who, m.name+" "+strings.Join(ks, ","))
		}
	}
	g.ver.mu.Lock()
	out := g.ver.mu.st.Outputs
	g.ver.mu.Unlock()
	g.say(fmt.Sprintf("%-8s %s | out %6d words/%s | behind %6d words", g.phase(), strings.Join(who, " · "), out-min(out, prevOut), groupStatusEvery, g.lag()))
	return out
}

// readKeys turns terminal lines into actions.
func (g *groupDemo) readKeys(ctx context.Context, in io.Reader, stop func()) {
	sc := bufio.NewScanner(in)
	for sc.Scan() && ctx.Err() == nil {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		g.say("> " + strings.Join(f, " "))
		switch f[0] {
		case "m":
			name := ""
			if len(f) > 1 {
				name = f[1]
			}
			if _, err := g.KillMember(ctx, name); err != nil {
				g.say(err.Error())
			}
		case "q":
			stop()
			return
		default:
			g.say(fmt.Sprintf("unknown key %q: %s", f[0], groupKeysHelp))
		}
	}
}

// finish waits until every word of the input has its output, then stops
// the members.
func (g *groupDemo) finish(ctx context.Context) error {
	in, err := g.lastSeq(ctx, demoInputStream)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(3 * time.Minute)
	for {
		p := g.ver.pos()
		g.ver.mu.Lock()
		words, outs, violation := g.ver.mu.st.Words, g.ver.mu.st.Outputs, g.ver.mu.st.Violation
		g.ver.mu.Unlock()
		if violation != "" || p.Input >= in && outs >= words {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("demo: in 3 minutes the group published %d outputs of %d words (input read to %d of %d)", outs, words, p.Input, in)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Outputs past the words would be duplicates: give any late one the
	// time to arrive before the check (a checkpoint interval).
	time.Sleep(2 * time.Second)
	var wg sync.WaitGroup
	for _, m := range g.members() {
		g.mu.Lock()
		p := m.proc
		m.proc = nil
		g.mu.Unlock()
		if p == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			_ = p.Stop(sctx)
		}()
	}
	wg.Wait()
	out, err := g.lastSeq(ctx, demoOutputStream)
	if err != nil {
		return err
	}
	for !g.ver.caughtUp(in, out) {
		if time.Now().After(deadline) {
			return fmt.Errorf("demo: the verifier read output to %d of %d", g.ver.pos().Output, out)
		}
		time.Sleep(20 * time.Millisecond)
	}
	_, err = g.ver.save()
	return err
}

func (g *groupDemo) lastSeq(ctx context.Context, stream string) (uint64, error) {
	st, err := g.js.Stream(ctx, stream)
	if err != nil {
		return 0, err
	}
	info, err := st.Info(ctx)
	if err != nil {
		return 0, err
	}
	return info.State.LastSeq, nil
}

func (g *groupDemo) summary(elapsed time.Duration) error {
	r, err := g.ver.check()
	fmt.Fprintf(g.out, "summary: this run %s, %d lines published (%.0f/s) into a group of %d members; since %s was created: %d words, %d distinct, %d outputs\n",
		elapsed.Round(time.Millisecond), g.gen.published.Load(), float64(g.gen.published.Load())/elapsed.Seconds(), g.n, g.dir, r.Words, r.Keys, r.Outputs)
	if err != nil {
		return fmt.Errorf("demo: outputs are not exactly once: %w", err)
	}
	fmt.Fprintf(g.out, "verified: %d outputs, one per word of the input; every key's last count exact; Cairn-Out gap-free in every key group\n", r.Outputs)
	return nil
}

// serve serves the dashboard, /api/group and the kill action on ln.
func (g *groupDemo) serve(ln net.Listener) {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	mux.HandleFunc("GET /api/group", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
		defer cancel()
		st, err := g.groupStatus(ctx)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		_ = json.NewEncoder(w).Encode(st)
	})
	mux.Handle("/", dashboard.Handler(g, dashboard.Options{Token: g.cfg.token, Actions: map[string]func(*http.Request) (int, string){
		"kill-member": func(r *http.Request) (int, string) {
			msg, err := g.KillMember(r.Context(), r.URL.Query().Get("member"))
			if err != nil {
				return http.StatusConflict, err.Error()
			}
			return http.StatusOK, msg
		},
	}}))
	g.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = g.srv.Serve(ln) }()
}

// Snapshot is the dashboard's view of the group demo: the outputs the
// verifier checked, the story of kills and takeovers. The members'
// own dashboards have each sub-topology's figures.
func (g *groupDemo) Snapshot() dashboard.Snapshot {
	g.mu.Lock()
	story := &dashboard.Story{Phase: g.mu.phase, Progress: -1, Lines: slices.Clone(g.mu.story)}
	g.mu.Unlock()
	s := dashboard.Snapshot{Job: fmt.Sprintf("%s (a group of %d members)", demoJobName, g.n), KeyGroups: demoKeyGroups,
		Delivery: "exactly_once", CheckpointInterval: 2 * time.Second, Story: story}
	if g.gen != nil {
		s.RecordsIn = g.gen.published.Load()
	}
	if g.ver != nil {
		g.ver.mu.Lock()
		s.RecordsOut = g.ver.mu.st.Outputs
		g.ver.mu.Unlock()
	}
	return s
}

func (g *groupDemo) setPhase(p string) {
	g.mu.Lock()
	g.mu.phase = p
	g.mu.Unlock()
}

func (g *groupDemo) phase() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.mu.phase
}

// storyLine says line and keeps it for the dashboard (the last 20).
func (g *groupDemo) storyLine(line string) {
	line = time.Now().Format("15:04:05") + " " + line
	g.mu.Lock()
	g.mu.story = append(g.mu.story, line)
	if len(g.mu.story) > 20 {
		g.mu.story = g.mu.story[len(g.mu.story)-20:]
	}
	g.mu.Unlock()
	g.say(line)
}

func (g *groupDemo) say(line string) {
	g.outMu.Lock()
	defer g.outMu.Unlock()
	fmt.Fprintln(g.out, line)
}

func (g *groupDemo) close() {
	if g.srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = g.srv.Shutdown(ctx)
		cancel()
	}
	for _, m := range g.members() {
		g.mu.Lock()
		p := m.proc
		m.proc = nil
		g.mu.Unlock()
		if p != nil {
			p.Kill()
		}
	}
	if g.nc != nil {
		g.nc.Close()
	}
	if g.cl != nil {
		g.cl.Shutdown()
	}
	if g.jobLog != nil {
		_ = g.jobLog.Close()
	}
}
