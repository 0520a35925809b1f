package runtime

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"cairn/checkpoint"
	"cairn/engine"
	"cairn/internal/app/job"
	"cairn/state"
)

// subPos is a sub-topology's place in its job graph: one of n.
type subPos struct {
	k      int // the sub-topology's index in the graph
	n      int
	sub    job.SubTopology
	budget memoryBudget // the whole job's
}

// A job graph runs as one engine per sub-topology (job.Graph), in one
// process, joined by repartition streams that cairn creates and owns:
// repartition stream k is read by sub-topology k and written exactly_once
// by the one or two sub-topologies that feed it, partitioned by their key
// groups (a two-input stage's stream: each side on subjects of its own)
// and carrying their watermark; sub-topology k reads it like an input and
// keeps its position in its own checkpoints. Each sub-topology after the
// first has its own name (<job>.s<k>: checkpoints under that prefix, its
// ticks), data directory (<data_dir>/s<k>) and checkpoint chain.

// subName is the name of sub-topology k (the job's own for the first). A
// '.' cannot be in a job name, so it never collides with another job's.
func subName(j *job.Job, k int) string { return SubTopologyName(j.Name, k) }

// SubTopologyName is the name of sub-topology k of job graph jobName: its
// checkpoint chain, its savepoints' and its dashboard's name.
func SubTopologyName(jobName string, k int) string {
	if k == 0 {
		return jobName
	}
	return jobName + ".s" + strconv.Itoa(k)
}

// RepartitionStream is the stream sub-topology k of a job reads, and the
// subject prefix of its key groups (of a side's: prefix.<side>.<kg>).
func RepartitionStream(jobName string, k int) (stream, subject string) {
	return "CAIRN_RP_" + strings.ToUpper(jobName) + "_" + strconv.Itoa(k), "cairn.rp." + jobName + "." + strconv.Itoa(k)
}

// targetSubject is the stream and subject prefix of a target of a
// sub-topology: a job output's, or the repartition stream it feeds (on
// subjects of its side when the stream has two writers).
func targetSubject(j *job.Job, subs []job.SubTopology, t job.Target) (stream, subject string) {
	if t.Feeds < 0 {
		o, _ := j.OutputNamed(t.Output)
		return o.Stream, o.Subject
	}
	stream, subject = RepartitionStream(j.Name, t.Feeds)
	if subs[t.Feeds].Sides > 1 {
		subject += "." + strconv.Itoa(t.Side)
	}
	return stream, subject
}

// subJob is the job of sub-topology k: its stages, its input (a job input,
// or repartition stream k), its outputs (Output, the primary target, and
// Extra: job outputs and the repartition streams it feeds), its name and
// data directory.
func subJob(j *job.Job, subs []job.SubTopology, k int) *job.Job {
	c := *j
	sub := subs[k]
	c.Name = subName(j, k)
	c.Stages = sub.Stages
	c.Inputs, c.Outputs, c.Extra = nil, nil, nil
	if st, ok := sub.Keyed(); ok && st.Slots > 0 {
		c.Slots = st.Slots
	}
	if sub.Input != "" {
		c.Input, _ = j.InputNamed(sub.Input)
		c.Input.Name = ""
		if b := c.Input.Table; b != "" {
			stream, subjects := engine.TableStream(b)
			c.Input.Stream, c.Input.Subjects = stream, []string{subjects}
		}
	} else {
		stream, subject := RepartitionStream(j.Name, k)
		c.Input = job.Input{Stream: stream, Subjects: []string{subject + ".>"}}
	}
	if k > 0 {
		c.DataDir = filepath.Join(j.DataDir, "s"+strconv.Itoa(k))
	}
	for n, t := range sub.Targets {
		stream, subject := targetSubject(j, subs, t)
		if n == 0 {
			c.Output.Stream, c.Output.Subject = stream, subject
			c.Output.Discard = j.Output.Discard && t.Feeds < 0 // the sub-topology that ends the job discards; the others feed their streams
			if sub.Repartitions() {
				c.Output.Delivery = "exactly_once" // validated: the job's too when it also feeds an output
			}
			continue
		}
		c.Extra = append(c.Extra, job.ExtraOutput{Port: t.Port, Stream: stream, Subject: subject, Repartition: t.Feeds >= 0})
	}
	if j.Checkpoint != nil {
		cp := *j.Checkpoint
		c.Checkpoint = &cp
	}
	return &c
}

// writer is one writer of a repartition stream: a sub-topology's target.
type writer struct {
	sub     int
	side    int
	subject string // its subject prefix
}

