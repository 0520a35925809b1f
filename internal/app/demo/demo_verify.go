package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/nats-io/nats.go/jetstream"

	"cairn/engine"
	"cairn/internal/base/datadir"
	"cairn/state"
)

// verifier is the demo's exactly-once check, kept as the demo runs and across
// any number of kills of the job or of the demo itself. It reads the input
// stream and counts the words split would emit (the model), and reads the
// output stream and checks every output as it comes: per key group the
// Cairn-Out indexes 1, 2, 3 ... without gap or repeat, per key the counts
// 1, 2, 3 ..., each output on its key's key group. Its state is saved in the
// data directory with the stream positions it covers, and the demo purges
// the streams only behind the saved positions; so it never needs the whole
// history, which retention removes.
type verifier struct {
	saveMu sync.Mutex
	path   string

	mu struct {
		sync.Mutex
		st verifyState
	}
}

// verifyState is the saved form (verify.json).
type verifyState struct {
	// Input is the last input stream sequence counted; Output the last
	// output stream sequence checked.
	Input, Output uint64
	// Expected is each word's count in the input; Words their sum.
	Expected map[string]uint64
	Words    uint64
	// NextOut is each output subject's last Cairn-Out; Last each key's last
	// count; Outputs the outputs checked.
	NextOut map[string]uint64
	Last    map[string]uint64
	Outputs uint64
	// Violation is the first broken rule, "" while none.
	Violation string `json:",omitempty"`
}

// verifyPos is a pair of stream positions the verifier has covered.
type verifyPos struct{ Input, Output uint64 }

func newVerifier(dataDir string) (*verifier, error) {
	v := &verifier{path: filepath.Join(dataDir, "verify.json")}
	st := verifyState{Expected: map[string]uint64{}, NextOut: map[string]uint64{}, Last: map[string]uint64{}}
	b, err := os.ReadFile(v.path)
	switch {
	case err == nil:
		if err := json.Unmarshal(b, &st); err != nil {
			return nil, fmt.Errorf("demo: %s: %w (remove it, or start with a new --data directory)", v.path, err)
		}
	case !errors.Is(err, os.ErrNotExist):
		return nil, err
	}
	v.mu.st = st
	return v, nil
}

// save writes the state atomically and returns the positions it covers.
func (v *verifier) save() (verifyPos, error) {
	// One save at a time (the housekeeper's and the final one): both
	// write the same temporary file, and a later state must not be
	// overwritten by an earlier one.
	v.saveMu.Lock()
	defer v.saveMu.Unlock()
	v.mu.Lock()
	b, err := json.Marshal(v.mu.st)
	pos := verifyPos{v.mu.st.Input, v.mu.st.Output}
	v.mu.Unlock()
	if err != nil {
		return pos, err
	}
	return pos, datadir.WriteFileAtomic(v.path, b)
}

func (v *verifier) pos() verifyPos {
	v.mu.Lock()
	defer v.mu.Unlock()
	return verifyPos{v.mu.st.Input, v.mu.st.Output}
}

func (v *verifier) violation() string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.mu.st.Violation
}

func (v *verifier) violateLocked(format string, args ...any) {
	if v.mu.st.Violation == "" {
		v.mu.st.Violation = fmt.Sprintf(format, args...)
	}
}

// splitWords is what builtin:split emits for a line: the whitespace-separated
// fields in lower case, with everything but letters and digits removed.
func splitWords(line []byte, emit func(string)) {
	var w strings.Builder
	for _, f := range bytes.Fields(line) {
		w.Reset()
		for _, r := range string(f) {
			if unicode.IsLetter(r) || unicode.IsDigit(r) {
				w.WriteRune(unicode.ToLower(r))
			}
		}
		if w.Len() > 0 {
			emit(w.String())
		}
	}
}

// follow reads stream from the position after the verifier's and hands each
// message to fn with the lock held, until ctx ends.
func (v *verifier) follow(ctx context.Context, js jetstream.JetStream, stream string, from func() uint64, fn func(m jetstream.Msg, seq uint64)) error {
	for ctx.Err() == nil {
		err := v.followOnce(ctx, js, stream, from(), fn)
		if err == nil || ctx.Err() != nil {
			continue
		}
		select { // the server restarting, a consumer reset: start over
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
	return nil
}

func (v *verifier) followOnce(ctx context.Context, js jetstream.JetStream, stream string, after uint64, fn func(m jetstream.Msg, seq uint64)) error {
	cons, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: after + 1,
	})
	if err != nil {
		return err
	}
	for ctx.Err() == nil {
		batch, err := cons.Fetch(2048, jetstream.FetchMaxWait(500*time.Millisecond))
		if err != nil {
			return err
		}
		for m := range batch.Messages() {
			md, err := m.Metadata()
			if err != nil {
				return err
			}
			v.mu.Lock()
			fn(m, md.Sequence.Stream)
			v.mu.Unlock()
		}
		if err := batch.Error(); err != nil {
			return err
		}
	}
	return nil
}

