package runtime

import (
	"cairn/engine"
	"cairn/internal/app/job"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// ErrInputGap stops a job whose input stream lost records it had not read
// yet: purged, or removed by the stream's limits (max_age, max_msgs,
// max_bytes). Going on would leave them out of every output silently.
var ErrInputGap = errors.New("runtime: records of the input stream are gone before the job read them")

// ErrInputDeleted stops a job whose input stream was deleted (or deleted
// and created again: its sequences started over).
var ErrInputDeleted = errors.New("runtime: the input stream the job reads was deleted")

// inputCheckEvery is how often a running job checks its input streams:
// one stream info request per input, a few seconds apart, costs nothing
// beside the records.
const inputCheckEvery = 5 * time.Second

// checkInputs checks every sub-topology's input stream against the
// position the job reads on from: at start the restored checkpoint's, then
// the last sequence read. A server that does not answer is not an error
// here (the connection's own bound covers it).
func (r *Running) checkInputs(ctx context.Context, atStart bool) error {
	if r.NC == nil {
		return nil
	}
	js, err := jetstream.New(r.NC)
	if err != nil {
		return nil
	}
	for _, s := range r.SubTopologies() {
		if err := s.checkInput(ctx, js, atStart); err != nil {
			return err
		}
	}
	return nil
}

// watchInputs checks the inputs every inputCheckEvery until ctx ends and
// stops the job (fail) on the first deleted or lost input.
func (r *Running) watchInputs(ctx context.Context, fail func(error)) {
	t := time.NewTicker(inputCheckEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := r.checkInputs(ctx, false); err != nil {
			fail(err)
			return
		}
	}
}

// checkInput checks this sub-topology's input stream. A table (a KV
// bucket keeps only the latest entries by design), a generated input and
// a repartition stream (cairn purges it, and checks it at start:
// RepartitionError) are not checked.
func (r *Running) checkInput(ctx context.Context, js jetstream.JetStream, atStart bool) error {
	in := r.Job.Input
	stream := in.Stream
	if stream == "" || in.Table != "" || in.Nexmark != nil || strings.HasPrefix(stream, "CAIRN_RP_") || r.Engine == nil {
		return nil
	}
	// read is the last sequence the job read (0: none yet).
	read := r.StartSeq - 1
	what := "the job read it through sequence"
	if r.Restored != nil {
		what = fmt.Sprintf("checkpoint %d read it through sequence", r.Restored.ID)
	}
	if !atStart {
		if c := r.Engine.ConsumedSeq(); c > read {
			read, what = c, "the job read it through sequence"
		}
	}
	if read == 0 {
		return nil
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	st, err := js.Stream(cctx, stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("%w: input stream %s does not exist, but %s %d (job %s). The records after it are gone: to start over on purpose, create the stream, and run with --restore none and a new or purged output stream (the outputs already there would make the new ones be skipped)",
			ErrInputDeleted, stream, what, read, r.Job.Name)
	}
	if err != nil {
		return nil
	}
	info := st.CachedInfo()
	first, last := info.State.FirstSeq, info.State.LastSeq
	if last < read {
		return fmt.Errorf("%w: input stream %s ends at sequence %d, but %s %d (job %s): it was deleted and created again. To start over on purpose: --restore none and a new or purged output stream (the outputs already there would make the new ones be skipped)",
			ErrInputDeleted, stream, last, what, read, r.Job.Name)
	}
	if first <= read+1 {
		return nil
	}
	// While running, what the job read lags what its consumer already
	// holds: up to four batches pulled ahead of the pipeline, and the
	// batch being formed. A limit (max_age, max_msgs) that removes those
	// from the stream loses nothing, so only a first sequence past that
	// window is a gap.
	if !atStart && first <= read+1+uint64(5*batchSize(r.Job)) {
		return nil
	}
	// Sequences the job has not read are gone. For an input that reads
	// only some of the stream's subjects they may be other subjects'
	// messages, which the job would have skipped anyway: that is said,
	// not stopped for.
	gone := fmt.Sprintf("input stream %s starts at sequence %d, but %s %d (job %s): messages %d-%d were removed (purged, or by the stream's limits: max_age, max_msgs, max_bytes) before the job read them",
		stream, first, what, read, r.Job.Name, read+1, first-1)
	if r.allowInputGap {
		r.log.Warn("input gap: going on from the stream's first message (--allow-input-gap); the outputs lack what those records would have made", "detail", gone)
		return nil
	}
	if !engine.ReadsWholeStream(in.Subjects, info.Config.Subjects) {
		if atStart {
			r.log.Warn("input gap, or other subjects' messages removed: the job reads only some of the stream's subjects, so it cannot tell; it goes on", "detail", gone)
		}
		return nil
	}
	return fmt.Errorf("%w: %s. To go on without them: --allow-input-gap (the job reads on from sequence %d); to start over: --restore none", ErrInputGap, gone, first)
}

// batchSize is the job's pipeline batch (the engine's default when unset).
func batchSize(j *job.Job) int {
	if j.BatchSize > 0 {
		return j.BatchSize
	}
	return engine.DefaultBatchSize
}
