package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"cairn/checkpoint"
	"cairn/engine"
	"cairn/internal/app/job"
)

// subPos is a sub-topology's place in its job graph: k of n.
type subPos struct{ k, n int }

// A job graph runs as one engine per sub-topology (job.SubTopologies), in
// one process, joined by repartition streams that cairn creates and owns:
// sub-topology k-1 writes stream k exactly_once, partitioned by its key
// groups and carrying its watermark; sub-topology k reads it like an input
// and keeps its position in its own checkpoints. Each sub-topology after
// the first has its own name (<job>.s<k>: checkpoints under that prefix,
// its ticks), data directory (<data_dir>/s<k>) and checkpoint chain.

// subName is the name of sub-topology k (the job's own for the first). A
// '.' cannot be in a job name, so it never collides with another job's.
func subName(j *job.Job, k int) string {
	if k == 0 {
		return j.Name
	}
	return j.Name + ".s" + strconv.Itoa(k)
}

// RepartitionStream is the stream between sub-topologies k-1 and k of a job,
// and the subject prefix of its key groups.
func RepartitionStream(jobName string, k int) (stream, subject string) {
	return "CAIRN_RP_" + strings.ToUpper(jobName) + "_" + strconv.Itoa(k), "cairn.rp." + jobName + "." + strconv.Itoa(k)
}

// subJob is the job of sub-topology k: its stages, its input (the job's, or
// repartition stream k), its output (repartition stream k+1, or the
// job's), its name and data directory.
func subJob(j *job.Job, subs [][]job.Stage, k int) *job.Job {
	c := *j
	c.Name = subName(j, k)
	c.Stages = subs[k]
	if last := subs[k][len(subs[k])-1]; last.Keyed && last.Slots > 0 {
		c.Slots = last.Slots
	}
	if k > 0 {
		stream, subject := RepartitionStream(j.Name, k)
		c.Input = job.Input{Stream: stream, Subjects: []string{subject + ".>"}}
		c.DataDir = filepath.Join(j.DataDir, "s"+strconv.Itoa(k))
	}
	if k < len(subs)-1 {
		stream, subject := RepartitionStream(j.Name, k+1)
		c.Output = job.Output{Stream: stream, Subject: subject, Delivery: "exactly_once", Publish: j.Output.Publish}
	}
	if j.Checkpoint != nil {
		cp := *j.Checkpoint
		c.Checkpoint = &cp
	}
	return &c
}