// run follows both streams until ctx ends.
func (v *verifier) run(ctx context.Context, js jetstream.JetStream) {
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		_ = v.follow(ctx, js, demoInputStream, func() uint64 { return v.pos().Input }, v.input)
	}()
	go func() {
		defer wg.Done()
		_ = v.follow(ctx, js, demoOutputStream, func() uint64 { return v.pos().Output }, v.output)
	}()
	wg.Wait()
}

// input counts one input message (lock held).
func (v *verifier) input(m jetstream.Msg, seq uint64) {
	st := &v.mu.st
	if seq <= st.Input {
		return // read again after a consumer reset
	}
	if seq != st.Input+1 {
		v.violateLocked("input %s: message %d follows %d: messages %d to %d were removed before the verifier read them", demoInputStream, seq, st.Input, st.Input+1, seq-1)
	}
	st.Input = seq
	splitWords(m.Data(), func(w string) {
		st.Expected[w]++
		st.Words++
	})
}

// output checks one output message (lock held).
func (v *verifier) output(m jetstream.Msg, seq uint64) {
	st := &v.mu.st
	if seq <= st.Output {
		return
	}
	if seq != st.Output+1 {
		v.violateLocked("output %s: message %d follows %d: messages %d to %d were removed before the verifier read them", demoOutputStream, seq, st.Output, st.Output+1, seq-1)
	}
	st.Output = seq
	if m.Headers().Get(engine.HeaderFence) != "" {
		return // a group member's claim of the stream, not an output
	}
	st.Outputs++
	subj := m.Subject()
	idx, err := strconv.ParseUint(m.Headers().Get(engine.HeaderOut), 10, 64)
	if err != nil {
		v.violateLocked("output %d on %s has no valid %s header", seq, subj, engine.HeaderOut)
		return
	}
	if want := st.NextOut[subj] + 1; idx != want {
		what := "a gap"
		if idx < want {
			what = "a duplicate"
		}
		v.violateLocked("output %d on %s: %s %d, want %d (%s)", seq, subj, engine.HeaderOut, idx, want, what)
	}
	st.NextOut[subj] = idx
	key := m.Headers().Get(engine.HeaderKey)
	if want := fmt.Sprintf("%s.%d", demoOutputSubject, state.KeyGroup([]byte(key), demoKeyGroups)); subj != want {
		v.violateLocked("output %d: key %q on %s, want its key group's subject %s", seq, key, subj, want)
	}
	n, err := strconv.ParseUint(string(m.Data()), 10, 64)
	if err != nil {
		v.violateLocked("output %d: key %q: value %q is not a count", seq, key, m.Data())
		return
	}
	if want := st.Last[key] + 1; n != want {
		v.violateLocked("output %d: key %q: count %d after %d, want %d", seq, key, n, st.Last[key], want)
	}
	st.Last[key] = n
}

// caughtUp reports whether the verifier has read both streams up to these
// sequences.
func (v *verifier) caughtUp(input, output uint64) bool {
	p := v.pos()
	return p.Input >= input && p.Output >= output
}

// verifyResult is the final check's outcome.
type verifyResult struct {
	Words, Outputs uint64
	Keys           int
}

// check is the final check, once every input was processed and the job has
// stopped: every key's last count is its number of occurrences in the input,
// one output per word, and no rule broken on the way.
func (v *verifier) check() (verifyResult, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	st := &v.mu.st
	r := verifyResult{Words: st.Words, Outputs: st.Outputs, Keys: len(st.Expected)}
	if st.Violation != "" {
		return r, errors.New(st.Violation)
	}
	var bad []string
	for w, n := range st.Expected {
		if st.Last[w] != n {
			bad = append(bad, fmt.Sprintf("%q: last output %d, input holds it %d times", w, st.Last[w], n))
		}
	}
	for w := range st.Last {
		if _, ok := st.Expected[w]; !ok {
			bad = append(bad, fmt.Sprintf("%q: output but never in the input", w))
		}
	}
	if len(bad) > 0 {
		more := ""
		if len(bad) > 5 {
			more = fmt.Sprintf(" (and %d more)", len(bad)-5)
			bad = bad[:5]
		}
		return r, fmt.Errorf("%d keys differ: %s%s", len(bad), strings.Join(bad, "; "), more)
	}
	if st.Outputs != st.Words {
		return r, fmt.Errorf("%d outputs for %d words in the input", st.Outputs, st.Words)
	}
	return r, nil
}