// writers returns the writers of repartition stream k, in side order.
func writers(j *job.Job, subs []job.SubTopology, k int) []writer {
	var w []writer
	for _, s := range subs {
		for _, t := range s.Targets {
			if t.Feeds == k {
				_, subject := targetSubject(j, subs, t)
				w = append(w, writer{sub: s.Index, side: t.Side, subject: subject})
			}
		}
	}
	slices.SortFunc(w, func(a, b writer) int { return a.side - b.side })
	return w
}

// startGraph starts every sub-topology of a job graph; the first Running
// holds the others in Downstream.
//
// local, when not nil, are the sub-topologies this process runs (a group
// member's share, docs/SCALING.md); the others run elsewhere.
func startGraph(ctx context.Context, j *job.Job, subs []job.SubTopology, mb memoryBudget, ro Options, log *slog.Logger, local []int) (*Running, error) {
	if local == nil {
		local = make([]int, len(subs))
		for k := range local {
			local[k] = k
		}
	}
	if ro.Broker != nil {
		return nil, errors.New("a job graph (a keyed stage after another, or a stage with two inputs) runs on NATS only; cairn test runs one sub-topology at a time")
	}
	// --restore ID names a graph checkpoint: each sub-topology restores
	// its part of it.
	var restoreGraph *checkpoint.GraphManifest
	if spec := ro.Restore; spec != "" && spec != "latest" && spec != "none" && !strings.HasPrefix(spec, "savepoint:") {
		g, err := loadGraphCheckpoint(ctx, j, subs, spec)
		if err != nil {
			return nil, err
		}
		restoreGraph = g
	}
	var first *Running
	all := make([]*Running, len(subs))
	for _, k := range local {
		sro := ro
		if restoreGraph != nil {
			sro.Restore = strconv.FormatUint(restoreGraph.Parts[k].Checkpoint, 10)
		}
		if r, ok := ro.RestoreSub[k]; ok {
			sro.Restore = r
		}
		r, err := startSub(ctx, subJob(j, subs, k), sro, log, first, subPos{k: k, n: len(subs), sub: subs[k], budget: mb})
		if err != nil {
			if first != nil {
				first.Close()
			}
			return nil, fmt.Errorf("sub-topology %d (%s): %w", k, subName(j, k), err)
		}
		all[k] = r
		if first == nil {
			first = r
			continue
		}
		first.Downstream = append(first.Downstream, r)
	}
	js, err := jetstream.New(first.NC)
	if err == nil {
		err = prepareRepartitionStreams(ctx, js, j, subs, all, ro.Restore, log)
	}
	if err == nil {
		err = tableGates(ctx, js, j, subs, all, log)
	}
	if err != nil {
		first.Close()
		return nil, err
	}
	for k := range subs {
		ws := writers(j, subs, k)
		down := all[k]
		if len(ws) == 0 || (down != nil && down.committer == nil) {
			continue // reads a job input; or no checkpoints: nothing decides what may go
		}
		stream, _ := RepartitionStream(j.Name, k)
		var edges []*edge
		for _, w := range ws {
			// A writer run by another member: that member purges its
			// subjects (docs/SCALING.md).
			if all[w.sub] == nil || all[w.sub].committer == nil {
				continue
			}
			up := all[w.sub]
			// Only the writer's key-group subjects: a fenced writer's
			// claim (engine.FenceSubject, a token deeper) stays.
			e := &edge{js: js, stream: stream, log: log, filter: w.subject + ".*"}
			if down == nil {
				// The reader runs elsewhere: what it may still restore is
				// in the shared store, read at each of this writer's
				// commits.
				e.remote = &remoteReader{store: up.Store, job: subName(j, k)}
				e.startRemotePurges(first)
				up.committer.afterCommit = append(up.committer.afterCommit, e.upstreamCommittedRemote)
				continue
			}
			e.retain = max(down.Job.Checkpoint.Retain, 1)
			if e.pin, err = savepointPin(ctx, down, log); err != nil {
				first.Close()
				return nil, err
			}
			up.committer.afterCommit = append(up.committer.afterCommit, e.upstreamCommitted)
			edges = append(edges, e)
		}
		if len(edges) == 0 {
			continue
		}
		down.committer.afterCommit = append(down.committer.afterCommit, func(ctx context.Context, b engine.Barrier, _ *checkpoint.Manifest) {
			for _, e := range edges {
				e.downstreamCommitted(ctx, b)
			}
		})
		down.committer.afterSavepoint = append(down.committer.afterSavepoint, func(b engine.Barrier) {
			for _, e := range edges {
				e.savepointCommitted(b.SourceSeq)
			}
		})
	}
	// Every sub-topology has checkpoints or none has (they share the job's
	// checkpoint section). A graph checkpoint names every sub-topology's:
	// only a process that runs them all writes one. Every process removes
	// those naming a checkpoint its retention drops (a group member too:
	// one that ran the whole graph before the others joined wrote some).
	if first.committer != nil {
		names := make([]string, len(subs))
		for k := range subs {
			names[k] = subName(j, k)
		}
		gc := &graphCheckpoints{store: first.Store, job: j.Name, names: names, log: log, newest: make([]*checkpoint.Manifest, len(all))}
		whole := !slices.Contains(all, nil)
		if whole {
			first.graph = gc
		}
		for k, s := range all {
			if s == nil {
				continue
			}
			if whole {
				s.committer.afterCommit = append(s.committer.afterCommit, func(ctx context.Context, _ engine.Barrier, m *checkpoint.Manifest) {
					gc.partCommitted(ctx, k, m)
				})
			}
			name := s.Job.Name
			s.Writer.SetBeforeDrop(func(ctx context.Context, ids []uint64) error { return gc.dropping(ctx, name, ids) })
		}
	}
	if restoreGraph != nil {
		log.Info("graph checkpoint restored", "job", j.Name, "id", restoreGraph.ID, "parts", GraphPartsText(restoreGraph))
	}
	log.Info("job graph", "job", j.Name, "sub_topologies", len(subs))
	return first, nil
}

