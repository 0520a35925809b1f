package engine

// Fencing every publish of a writer that holds an epoch (Config.FenceEpoch,
// a group member's ownership of a sub-topology): see docs/RATIONALE.md,
// "Fencing every publish: a sampled check and the epoch on every output".
//
//   - At start the writer claims each output stream: it appends a claim
//     carrying its epoch on <subject>.fence.claim, expecting that subject's
//     last claim it read, unless that claim holds a higher epoch (then it is
//     the stale one: ErrFenced). Then it writes a marker on every slot's
//     marker subject, <subject>.fence.<slot>: its own slots' and any an
//     earlier writer with more slots used, each marker expecting its claim
//     is still the last, and closes the claim with a last message on the
//     claim subject.
//   - Every output and marker of a fast batch carries the epoch (Cairn-Epoch).
//   - A slot's fast batch checks its slot's marker (it expects it as the
//     last message of the marker subject) on the batch's first message,
//     and again once a message after the previous check is acknowledged
//     and fenceEvery messages have passed (fenceCheck.due). A newer writer's marker makes
//     the server refuse that message and, the batch failing on a gap,
//     every later one of the batch: the stale writer stops with ErrFenced.
//
// A check only once a later message is acknowledged: a clustered stream
// refuses an expectation on a subject while an earlier one on it is still
// being applied (and acknowledges a message before that is cleared), and
// applies a stream's messages in order, so a later message's
// acknowledgement says the earlier check is done.
//
// Nothing is ever removed from the fence subjects (a removal would leave a
// gap in the stream's sequences that readers take for lost messages): a
// claim adds one message per slot subject. Readers never take a fence
// message for a record (the pipeline and the read of the last outputs skip
// HeaderFence), and a repartition stream's purge keeps them (its filter
// takes one token after the subject).

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

const (
	// HeaderEpoch is the epoch of the writer of an output (or a claim) on
	// a fenced stream: a reader may drop a message whose epoch is below
	// the highest it saw on its subject.
	HeaderEpoch = "Cairn-Epoch"
	// HeaderFence marks a writer's claim of a stream's fence subject: no
	// record, never an output.
	HeaderFence = "Cairn-Fence"
)

// fenceEvery is the fewest messages between two fence checks of a fast
// batch: a check also waits for the previous one to be acknowledged (a
// clustered stream refuses an expectation on a subject whose previous one
// is not yet applied).
const fenceEvery = 32

// ErrFenced is a publish refused because a newer writer claimed the
// stream: the key groups this engine writes belong to another owner now
// (a group member that lost its lease). Not a fault of the job: the
// writer stops and waits for what its group decides.
var ErrFenced = errors.New("engine: fenced: a newer writer holds the output stream")

// ErrFenceSubjects is a fenced writer's output stream that cannot hold its
// claim and markers (a stream made outside cairn with narrower subjects).
var ErrFenceSubjects = errors.New("engine: the output stream does not take the fence subjects")

// FenceSubjects is the filter of a writer's fence subjects under target
// subject prefix: two tokens and more below its key groups' subjects
// (prefix.<kg>), so a purge of prefix.* leaves them.
func FenceSubjects(prefix string) string { return prefix + ".fence.>" }

// IsFenceSubject reports whether subject is a writer's fence subject.
func IsFenceSubject(subject string) bool { return strings.Contains(subject, ".fence.") }

func claimSubject(prefix string) string { return prefix + ".fence.claim" }

func markerSubject(prefix string, slot int) string {
	return prefix + ".fence." + strconv.Itoa(slot)
}

// fenceRefused reports the server's answer to a failed expectation of the
// last sequence (on a key group's subject, or on the fence subject).
func fenceRefused(err error) bool {
	var ae *jetstream.APIError
	return errors.As(err, &ae) && ae.ErrorCode == fenceErrCode
}

// fenceBusy reports a clustered stream's refusal of an expectation on a
// subject whose earlier one it is still applying (an earlier writer's
// check of a marker subject a claim writes): try again.
func fenceBusy(err error) bool {
	var ae *jetstream.APIError
	return errors.As(err, &ae) && ae.ErrorCode == 10164
}

// asFenced names a refused expectation ErrFenced; other errors pass.
func asFenced(stream string, err error) error {
	if err == nil || errors.Is(err, ErrFenced) || !fenceRefused(err) {
		return err
	}
	return fmt.Errorf("%w (stream %s): %w", ErrFenced, stream, err)
}

// claimDecision decides a claim of a fence subject by a writer of epoch
// mine, given the subject's last claim (held: its epoch; none when the
// subject is empty): the sequence to expect, or ErrFenced when a newer
// writer holds it. An equal epoch is this writer's own earlier start.
func claimDecision(mine uint64, last *jetstream.RawStreamMsg) (expect uint64, err error) {
	if last == nil {
		return 0, nil
	}
	v := last.Header.Get(HeaderEpoch)
	held, perr := strconv.ParseUint(v, 10, 64)
	if perr != nil {
		return 0, fmt.Errorf("engine: fence subject %s seq %d: header %s=%q is not an epoch", last.Subject, last.Sequence, HeaderEpoch, v)
	}
	if held > mine {
		return 0, fmt.Errorf("%w: %s holds epoch %d since seq %d, this writer's is %d", ErrFenced, last.Subject, held, last.Sequence, mine)
	}
	return last.Sequence, nil
}

