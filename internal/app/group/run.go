package group

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"cairn/engine"
	"cairn/internal/app/job"
	"cairn/internal/app/runtime"
)

// A member runs whole sub-topologies: a sub-topology's checkpoint records
// one input position for all its key groups, so it moves between members
// as one unit (its checkpoint chain is restorable on its own). The group's
// assignment therefore divides one range, Units: its "key group" k is
// sub-topology k, so that the group's balance (even shares, as few moves
// as possible) applies across the job's sub-topologies. Dividing a
// sub-topology's key groups among members needs a position per key group
// in its checkpoints (docs/SCALING.md).

// Units is the name of the range a member group divides: the job's
// sub-topologies, by index.
const Units = "sub-topologies"

// ErrLost stops a member's sub-topologies at once, without a final
// checkpoint: the group gave them to another member (this one's lease
// expired, or was taken), which restores them from the store.
var ErrLost = errors.New("group: sub-topologies taken over by another member")

// RunConfig is what Run needs.
type RunConfig struct {
	Job *job.Job
	// Options are the runtime's (Assignment is set by Run).
	Options runtime.Options
	// Member names this process in the group ("" DefaultMember).
	Member string
	Log    *slog.Logger
	// Started, when set, is called with each Running the member starts,
	// before it runs; Stopped when it stopped (nil: the member runs
	// nothing now). The HTTP server follows them.
	Started func(*runtime.Running)
	Stopped func(*runtime.Running)
	// Joined, when set, is called once the member joined the group.
	Joined func(*Member)
}

// DefaultMember is a member name stable across restarts of the same
// process (the host and its data directory: two live processes cannot
// share a data directory) and distinct between live ones.
func DefaultMember(j *job.Job) string {
	host, err := os.Hostname()
	if err != nil || !nameRe.MatchString(host) {
		host = "host"
	}
	dir, err := filepath.Abs(j.DataDir)
	if err != nil {
		dir = j.DataDir
	}
	h := sha256.Sum256([]byte(dir))
	name := host + "-" + hex.EncodeToString(h[:4])
	if len(name) > 64 {
		name = name[len(name)-64:]
	}
	return name
}