// loadGraphCheckpoint reads the graph checkpoint --restore names and checks
// it fits the job's graph as it is now.
func loadGraphCheckpoint(ctx context.Context, j *job.Job, subs []job.SubTopology, spec string) (*checkpoint.GraphManifest, error) {
	id, err := strconv.ParseUint(spec, 10, 64)
	if err != nil {
		return nil, &job.Error{Field: "checkpoint", Reason: fmt.Sprintf("--restore %q: use latest, a graph checkpoint id, savepoint:NAME or none", spec)}
	}
	if j.Checkpoint == nil {
		return nil, &job.Error{Field: "checkpoint", Reason: fmt.Sprintf("--restore %s needs a checkpoint store", spec)}
	}
	u, err := StoreURL(j)
	if err != nil {
		return nil, err
	}
	store, err := checkpoint.OpenStore(ctx, u)
	if err != nil {
		return nil, &job.Error{Field: "checkpoint.store", Reason: err.Error()}
	}
	defer store.Close(ctx)
	g, err := checkpoint.LoadGraph(ctx, store, j.Name, id)
	if err != nil {
		if errors.Is(err, checkpoint.ErrNotFound) {
			return nil, fmt.Errorf("--restore %d: job graph %s has no graph checkpoint %d (cairn checkpoints ls lists them; a graph checkpoint is kept while each checkpoint it names is): %w", id, j.Name, id, err)
		}
		return nil, fmt.Errorf("--restore %d: %w", id, err)
	}
	if len(g.Parts) != len(subs) {
		return nil, fmt.Errorf("--restore %d: graph checkpoint %d has %d sub-topologies, the job now has %d: restore each one's latest (--restore latest) or a savepoint", id, id, len(g.Parts), len(subs))
	}
	return g, nil
}

// GraphPartsText lists a graph checkpoint's parts for a log line.
func GraphPartsText(g *checkpoint.GraphManifest) string {
	var b strings.Builder
	for i, p := range g.Parts {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s:%d", p.Name, p.Checkpoint)
	}
	return b.String()
}

// graphCheckpoints commits a job graph's graph checkpoints: once every
// sub-topology has committed a checkpoint since the last one, a manifest
// naming each one's newest (checkpoint.GraphManifest; its id is the first
// sub-topology's checkpoint). Any set of the sub-topologies' checkpoints is
// restorable together (docs/RATIONALE.md, "Checkpoints per
// sub-topology"), so the set needs no barrier across the graph; what the
// graph checkpoint adds is one name for the whole graph at one point, to
// restore, list and show.
//
// INVARIANT: a graph checkpoint in the store names only checkpoints that
// exist. Each sub-topology's retention calls dropping before it deletes a
// manifest (checkpoint.Writer.SetBeforeDrop), and the graph checkpoints
// naming it go first; a crash between the two leaves a checkpoint without
// its index, never an index without its checkpoint, which `checkpoints ls`
// would list and `--restore ID` refuse.
type graphCheckpoints struct {
	store checkpoint.Store
	job   string
	names []string // every sub-topology's chain, in order
	log   *slog.Logger

	mu sync.Mutex
	// newest is each sub-topology's newest checkpoint committed since the
	// last graph checkpoint (nil: none yet).
	newest []*checkpoint.Manifest
	// committed is the newest graph checkpoint committed (nil: none yet).
	committed *checkpoint.GraphManifest

	// indexMu guards known and listed, apart from mu: it is held across
	// store I/O (a graph checkpoint's write, the deletes before a drop),
	// which must not hold up the dashboard. Lock order: a writer's lock,
	// then indexMu; nothing under indexMu calls a writer.
	indexMu sync.Mutex
	// known are the graph checkpoints in the store, once listed (at the
	// first commit or drop), then each one committed; a drop reads nothing.
	known  []*checkpoint.GraphManifest
	listed bool
}