// startGraph starts every sub-topology of a job graph; the first Running
// holds the others in Downstream.
func startGraph(ctx context.Context, j *job.Job, subs [][]job.Stage, ro RunOptions, log *slog.Logger) (*Running, error) {
	if ro.Broker != nil {
		return nil, errors.New("a job graph (a keyed stage after another) runs on NATS only; cairn test runs one sub-topology at a time")
	}
	if spec := ro.Restore; spec != "" && spec != "latest" && spec != "none" && !strings.HasPrefix(spec, "savepoint:") {
		return nil, fmt.Errorf("--restore %s: a job graph restores each sub-topology's latest checkpoint, its savepoint:NAME, or none; a checkpoint id names one sub-topology's", spec)
	}
	var first *Running
	for k := range subs {
		r, err := startSub(ctx, subJob(j, subs, k), ro, log, first, subPos{k: k, n: len(subs)})
		if err != nil {
			if first != nil {
				first.Close()
			}
			return nil, fmt.Errorf("sub-topology %d (%s): %w", k, subName(j, k), err)
		}
		if first == nil {
			first = r
			continue
		}
		first.Downstream = append(first.Downstream, r)
	}
	all := first.SubTopologies()
	js, err := jetstream.New(first.NC)
	if err == nil {
		err = prepareRepartitionStreams(ctx, js, j, all, log)
	}
	if err != nil {
		first.Close()
		return nil, err
	}
	for k := 1; k < len(all); k++ {
		up, down := all[k-1].committer, all[k].committer
		if up == nil || down == nil {
			continue // no checkpoints: nothing decides what may go
		}
		stream, _ := RepartitionStream(j.Name, k)
		e := &edge{js: js, stream: stream, retain: max(all[k].Job.Checkpoint.Retain, 1), log: log}
		if e.pin, err = savepointPin(ctx, all[k]); err != nil {
			first.Close()
			return nil, err
		}
		up.afterCommit, down.afterCommit = e.upstreamCommitted, e.downstreamCommitted
	}
	log.Info("job graph", "job", j.Name, "sub_topologies", len(subs))
	return first, nil
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
type edge struct {
	js     jetstream.JetStream
	stream string
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
	// pin is the least input position of the downstream's savepoints at
	// start, +1 (0: none): nothing at or after it is purged. A savepoint
	// taken later has a position above every retained checkpoint's.
	pin uint64
}

// savepointPin is the position + 1 of the downstream's oldest savepoint
// (0 when it has none).
func savepointPin(ctx context.Context, down *Running) (uint64, error) {
	if down.Store == nil {
		return 0, nil
	}
	sps, err := checkpoint.ListSavepointInfo(ctx, down.Store, down.Job.Name)
	if err != nil {
		return 0, fmt.Errorf("%s: savepoints: %w", down.Job.Name, err)
	}
	var pin uint64
	for _, sp := range sps {
		if sp.Corrupt != "" {
			continue
		}
		if pin == 0 || sp.SourceSeq+1 < pin {
			pin = sp.SourceSeq + 1
		}
	}
	return pin, nil
}

func (e *edge) upstreamCommitted(ctx context.Context, _ engine.Barrier) {
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
	if cutoff <= e.purged+1 {
		e.mu.Unlock()
		return
	}
	e.purged = cutoff
	e.mu.Unlock()
	st, err := e.js.Stream(ctx, e.stream)
	if err == nil {
		err = st.Purge(ctx, jetstream.WithPurgeSequence(cutoff))
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
func repartitionStreamConfig(stream, subject string) jetstream.StreamConfig {
	return jetstream.StreamConfig{Name: stream, Subjects: []string{subject + ".>"}, Storage: jetstream.FileStorage, AllowBatchPublish: true}
}

// prepareRepartitionStreams checks each repartition stream against the
// checkpoints its two sub-topologies restored, and creates the missing ones
// when neither restored anything (a first start, or --restore none). It
// runs before any engine does, so a refusal leaves everything as it was.
func prepareRepartitionStreams(ctx context.Context, js jetstream.JetStream, j *job.Job, all []*Running, log *slog.Logger) error {
	for k := 1; k < len(all); k++ {
		stream, subject := RepartitionStream(j.Name, k)
		up, down := all[k-1], all[k]
		refuse := func(format string, args ...any) error {
			return &RepartitionError{Stream: stream, Upstream: up.Job.Name, Downstream: down.Job.Name, Reason: fmt.Sprintf(format, args...)}
		}
		st, err := js.Stream(ctx, stream)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			switch {
			case up.Restored != nil:
				return refuse("it does not exist, but %s restored checkpoint %d, which published into it", up.Job.Name, up.Restored.ID)
			case down.Restored != nil:
				return refuse("it does not exist, but %s restored checkpoint %d, which read it through sequence %d", down.Job.Name, down.Restored.ID, down.Restored.SourceSeq)
			}
			_, err = js.CreateStream(ctx, repartitionStreamConfig(stream, subject))
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
		// held messages.
		if up.Restored != nil && last == 0 {
			return refuse("it has never held a message, but %s restored checkpoint %d, which published into it", up.Job.Name, up.Restored.ID)
		}
		if up.Restored != nil {
			// ... and one on every key group: its last message is where
			// the restored upstream learns which outputs the stream holds.
			info, err := st.Info(ctx, jetstream.WithSubjectFilter(subject+".>"))
			if err != nil {
				return fmt.Errorf("repartition stream %s: %w", stream, err)
			}
			if n := len(info.State.Subjects); n < up.Job.KeyGroups {
				return refuse("%d of its %d key group subjects hold no message, but %s restored checkpoint %d, which published a marker on each (the stream was purged outside cairn)", up.Job.KeyGroups-n, up.Job.KeyGroups, up.Job.Name, up.Restored.ID)
			}
		}
		if d := down.Restored; d != nil {
			if last < d.SourceSeq {
				return refuse("its last sequence is %d, but %s restored checkpoint %d, which read it through sequence %d (the stream was deleted and created again)", last, down.Job.Name, d.ID, d.SourceSeq)
			}
			if first > d.SourceSeq+1 {
				return refuse("it starts at sequence %d, but %s restored checkpoint %d, which reads on from sequence %d (messages %d-%d were removed)", first, down.Job.Name, d.ID, d.SourceSeq+1, d.SourceSeq+1, first-1)
			}
		} else if up.Restored != nil && first > 1 {
			return refuse("it starts at sequence %d, but %s restored no checkpoint and reads it from sequence 1", first, down.Job.Name)
		} else if up.Restored == nil && (info.State.Msgs > 0 || first > 1) {
			// A fresh start of both sides (--restore none, no checkpoint
			// committed yet, or none configured): the upstream publishes
			// everything again, so the stream starts over, as Kafka
			// Streams' reset tool deletes a reset application's internal
			// topics. Deleted and created, not purged: its sequences
			// start at 1 again, so "a downstream that restored nothing
			// reads from sequence 1" keeps telling a reset from a loss.
			if err := js.DeleteStream(ctx, stream); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
				return fmt.Errorf("repartition stream %s: reset for a fresh start: %w", stream, err)
			}
			if _, err := js.CreateStream(ctx, repartitionStreamConfig(stream, subject)); err != nil {
				return fmt.Errorf("repartition stream %s: reset for a fresh start: %w", stream, err)
			}
			log.Info("repartition stream reset: neither sub-topology restored a checkpoint, so the upstream publishes everything again", "stream", stream, "messages", info.State.Msgs)
		}
	}
	return nil
}

// SubTopologies returns every sub-topology of the job, in order: r itself
// (the first), then its Downstream. A job that is one chain has one.
func (r *Running) SubTopologies() []*Running {
	return append([]*Running{r}, r.Downstream...)
}

// runEngine runs the engine, with an online restore's download beside it.
func (r *Running) runEngine(ctx context.Context) error {
	if r.online == nil {
		return r.Engine.Run(ctx)
	}
	dctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go r.online.run(dctx, r.Engine)
	return r.Engine.Run(ctx)
}

// Run runs every sub-topology's engine until ctx ends (a graceful stop:
// each takes its final checkpoint) or one fails (the others then stop
// gracefully too).
func (r *Running) Run(ctx context.Context) error {
	if len(r.Downstream) == 0 {
		return r.runEngine(ctx)
	}
	all := r.SubTopologies()
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make([]error, len(all))
	done := make(chan int, len(all))
	for i, s := range all {
		go func() {
			errs[i] = s.runEngine(rctx)
			if errs[i] != nil {
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