// Run runs j as a member of its group until ctx ends, then hands its
// sub-topologies over to the others (each with a final checkpoint) and
// leaves. It returns when a sub-topology it runs fails, or the group
// cannot be reached.
func Run(ctx context.Context, c RunConfig) error {
	j := c.Job
	if j.Group == nil {
		return fmt.Errorf("group: job %s has no group section", j.Name)
	}
	log := c.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if c.Member == "" {
		c.Member = DefaultMember(j)
	}
	plan, err := runtime.NewPlan(j)
	if err != nil {
		return err
	}
	units := []SubTopology{{Name: Units, KeyGroups: len(plan.Subs)}}
	nc, js, err := connect(j, log)
	if err != nil {
		return err
	}
	defer nc.Close()
	gcfg := Config{Job: j.Name, Member: c.Member, SubTopologies: units, LeaseTTL: j.Group.LeaseTTL, Replicas: j.Group.Replicas, Log: log}
	if name, ok := strings.CutPrefix(c.Options.Restore, "savepoint:"); ok {
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := requestRestore(rctx, js, gcfg, plan, name)
		cancel()
		if err != nil {
			return err
		}
	} else if c.Options.Restore != "" && c.Options.Restore != "latest" {
		return fmt.Errorf("group: --restore %s: a group member restores each sub-topology it is given from its newest checkpoint, or a group savepoint when the group starts (--restore savepoint:NAME)", c.Options.Restore)
	}
	jctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	m, err := Join(jctx, js, gcfg)
	cancel()
	if err != nil {
		return err
	}
	defer m.Close()
	log.Info("group: member running", "job", j.Name, "member", c.Member, "sub_topologies", len(plan.Subs), "lease_ttl", j.Group.LeaseTTL)
	if c.Joined != nil {
		c.Joined(m)
	}
	// The member takes its part of the group's savepoints.
	now := &nowRunning{plan: plan}
	sub, err := nc.Subscribe(savepointSubject(j.Name, c.Member), func(msg *nats.Msg) { go now.serve(msg) })
	if err != nil {
		return fmt.Errorf("group: member %s: subscribe to savepoint requests: %w", c.Member, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	// And tells `cairn group status` what it runs and how far it got.
	rsub, err := nc.Subscribe(reportSubject(j.Name), func(msg *nats.Msg) {
		b, _ := json.Marshal(MemberReport{Member: c.Member, Running: now.report()})
		_ = msg.Respond(b)
	})
	if err != nil {
		return fmt.Errorf("group: member %s: subscribe to status requests: %w", c.Member, err)
	}
	defer func() { _ = rsub.Unsubscribe() }()
	r := &runner{c: c, plan: plan, m: m, nc: nc, log: log, owned: map[int]bool{}, now: now}
	return r.loop(ctx)
}

// connect connects to the job's NATS server or cluster as its engines do.
func connect(j *job.Job, log *slog.Logger) (*nats.Conn, jetstream.JetStream, error) {
	nc, err := runtime.Connect(j, log)
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}

// StatusOf reads the status of j's group from its NATS server or cluster
// (`cairn group status`).
func StatusOf(ctx context.Context, j *job.Job, log *slog.Logger) (Status, error) {
	nc, js, err := connect(j, log)
	if err != nil {
		return Status{}, err
	}
	defer nc.Close()
	st, err := ReadStatus(ctx, js, j.Name)
	if err != nil {
		return st, err
	}
	return st, addReports(ctx, js, &st)
}

// runner applies a member's changes to the sub-topologies it runs: one
// Running at a time, started anew whenever its set changes.
type runner struct {
	c     RunConfig
	plan  *runtime.Plan
	m     *Member
	nc    *nats.Conn // the member's own connection
	now   *nowRunning
	log   *slog.Logger
	owned map[int]bool

	// failures are the times what ran failed, within failureWindow.
	failures []time.Time
	// retry, when set, fires when what the member owns is to be started
	// again: after a failure, or after the lease check stopped it (once
	// the lease is renewed; or the group says it is lost: a change).
	retry <-chan time.Time

	cur     *runtime.Running
	curSubs []int
	curCtx  context.Context // ends with cur's run
	cancel  context.CancelFunc
	done    chan error
}

func (r *runner) loop(ctx context.Context) error {
	var leaveDone chan error
	for {
		var runDone chan error
		if r.cur != nil {
			runDone = r.done
		}
		var stop <-chan struct{}
		if leaveDone == nil {
			stop = ctx.Done()
		}
		select {
		case <-stop:
			// A graceful stop: hand everything over, then leave. The
			// changes keep coming (the releases) while Leave waits.
			leaveDone = make(chan error, 1)
			go func() {
				lctx, cancel := context.WithTimeout(context.Background(), r.leaveTimeout())
				defer cancel()
				leaveDone <- r.m.Leave(lctx)
			}()
		case err := <-leaveDone:
			// Whatever is still run (no other member was there to take
			// it) stops with its final checkpoint.
			stopErr := r.stop(false)
			if err != nil {
				return errors.Join(fmt.Errorf("group: leave: %w", err), stopErr)
			}
			return stopErr
		case <-r.retry:
			r.retry = nil
			if r.cur != nil || len(r.owned) == 0 || leaveDone != nil {
				continue
			}
			if r.m.LeaseValid() != nil || !r.nc.IsConnected() {
				r.retry = time.After(r.c.Job.Group.LeaseTTL / 4)
				continue
			}
			r.log.Info("group: lease renewed: starting again", "member", r.m.ID())
			if err := r.start(ctx, r.wanted()); err != nil {
				if ferr := r.failed(err, r.wanted(), leaveDone != nil); ferr != nil {
					return ferr
				}
			}
		case err := <-runDone:
			subs := r.curSubs
			r.closeCur()
			if errors.Is(err, ErrLeaseLapsed) {
				// Paused or cut off past the lease: nothing was published
				// since. The group decides: the lease renews (start again)
				// or is lost (a change).
				r.log.Warn("group: stopped publishing: the lease may have expired", "member", r.m.ID(), "sub_topologies", r.names(subs), "err", err)
				r.retry = time.After(r.c.Job.Group.LeaseTTL / 4)
				continue
			}
			if err == nil {
				err = errors.New("stopped on its own")
			}
			if ferr := r.failed(err, subs, leaveDone != nil); ferr != nil {
				return ferr
			}
		case ch, ok := <-r.m.Changes():
			if !ok {
				if leaveDone != nil {
					// Leave stops the member once it handed everything
					// over (or nobody was there to take it): what still
					// runs stops with its final checkpoint.
					err := <-leaveDone
					stopErr := r.stop(false)
					if err != nil {
						return errors.Join(fmt.Errorf("group: leave: %w", err), stopErr)
					}
					return stopErr
				}
				return errors.Join(ErrClosed, r.stop(true))
			}
			if err := r.apply(ctx, r.drain(ch)); err != nil {
				if ferr := r.failed(err, r.wanted(), leaveDone != nil); ferr != nil {
					return ferr
				}
			}
		}
	}
}

// A member starts failed sub-topologies again up to maxFailures times
// within failureWindow, then stops.
const (
	maxFailures   = 3
	failureWindow = time.Minute
)

// failed counts a failure of what ran, or of its start, and starts it
// again from the newest checkpoints after a pause: a failure may be the
// cluster's moment (a node restarting, a stream's leader being elected, a
// member just resumed from a pause). A failure that repeats (more than
// maxFailures within failureWindow), or one while leaving, is returned:
// the member stops, and the group gives its sub-topologies to the others.
func (r *runner) failed(err error, subs []int, leaving bool) error {
	if !leaving && errors.Is(err, engine.ErrFenced) {
		// A newer owner claimed an output stream: what this member runs
		// is another's now, which the group's next change says.
		r.log.Warn("group: a newer owner holds the sub-topologies' outputs: waiting for the group's change", "member", r.m.ID(), "sub_topologies", r.names(subs), "err", err)
		r.retry = time.After(r.c.Job.Group.LeaseTTL / 4)
		return nil
	}
	if !leaving && !r.nc.IsConnected() {
		// Cut off from NATS: not a failure of what ran, and nothing
		// starts until the member is connected again with a valid
		// lease (or the group gave its sub-topologies to others).
		r.log.Warn("group: sub-topologies stopped while the member is cut off from NATS: starting them again once it is back", "member", r.m.ID(), "sub_topologies", r.names(subs), "err", err)
		r.retry = time.After(r.c.Job.Group.LeaseTTL / 4)
		return nil
	}
	now := time.Now()
	r.failures = append(slices.DeleteFunc(r.failures, func(t time.Time) bool { return now.Sub(t) > failureWindow }), now)
	if len(r.failures) > maxFailures || leaving {
		return fmt.Errorf("group: member %s: sub-topologies %v: %w", r.m.ID(), r.names(subs), err)
	}
	r.log.Warn("group: sub-topologies failed: starting them again from their newest checkpoints", "member", r.m.ID(), "sub_topologies", r.names(subs), "failures", len(r.failures), "err", err)
	r.retry = time.After(time.Duration(len(r.failures)) * time.Second)
	return nil
}

// leaveTimeout bounds a graceful leave: the others must take over, each
// handoff a final checkpoint.
func (r *runner) leaveTimeout() time.Duration {
	d := r.c.Options.StopTimeout
	if d <= 0 {
		d = runtime.DefaultStopTimeout
	}
	return d + 2*r.c.Job.Group.LeaseTTL
}

// drain merges c with the changes already queued, so that a burst of
// changes restarts the sub-topologies once.
func (r *runner) drain(c Change) Change {
	r.own(c)
	for {
		select {
		case n, ok := <-r.m.Changes():
			if !ok {
				return c
			}
			r.own(n)
			c.Gained = append(c.Gained, n.Gained...)
			c.Release = append(c.Release, n.Release...)
			c.Lost = append(c.Lost, n.Lost...)
		case <-time.After(50 * time.Millisecond):
			return c
		}
	}
}

// own applies one change to what the member owns. Within a change, a
// range lost and gained again (a lease that lapsed and came back) is owned
// under its new epoch, and one gained and to be released at once (it moves
// on before it ran here: a member joined right after this one was given
// it) is not owned; across changes, the later one decides. Merging a burst
// of changes into one list first lost that order: a range gained, then
// released to a joiner, was started after its release, beside its new
// owner.
func (r *runner) own(c Change) {
	for _, k := range r.subsOf(c.Lost) {
		delete(r.owned, k)
	}
	for _, k := range r.subsOf(c.Gained) {
		r.owned[k] = true
	}
	for _, k := range r.subsOf(c.Release) {
		delete(r.owned, k)
	}
}

// apply stops what c takes away (at once for lost ones; with a final
// checkpoint, then Release, for released ones), and starts what the member
// owns now.
func (r *runner) apply(ctx context.Context, c Change) (err error) {
	t0 := time.Now()
	lost, released, gained := r.subsOf(c.Lost), r.subsOf(c.Release), r.subsOf(c.Gained)
	if len(lost)+len(released)+len(gained) > 0 {
		before := r.cur
		defer func() {
			e := Event{At: t0, Gained: r.names(gained), Lost: r.names(lost), Released: r.names(released), Running: r.names(r.curSubs)}
			started := r.cur != nil && r.cur != before
			if started {
				e.RunningAfter, e.Restores = time.Since(t0), restoresOf(r.cur)
			}
			if err != nil {
				e.Err = err.Error()
			}
			seq := r.m.record(e)
			if started && err == nil {
				go r.watchCatchUp(r.curCtx, r.cur, t0, seq)
			}
		}()
	}
	want := r.wanted() // drain applied the changes to r.owned, in order
	// A sub-topology lost and gained back in one burst (a lease that
	// lapsed, then a new epoch) may have run elsewhere meanwhile: it
	// restarts from the newest checkpoint like any gained one.
	abrupt := len(intersect(lost, r.curSubs)) > 0
	if slices.Equal(want, r.curSubs) && len(released) == 0 && !abrupt {
		return nil
	}
	if len(lost) > 0 {
		r.log.Warn("group: sub-topologies lost to another member: stopping them without a final checkpoint", "member", r.m.ID(), "lost", r.names(lost))
	}
	if len(released) > 0 {
		r.log.Info("group: handing sub-topologies over: final checkpoint, then release", "member", r.m.ID(), "release", r.names(released))
	}
	// Stop what runs: abruptly when any of it was lost (the new owner may
	// run it already), else with a final checkpoint.
	if err := r.stop(abrupt); err != nil && !errors.Is(err, ErrLost) {
		r.log.Warn("group: stop before a change", "member", r.m.ID(), "err", err)
	}
	for _, o := range c.Release {
		// A release during a graceful leave (ctx ended by the stop
		// signal) must still go through: bounded by its own timeout, not
		// by ctx.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		err := r.m.Release(rctx, o.Range)
		cancel()
		switch {
		case err == nil:
			r.log.Info("group: released", "member", r.m.ID(), "sub_topologies", r.names(r.subsOf([]Owned{o})), "to", o.Next)
		case errors.Is(err, ErrNotMoving), errors.Is(err, ErrClosed):
		default:
			// The member asks again; until then the sub-topology is not
			// run here (its final checkpoint is committed).
			r.log.Warn("group: release", "member", r.m.ID(), "sub_topologies", r.names(r.subsOf([]Owned{o})), "err", err)
		}
	}
	if len(want) == 0 {
		r.log.Info("group: running nothing now", "member", r.m.ID())
		return nil
	}
	return r.start(ctx, want)
}

// natsURLs is the job's NATS URLs followed by the servers the member's
// connection discovered (a cluster's other nodes), comma-separated.
func (r *runner) natsURLs() string {
	return joinURLs(r.c.Job.NATS, r.nc.DiscoveredServers())
}

// joinURLs is the comma-separated URLs named followed by those discovered
// that are not among them. A discovered server's URL carries no user
// information: the first named URL's is given to it (the client does the
// same for the servers it discovers), so a user and password in the URL
// reach every node.
func joinURLs(named string, discovered []string) string {
	urls := strings.Split(named, ",")
	var user *url.Userinfo
	if u, err := url.Parse(strings.TrimSpace(urls[0])); err == nil {
		user = u.User
	}
	for _, d := range discovered {
		if u, err := url.Parse(d); err == nil && u.User == nil && user != nil {
			u.User = user
			d = u.String()
		}
		if !slices.Contains(urls, d) {
			urls = append(urls, d)
		}
	}
	return strings.Join(urls, ",")
}

func (r *runner) wanted() []int {
	var want []int
	for k := range r.owned {
		want = append(want, k)
	}
	slices.Sort(want)
	return want
}

func (r *runner) start(ctx context.Context, subs []int) error {
	t0 := time.Now()
	ro := r.c.Options
	ro.Assignment = r.plan.Parts(subs...)
	// A member's sub-topologies always restore their newest checkpoint:
	// the one the previous owner committed.
	ro.Restore = "latest"
	// ... unless a group savepoint's restore is pending for it.
	pctx, pcancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	pending, err := r.pendingRestores(pctx, subs)
	pcancel()
	if err != nil {
		return err
	}
	if len(pending) > 0 {
		ro.RestoreSub = map[int]string{}
		for k, p := range pending {
			ro.RestoreSub[k] = "savepoint:" + p.name
		}
	}
	// Nothing is published once the lease may have lapsed, nor while the
	// engines' connection is down: the client would keep such publishes
	// and send them on reconnecting, however late, after another member
	// may have taken over.
	// Every sub-topology's outputs are fenced with the epoch of this
	// member's ownership: its engines claim their output streams, and a
	// member that lost one is refused by the server at its next check.
	ro.FenceEpochs = map[int]uint64{}
	for _, k := range subs {
		if ep, ok := r.m.Epoch(Units, k); ok {
			ro.FenceEpochs[k] = ep
		}
	}
	var conn atomic.Pointer[nats.Conn]
	ro.PublishGuard = func() error {
		if nc := conn.Load(); nc != nil && !nc.IsConnected() {
			return fmt.Errorf("%w: the connection to NATS is down (%s): publishes wait for it and the lease", ErrLeaseLapsed, nc.Status())
		}
		return r.m.LeaseValid()
	}
	// A stop signal that comes during a start (a restore under way) is
	// the loop's to handle, by handing over what started: the start
	// itself is not cut short.
	// The engines connect anew: to the servers the job names, and the
	// ones the cluster told the member of, in case those named are down.
	j := *r.c.Job
	j.NATS = r.natsURLs()
	run, err := runtime.Start(context.WithoutCancel(ctx), &j, ro, r.log)
	if err != nil {
		return fmt.Errorf("group: member %s: start %v: %w", r.m.ID(), r.names(subs), err)
	}
	conn.Store(run.NC)
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	r.cur, r.curSubs, r.curCtx, r.cancel, r.done = run, subs, rctx, cancel, make(chan error, 1)
	if len(pending) > 0 {
		go r.clearRestores(rctx, run, pending)
	}
	r.now.set(run)
	if r.c.Started != nil {
		r.c.Started(run)
	}
	r.log.Info("group: running", "member", r.m.ID(), "sub_topologies", r.names(subs), "start", time.Since(t0).Round(time.Millisecond))
	done := r.done
	go func() { done <- run.Run(rctx) }()
	return nil
}

// catchUpPoll is how often a catch-up watch reads the engines' positions;
// catchUpMax bounds the watch (a backlog not worked off by then shows no
// figure).
const (
	catchUpPoll = 100 * time.Millisecond
	catchUpMax  = 30 * time.Minute
)

// watchCatchUp records, in event seq, when run (started by a change at t0)
// had processed each sub-topology's input up to where it ended at the
// start: the takeover's "lag recovered". It reads each input stream's last
// sequence once, then only the engines' positions. An input that cannot
// be read, a run that ends, or catchUpMax leave the event without it.
func (r *runner) watchCatchUp(ctx context.Context, run *runtime.Running, t0 time.Time, seq uint64) {
	js, err := jetstream.New(r.nc)
	if err != nil {
		return
	}
	subs := run.SubTopologies()
	target := make([]uint64, len(subs))
	var backlog uint64
	for i, s := range subs {
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		st, err := js.Stream(sctx, s.Job.Input.Stream)
		cancel()
		if err != nil {
			r.log.Debug("group: catch-up not measured: input stream not read", "sub_topology", s.Job.Name, "err", err)
			return
		}
		target[i] = st.CachedInfo().State.LastSeq
		from := s.Engine.ProcessedSeq()
		if s.Restored != nil {
			from = s.Restored.SourceSeq // where it started, not where it got by now
		}
		if target[i] > from {
			backlog += target[i] - from
		}
	}
	tick := time.NewTicker(catchUpPoll)
	defer tick.Stop()
	deadline := time.After(catchUpMax)
	for {
		done := true
		for i, s := range subs {
			if s.Engine.ProcessedSeq() < target[i] {
				done = false
				break
			}
		}
		if done {
			r.m.caughtUp(seq, time.Since(t0), backlog)
			r.log.Info("group: caught up after the change", "member", r.m.ID(), "after", time.Since(t0).Round(time.Millisecond), "backlog", backlog)
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-deadline:
			return
		case <-tick.C:
		}
	}
}

// stop stops what runs: abrupt, the engines fail with ErrLost (no final
// checkpoint); else a graceful stop (the final checkpoint, bounded by the
// stop timeout).
func (r *runner) stop(abrupt bool) error {
	if r.cur == nil {
		return nil
	}
	if abrupt {
		for _, s := range r.cur.SubTopologies() {
			s.Engine.Fail(ErrLost)
		}
	} else {
		r.cancel()
	}
	err := <-r.done
	r.closeCur()
	return err
}

func (r *runner) closeCur() {
	if r.cur == nil {
		return
	}
	r.cancel()
	r.now.set(nil)
	if r.c.Stopped != nil {
		r.c.Stopped(r.cur)
	}
	r.cur.Close()
	r.cur, r.curSubs = nil, nil
}

func (r *runner) subsOf(os []Owned) []int {
	var out []int
	for _, o := range os {
		if o.Sub != Units {
			continue
		}
		for k := o.Lo; k < o.Hi; k++ {
			if !slices.Contains(out, k) {
				out = append(out, k)
			}
		}
	}
	return out
}

func (r *runner) names(subs []int) []string {
	out := make([]string, len(subs))
	for i, k := range subs {
		out[i] = r.plan.SubName(k)
	}
	return out
}

func intersect(a, b []int) []int {
	var out []int
	for _, x := range a {
		if slices.Contains(b, x) {
			out = append(out, x)
		}
	}
	return out
}