// latest returns the newest graph checkpoint this process committed (nil:
// none yet, or g is nil: a job without graph checkpoints).
func (g *graphCheckpoints) latest() *checkpoint.GraphManifest {
	if g == nil {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.committed
}

func (g *graphCheckpoints) partCommitted(ctx context.Context, k int, m *checkpoint.Manifest) {
	g.mu.Lock()
	g.newest[k] = m
	if slices.Contains(g.newest, nil) {
		g.mu.Unlock()
		return
	}
	gm := checkpoint.GraphOf(g.job, time.Now(), g.newest)
	clear(g.newest)
	g.mu.Unlock()
	// The write and its entry in known are one step under indexMu: a drop
	// of a checkpoint gm names, racing with it, waits and then removes gm.
	g.indexMu.Lock()
	defer g.indexMu.Unlock()
	if err := g.listLocked(ctx); err != nil {
		g.log.Warn("graph checkpoint not written: the existing ones could not be listed (each sub-topology's checkpoint is committed; the next round writes one)", "id", gm.ID, "err", err)
		return
	}
	// A graph checkpoint is an index: failing to write one loses no state
	// (each part is committed), so it is a warning, not a failed checkpoint.
	if err := checkpoint.CommitGraph(ctx, g.store, gm); err != nil {
		g.log.Warn("graph checkpoint not written (each sub-topology's checkpoint is committed; the next round writes one)", "id", gm.ID, "err", err)
		return
	}
	g.known = append(g.known, gm)
	g.log.Debug("graph checkpoint committed", "id", gm.ID, "parts", GraphPartsText(gm))
	g.mu.Lock()
	if g.committed == nil || gm.ID > g.committed.ID {
		g.committed = gm
	}
	g.mu.Unlock()
}

// listLocked reads the store's graph checkpoints once (those of earlier
// runs), and removes those that name a checkpoint already gone (left by a
// version that dropped checkpoints first, or by a failed `cairn
// checkpoints gc`). Damaged ones are left to `cairn checkpoints gc`.
func (g *graphCheckpoints) listLocked(ctx context.Context) error {
	if g.listed {
		return nil
	}
	gs, _, err := checkpoint.ListGraphs(ctx, g.store, g.job)
	if err != nil {
		return err
	}
	ids := map[string][]uint64{}
	for _, name := range g.names {
		if ids[name], err = checkpoint.ManifestIDs(ctx, g.store, name); err != nil {
			return err
		}
	}
	kept, pruned, err := checkpoint.PruneGraphList(ctx, g.store, gs, func(name string, id uint64) bool { return slices.Contains(ids[name], id) })
	if err != nil {
		return err
	}
	if len(pruned) > 0 {
		g.log.Info("graph checkpoints removed: a checkpoint they name was already gone", "ids", pruned)
	}
	g.known, g.listed = kept, true
	return nil
}

// dropping removes the graph checkpoints that name one of checkpoints ids
// of sub-topology chain name, which its writer's retention is about to
// drop (the writer's lock is held). An error keeps the checkpoints.
func (g *graphCheckpoints) dropping(ctx context.Context, name string, ids []uint64) error {
	g.indexMu.Lock()
	defer g.indexMu.Unlock()
	if err := g.listLocked(ctx); err != nil {
		return fmt.Errorf("graph checkpoints of %s: %w", g.job, err)
	}
	kept, removed, err := checkpoint.RemoveGraphsNaming(ctx, g.store, g.known, name, ids)
	g.known = kept
	if err != nil {
		return err
	}
	if len(removed) > 0 {
		g.log.Debug("graph checkpoints removed (retention drops a checkpoint they name)", "ids", removed, "sub_topology", name, "checkpoints", ids)
	}
	return nil
}

// edge purges a repartition stream of what no restore can need again.
//
// The downstream may restore any checkpoint it retains (the newest, or an
// older one with restore.fallback), so messages at or after the oldest
// retained one's position must stay. The upstream, restarted, reads each
// key group's last message to know which outputs the stream holds, so
// that message must stay too: every upstream checkpoint publishes a marker
// on every key group, and P (the stream's last sequence sampled after the
// upstream's previous commit, before this checkpoint's markers) is below
// all of them. Purging below min(P, the downstream's oldest retained
// position + 1) keeps both. A savepoint of the downstream is restorable as
// long as it exists, so its position pins the stream too (until
// cairn savepoint rm): the stream grows back to the oldest savepoint.
//
// A stream with two writers (a two-input stage's) has an edge per writer,
// each purging only its own subjects (filter).
type edge struct {
	js     jetstream.JetStream
	stream string
	filter string // the writer's key-group subjects
	retain int
	log    *slog.Logger

	mu sync.Mutex
	// lastSeqAt: the stream's last sequence sampled after the upstream's
	// two newest commits in this process, older first (0: not yet).
	lastSeqAt [2]uint64
	// positions of the downstream's newest committed checkpoints, oldest
	// first, at most retain.
	positions []uint64
	purged    uint64 // the last cutoff purged below
	// pin is the least input position of the downstream's savepoints,
	// +1 (0: none): nothing at or after it is purged. It is read at start
	// and lowered by each savepoint the downstream commits here.
	pin uint64

	// remote, when set, is the downstream run by another process (a
	// group member): its retained checkpoints and savepoints are read from
	// the shared store instead of counted here (positions, pin unused).
	remote *remoteReader
	// wake asks the remote purge loop for a round (buffered: rounds asked
	// while one runs merge into the next).
	wake chan struct{}
}

// remoteReader reads what a downstream run elsewhere may still restore.
type remoteReader struct {
	store checkpoint.Store
	job   string // the downstream's checkpoint name
}

// remoteReadTimeout bounds the store reads of a purge whose downstream
// runs elsewhere (one round of the edge's purge loop).
const remoteReadTimeout = 10 * time.Second

// cutoff is the purge bound the downstream allows: the least input
// position of its intact checkpoints and savepoints, +1; ok is false when
// it has no intact checkpoint (it would read the stream from its start) or
// the store could not be read. The checkpoints are read before the
// savepoints: a savepoint committed after the first read has a position
// at or above the downstream's newest checkpoint then, so it cannot lower
// the bound below what it needs.
func (r *remoteReader) cutoff(ctx context.Context) (cut uint64, ok bool, err error) {
	cps, err := checkpoint.List(ctx, r.store, r.job)
	if err != nil {
		return 0, false, err
	}
	for _, c := range cps {
		if c.Corrupt == "" && (!ok || c.SourceSeq+1 < cut) {
			cut, ok = c.SourceSeq+1, true
		}
	}
	if !ok {
		return 0, false, nil
	}
	pin, err := savepointsPin(ctx, r.store, r.job)
	if err != nil {
		return 0, false, err
	}
	if pin > 0 {
		cut = min(cut, pin)
	}
	return cut, true, nil
}

// savepointPin is the position + 1 of the downstream's oldest savepoint
// (0 when it has none). A savepoint that cannot be read now pins the
// whole stream (1) until the next start, with a warning.
func savepointPin(ctx context.Context, down *Running, log *slog.Logger) (uint64, error) {
	if down.Store == nil {
		return 0, nil
	}
	pin, err := savepointsPin(ctx, down.Store, down.Job.Name)
	var unreadable *unreadableSavepointError
	if errors.As(err, &unreadable) {
		log.Warn("a savepoint of the downstream cannot be read: its repartition stream is not purged until the next start", "sub_topology", down.Job.Name, "err", err)
		return 1, nil
	}
	return pin, err
}

// unreadableSavepointError is a savepoint whose manifest cannot be read
// now: neither removed nor corrupt, so it may be restored later.
type unreadableSavepointError struct {
	job, name string
	err       error
}

func (e *unreadableSavepointError) Error() string {
	return fmt.Sprintf("savepoint %s of %s: %v", e.name, e.job, e.err)
}

func (e *unreadableSavepointError) Unwrap() error { return e.err }

// savepointsPin is the least input position of job's savepoints, +1 (0:
// none). A savepoint removed meanwhile or corrupt needs nothing (no restore
// can use it); one that cannot be read for another reason (a store error
// that outlasted the store's retries, a manifest of a newer format that a
// newer cairn may restore) is an *unreadableSavepointError: the stream
// must keep what it may need, which is unknown.
func savepointsPin(ctx context.Context, store checkpoint.Store, job string) (uint64, error) {
	names, err := checkpoint.ListSavepoints(ctx, store, job)
	if err != nil {
		return 0, fmt.Errorf("%s: savepoints: %w", job, err)
	}
	var pin uint64
	for _, name := range names {
		m, err := checkpoint.LoadSavepoint(ctx, store, job, name)
		switch {
		case errors.Is(err, checkpoint.ErrNotFound) || checkpoint.IsCorruption(err):
			continue
		case err != nil:
			return 0, &unreadableSavepointError{job: job, name: name, err: err}
		}
		if pin == 0 || m.SourceSeq+1 < pin {
			pin = m.SourceSeq + 1
		}
	}
	return pin, nil
}

func (e *edge) upstreamCommitted(ctx context.Context, _ engine.Barrier, _ *checkpoint.Manifest) {
	// The lookup returns the stream's info as of now: one API call.
	st, err := e.js.Stream(ctx, e.stream)
	if err != nil {
		return
	}
	info := st.CachedInfo()
	e.mu.Lock()
	e.lastSeqAt[0], e.lastSeqAt[1] = e.lastSeqAt[1], info.State.LastSeq
	e.mu.Unlock()
}

// upstreamCommittedRemote is upstreamCommitted for a downstream run
// elsewhere: it samples the stream and asks the edge's purge loop for a
// round. The round's store reads (2 + R + S requests) run there, off the
// writer's commit, so a slow store does not hold up its next checkpoint.
func (e *edge) upstreamCommittedRemote(ctx context.Context, b engine.Barrier, m *checkpoint.Manifest) {
	e.upstreamCommitted(ctx, b, m)
	select {
	case e.wake <- struct{}{}:
	default: // a round is asked already: it reads the newest sample
	}
}

// startRemotePurges starts the edge's purge loop, stopped by r's Close
// before it closes the connection and the store the loop uses.
func (e *edge) startRemotePurges(r *Running) {
	e.wake = make(chan struct{}, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-ctx.Done():
				return
			case <-e.wake:
			}
			e.purgeRemote(ctx)
		}
	}()
	r.loops = append(r.loops, loop{cancel: cancel, done: done})
}