// claimFence makes epoch the holder of a stream's target subject prefix,
// with one marker per slot, and returns the markers' sequences, which the
// slots' checks expect from then on. A concurrent claim makes an
// expectation fail: the claim starts over.
func claimFence(ctx context.Context, js jetstream.JetStream, stream, prefix string, epoch uint64, slots int) ([]uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, publishTimeout)
	defer cancel()
	claimSubj := claimSubject(prefix)
	ep := strconv.FormatUint(epoch, 10)
	for attempt := 1; ; attempt++ {
		marks, err := claimOnce(ctx, js, stream, prefix, claimSubj, ep, epoch, slots)
		if err == nil || !fenceRefused(err) && !fenceBusy(err) || attempt >= 5 {
			if err != nil && !errors.Is(err, ErrFenced) {
				err = fmt.Errorf("engine: claim %s for epoch %d: %w", claimSubj, epoch, err)
			}
			return marks, err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("engine: claim %s: %w", claimSubj, ctx.Err())
		case <-time.After(time.Duration(attempt) * 50 * time.Millisecond):
		}
	}
}

func claimOnce(ctx context.Context, js jetstream.JetStream, stream, prefix, claimSubj, ep string, epoch uint64, slots int) ([]uint64, error) {
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return nil, err
	}
	// The claim and the markers are messages of the stream: a stream made
	// outside cairn must take them (subject.>, as cairn makes them).
	subjects := st.CachedInfo().Config.Subjects
	for _, subj := range []string{claimSubj, markerSubject(prefix, 0)} {
		if !anyMatches(subjects, subj) {
			return nil, fmt.Errorf("%w: stream %s takes %v, not %s: a group member's output stream must take %s.>", ErrFenceSubjects, stream, subjects, subj, prefix)
		}
	}
	last, err := st.GetLastMsgForSubject(ctx, claimSubj)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		last, err = nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the last claim: %w", err)
	}
	expect, err := claimDecision(epoch, last)
	if err != nil {
		return nil, err
	}
	ack, err := js.PublishMsg(ctx, &nats.Msg{Subject: claimSubj, Header: nats.Header{
		HeaderFence:                         {"claim"},
		HeaderEpoch:                         {ep},
		jetstream.ExpectedLastSubjSeqHeader: {strconv.FormatUint(expect, 10)},
	}})
	if err != nil {
		return nil, err
	}
	claim := strconv.FormatUint(ack.Sequence, 10)
	// Every marker subject a writer used, its own slots' first.
	subjects = make([]string, slots)
	for i := range subjects {
		subjects[i] = markerSubject(prefix, i)
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(FenceSubjects(prefix)))
	if err != nil {
		return nil, fmt.Errorf("list the marker subjects: %w", err)
	}
	var earlier []string
	for subj := range info.State.Subjects {
		if subj != claimSubj && !slices.Contains(subjects, subj) {
			earlier = append(earlier, subj)
		}
	}
	slices.Sort(earlier)
	marks := make([]uint64, slots)
	for i, subj := range append(subjects, earlier...) {
		// Each marker holds only while the claim is the last: a newer
		// claim meanwhile refuses it (and the claim is read again). A
		// marker on a subject an earlier writer's slot checks revokes it.
		mack, err := js.PublishMsg(ctx, &nats.Msg{Subject: subj, Header: nats.Header{
			HeaderFence:                             {"marker"},
			HeaderEpoch:                             {ep},
			jetstream.ExpectedLastSubjSeqHeader:     {claim},
			jetstream.ExpectedLastSubjSeqSubjHeader: {claimSubj},
		}})
		if err != nil {
			return nil, err
		}
		if i < slots {
			marks[i] = mack.Sequence
		}
	}
	// The claim's last message, on the claim subject: once it is
	// acknowledged, the server has applied every marker, so a slot's
	// first check cannot meet one still in process (fenceCheck.due).
	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: claimSubj, Header: nats.Header{
		HeaderFence:                         {"claimed"},
		HeaderEpoch:                         {ep},
		jetstream.ExpectedLastSubjSeqHeader: {claim},
	}}); err != nil {
		return nil, err
	}
	return marks, nil
}

// fenceCheck is a sink's part of the fence: the marker its checks expect
// and the pacing of the checks within the open fast batch.
type fenceCheck struct {
	subject string // the slot's marker subject ("": the sink is not fenced)
	seq     string // the marker's sequence, as the header's value
	epoch   string // Cairn-Epoch of every message
}

// due reports whether the next message of a batch (n messages added, the
// last check at batch sequence checked, 0 none yet, acknowledged through
// acked: the server acknowledges a batch message once it applied it, the
// first one's answer excepted) checks the marker.
//
// The first message does when firstSafe: the batch before it is committed
// (a batch opens once the one before is stored), and so is every check of
// it that a later message followed. Else the first check waits for the
// batch's first message to be acknowledged. After a check, the next waits
// for a message after it to be acknowledged and fenceEvery messages to
// pass.
func (f *fenceCheck) due(n, checked, acked uint64, firstSafe bool) bool {
	switch {
	case f.subject == "":
		return false
	case n == 0:
		return firstSafe
	case checked == 0:
		return acked >= 1
	}
	return n+1-checked >= fenceEvery && acked > checked
}

// setFence makes the sink a fenced writer (f.subject not empty): every
// message carries the epoch, and fast batches check the marker.
func (s *sink) setFence(f fenceCheck) {
	s.fence = f
	if f.subject != "" {
		s.hdr[HeaderEpoch] = []string{f.epoch}
	}
}

// set adds the check's expectation to h.
func (f *fenceCheck) set(h nats.Header) {
	h[jetstream.ExpectedLastSubjSeqHeader] = []string{f.seq}
	h[jetstream.ExpectedLastSubjSeqSubjHeader] = []string{f.subject}
}