// purgeRemote is one round: the bound is the older of the stream's sample
// after the writer's previous commit and what the downstream's
// checkpoints and savepoints in the store still need. The sample is the
// newest when the round runs: a bound as safe as the one of the commit
// that asked (both are below every later commit's), and further along.
func (e *edge) purgeRemote(ctx context.Context) {
	e.mu.Lock()
	sample := e.lastSeqAt[0]
	e.mu.Unlock()
	if sample == 0 {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, remoteReadTimeout)
	defer cancel()
	cut, ok, err := e.remote.cutoff(rctx)
	if err != nil {
		if ctx.Err() == nil {
			e.log.Warn("repartition stream not purged: the reader's checkpoints or savepoints could not be read (it keeps growing until the next try)", "stream", e.stream, "reader", e.remote.job, "err", err)
		}
		return
	}
	if ok {
		e.purgeBelow(ctx, min(cut, sample))
	}
}

// savepointCommitted pins the stream at a savepoint the downstream just
// committed (at input position pos).
func (e *edge) savepointCommitted(pos uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.pin == 0 || pos+1 < e.pin {
		e.pin = pos + 1
	}
}

func (e *edge) downstreamCommitted(ctx context.Context, b engine.Barrier) {
	e.mu.Lock()
	e.positions = append(e.positions, b.SourceSeq)
	if len(e.positions) > e.retain {
		e.positions = e.positions[len(e.positions)-e.retain:]
	}
	var cutoff uint64
	if len(e.positions) == e.retain && e.lastSeqAt[0] > 0 {
		cutoff = min(e.positions[0]+1, e.lastSeqAt[0])
		if e.pin > 0 {
			cutoff = min(cutoff, e.pin)
		}
	}
	e.mu.Unlock()
	e.purgeBelow(ctx, cutoff)
}

// purgeBelow purges the writer's subjects below cutoff, unless an earlier
// purge already went as far.
func (e *edge) purgeBelow(ctx context.Context, cutoff uint64) {
	e.mu.Lock()
	if cutoff <= e.purged+1 {
		e.mu.Unlock()
		return
	}
	e.purged = cutoff
	e.mu.Unlock()
	st, err := e.js.Stream(ctx, e.stream)
	if err == nil {
		opts := []jetstream.StreamPurgeOpt{jetstream.WithPurgeSequence(cutoff)}
		if e.filter != "" {
			opts = append(opts, jetstream.WithPurgeSubject(e.filter))
		}
		err = st.Purge(ctx, opts...)
	}
	if err != nil {
		e.log.Warn("repartition stream not purged (it keeps growing until the next try)", "stream", e.stream, "below", cutoff, "err", err)
	}
}

// A RepartitionError refuses to start a job graph whose repartition stream
// no longer holds what its restored sub-topologies need: the stream was
// deleted (or purged, or recreated) outside cairn. What the upstream
// published into it before its restored checkpoint cannot be regenerated,
// so starting anyway would lose records without a trace.
type RepartitionError struct {
	Stream string
	// Upstream and Downstream name the sub-topologies the stream joins.
	Upstream, Downstream string
	Reason               string
}

func (e *RepartitionError) Error() string {
	return fmt.Sprintf("repartition stream %s (from %s to %s): %s; what it held is lost and no checkpoint can regenerate it: "+
		"start the job with --restore none to reprocess its input from the first message (outputs already published are skipped), "+
		"or restore the NATS server's data from a backup taken with the checkpoints", e.Stream, e.Upstream, e.Downstream, e.Reason)
}

// repartitionStreamConfig is a repartition stream's: file-backed, taking
// fast-batch publishes.
func repartitionStreamConfig(stream, subject string, replicas int) jetstream.StreamConfig {
	return jetstream.StreamConfig{Name: stream, Subjects: []string{subject + ".>"}, Storage: jetstream.FileStorage, AllowBatchPublish: true, Replicas: replicas}
}

// prepareRepartitionStreams checks each repartition stream against the
// checkpoints its sub-topologies restored, and creates the missing ones
// when none of them restored anything (a first start, or --restore none).
// It runs before any engine does, so a refusal leaves everything as it was.
func prepareRepartitionStreams(ctx context.Context, js jetstream.JetStream, j *job.Job, subs []job.SubTopology, all []*Running, restoreSpec string, log *slog.Logger) error {
	for k := range subs {
		ws := writers(j, subs, k)
		if len(ws) == 0 {
			continue
		}
		stream, subject := RepartitionStream(j.Name, k)
		// In a group, a member runs some sub-topologies; a side run
		// elsewhere (nil here) is checked by the member that runs it, and
		// what it restored is unknown here, so the checks that need every
		// side's (a reset, "nothing restored anywhere") are left out.
		down := all[k]
		var ups []*Running
		partial := down == nil
		for _, w := range ws {
			ups = append(ups, all[w.sub])
			partial = partial || all[w.sub] == nil
		}
		if down == nil && !slices.ContainsFunc(ups, func(u *Running) bool { return u != nil }) {
			continue
		}
		var restoredUp *Running // a writer that restored a checkpoint
		for _, up := range ups {
			if up != nil && up.Restored != nil {
				restoredUp = up
				break
			}
		}
		downName := subName(j, k)
		refuse := func(up *Running, format string, args ...any) error {
			upName := subName(j, ws[0].sub)
			if up != nil {
				upName = up.Job.Name
			}
			return &RepartitionError{Stream: stream, Upstream: upName, Downstream: downName, Reason: fmt.Sprintf(format, args...)}
		}
		st, err := js.Stream(ctx, stream)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			switch {
			case down != nil && down.Restored != nil && down.Restored.Origin != nil && down.Restored.Origin.NewInput:
				// A new sub-topology (a stage split off behind this stream)
				// seeded with `cairn state migrate --into`: it reads the
				// stream from its first message, and nothing before it was
				// ever meant for it.
				log.Info("repartition stream created for a new sub-topology", "stream", stream, "sub_topology", down.Job.Name, "savepoint", down.Restored.Savepoint)
			case restoredUp != nil:
				return refuse(restoredUp, "it does not exist, but %s restored checkpoint %d, which published into it", restoredUp.Job.Name, restoredUp.Restored.ID)
			case down != nil && down.Restored != nil:
				return refuse(ups[0], "it does not exist, but %s restored checkpoint %d, which read it through sequence %d", down.Job.Name, down.Restored.ID, down.Restored.SourceSeq)
			}
			_, err = engine.CreateStream(ctx, js, repartitionStreamConfig(stream, subject, inputReplicas(ctx, js, j)), log)
			if err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
				return fmt.Errorf("create repartition stream %s: %w", stream, err)
			}
			continue
		}
		if err != nil {
			return fmt.Errorf("repartition stream %s: %w", stream, err)
		}
		info := st.CachedInfo() // as of the lookup just made
		first, last := info.State.FirstSeq, info.State.LastSeq
		// Every upstream checkpoint publishes a marker on every key group
		// before it commits, so a restored upstream means a stream that has
		// held messages ...
		if restoredUp != nil && last == 0 {
			return refuse(restoredUp, "it has never held a message, but %s restored checkpoint %d, which published into it", restoredUp.Job.Name, restoredUp.Restored.ID)
		}
		for n, up := range ups {
			if up == nil || up.Restored == nil {
				continue
			}
			// ... and one on every key group of its subjects: its last
			// message there is where the restored upstream learns which
			// outputs the stream holds.
			filter := ws[n].subject + ".>"
			info, err := st.Info(ctx, jetstream.WithSubjectFilter(filter))
			if err != nil {
				return fmt.Errorf("repartition stream %s: %w", stream, err)
			}
			got := 0
			for subj := range info.State.Subjects {
				if !engine.IsFenceSubject(subj) { // a group member's claim, not a key group
					got++
				}
			}
			if got < up.Job.KeyGroups {
				return refuse(up, "%d of the %d key group subjects of %s (side %d) hold no message, but %s restored checkpoint %d, which published a marker on each (the stream was purged outside cairn)",
					up.Job.KeyGroups-got, up.Job.KeyGroups, filter, n, up.Job.Name, up.Restored.ID)
			}
		}
		if down != nil && down.Restored != nil {
			d := down.Restored
			if last < d.SourceSeq {
				return refuse(ups[0], "its last sequence is %d, but %s restored checkpoint %d, which read it through sequence %d (the stream was deleted and created again)", last, down.Job.Name, d.ID, d.SourceSeq)
			}
			if first > d.SourceSeq+1 {
				return refuse(ups[0], "it starts at sequence %d, but %s restored checkpoint %d, which reads on from sequence %d (messages %d-%d were removed)", first, down.Job.Name, d.ID, d.SourceSeq+1, d.SourceSeq+1, first-1)
			}
		} else if partial {
			// The rest needs every side's restore: the members running
			// them check their own.
		} else if restoredUp != nil && first > 1 {
			return refuse(restoredUp, "it starts at sequence %d, but %s restored no checkpoint and reads it from sequence 1", first, down.Job.Name)
		} else if restoredUp == nil && first <= 1 && restoreSpec != "none" {
			// Nothing restored anywhere because no checkpoint committed yet
			// (or none is configured): the stream is kept. The writers
			// replay their inputs from the first message and skip what it
			// holds, index by index, and the reader reads it from sequence
			// 1 in the order it was written, so a reader whose outputs
			// depend on the interleaving of its writers (a join's two
			// sides) replays exactly what it published before.
			if info.State.Msgs > 0 {
				log.Info("repartition stream kept: no sub-topology restored a checkpoint, so they replay from the first message and skip what it holds", "stream", stream, "messages", info.State.Msgs)
			}
		} else if restoredUp == nil && restoreSpec != "none" {
			// first > 1: purged, which cairn does only below what
			// committed checkpoints no longer need; yet no sub-topology
			// restored one. A reset here would start the graph over
			// silently.
			return refuse(ups[0], "it starts at sequence %d (purged after checkpoints were committed), but no sub-topology restored a checkpoint: the checkpoint store holds none of this job (a wrong or new store?); point the job at the store that holds them", first)
		} else if restoredUp == nil && (info.State.Msgs > 0 || first > 1) {
			// A fresh start of every side (--restore none): the upstreams
			// publish everything again, so the stream starts over, as Kafka
			// Streams' reset tool deletes a reset application's internal
			// topics. Deleted and created, not purged: its sequences
			// start at 1 again, so "a downstream that restored nothing
			// reads from sequence 1" keeps telling a reset from a loss.
			if err := js.DeleteStream(ctx, stream); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
				return fmt.Errorf("repartition stream %s: reset for a fresh start: %w", stream, err)
			}
			if _, err := engine.CreateStream(ctx, js, repartitionStreamConfig(stream, subject, inputReplicas(ctx, js, j)), log); err != nil {
				return fmt.Errorf("repartition stream %s: reset for a fresh start: %w", stream, err)
			}
			log.Info("repartition stream reset: no sub-topology writing it restored a checkpoint, so they publish everything again", "stream", stream, "messages", info.State.Msgs)
		}
	}
	return nil
}

// SubTopologies returns every sub-topology of the job, in order: r itself
// (the first), then its Downstream. A job that is one chain has one.
func (r *Running) SubTopologies() []*Running {
	return append([]*Running{r}, r.Downstream...)
}

// RunEngine runs the engine, with an online restore's download beside it.
func (r *Running) RunEngine(ctx context.Context) error {
	if r.online == nil {
		return r.Engine.Run(ctx)
	}
	dctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go r.online.Run(dctx, r.Engine)
	err := r.Engine.Run(ctx)
	if files, _ := r.online.Result().Remote.Remaining(); files > 0 && state.IsStoredCorruption(err) {
		r.online.MarkFailed(err) // a corrupt block read while processing
	}
	return err
}

// runAll runs every sub-topology's engine until ctx ends (a graceful stop:
// each takes its final checkpoint) or one fails (the others then stop
// gracefully too). Run bounds it; failed is closed when one fails.
func (r *Running) runAll(ctx context.Context, failed func(error)) error {
	if len(r.Downstream) == 0 {
		return r.RunEngine(ctx)
	}
	all := r.SubTopologies()
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make([]error, len(all))
	done := make(chan int, len(all))
	for i, s := range all {
		go func() {
			errs[i] = s.runGated(rctx)
			if errs[i] != nil {
				failed(fmt.Errorf("sub-topology %s: %w", s.Job.Name, errs[i]))
				cancel()
			}
			done <- i
		}()
	}
	for range all {
		<-done
	}
	for i, err := range errs {
		if err != nil {
			errs[i] = fmt.Errorf("sub-topology %s: %w", all[i].Job.Name, err)
		}
	}
	return errors.Join(errs...)
}
