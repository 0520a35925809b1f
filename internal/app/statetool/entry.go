// Package statetool changes a job's state offline, the way Flink's State
// Processor API does: it exports a checkpoint's or savepoint's state as JSON
// lines, builds a savepoint from such lines (import, a bootstrap), runs a
// migration module over a stage's state (migrate, with rename and drop), and
// compares two savepoints (diff). It reads checkpoints through checkpoint and
// recovery and writes savepoints with checkpoint.BuildSavepoint, so what it
// writes is exactly what a job's savepoint is: `cairn run --restore
// savepoint:NAME` starts from it at any slot count.
package statetool

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"cairn/internal/app/job"
	"cairn/state"
)

// Errors. A refused input line is a *LineError wrapping one of them.
var (
	// ErrBadLine is a line that is not a well-formed entry.
	ErrBadLine = errors.New("statetool: malformed line")
	// ErrUnknownStage is an entry of a stage the job does not have.
	ErrUnknownStage = errors.New("statetool: unknown stage")
	// ErrKeyTooLong is a user key longer than the job's max_key_bytes.
	ErrKeyTooLong = errors.New("statetool: key too long")
	// ErrDuplicate is an entry whose key an earlier entry already has.
	ErrDuplicate = errors.New("statetool: duplicate entry")
	// ErrWrongKeyGroup is an entry whose key group is not the one its
	// key hashes to.
	ErrWrongKeyGroup = errors.New("statetool: wrong key group")
	// ErrNotSavepoint is a migration source that is not the job's.
	ErrNotSavepoint = errors.New("statetool: not a savepoint of the job")
	// ErrMigration is a migration function that failed or misbehaved.
	ErrMigration = errors.New("statetool: migration failed")
)

// LineError is an input line that was refused: the file, its line number
// (from 1) and why.
type LineError struct {
	File   string
	Line   int
	Reason string
	Err    error
}

func (e *LineError) Error() string {
	return fmt.Sprintf("%s:%d: %v: %s", e.File, e.Line, e.Err, e.Reason)
}

func (e *LineError) Unwrap() error { return e.Err }

// SystemStageName names the engine's own state (stage id 0: output
// counters, the transactional outbox) in exported lines.
const SystemStageName = "_system"

// Stages maps the stage names a chain's state can be written under to
// their state ids: the keyed stage of a sub-topology has id 1 (the engine's
// KeyedStageID), the engine's own state id 0. "#<id>" always names an id.
type Stages map[string]uint8

// DefaultStages is the mapping without a job file: "_system" and "#1".
func DefaultStages() Stages { return Stages{SystemStageName: state.SystemStage, "#1": 1} }

// id resolves a stage name.
func (s Stages) id(name string) (uint8, bool) {
	if id, ok := s[name]; ok {
		return id, true
	}
	if name == SystemStageName {
		return state.SystemStage, true
	}
	if n, ok := strings.CutPrefix(name, "#"); ok {
		v, err := strconv.ParseUint(n, 10, 8)
		if err == nil {
			for _, id := range s {
				if uint64(id) == v {
					return id, true
				}
			}
			if v == 1 {
				return 1, true
			}
		}
	}
	return 0, false
}

// name is the name exported lines give a stage id: the job's name for it
// when known, else "#<id>".
func (s Stages) name(id uint8) string {
	if id == state.SystemStage {
		return SystemStageName
	}
	best := ""
	for n, v := range s {
		if v == id && !strings.HasPrefix(n, "#") && (best == "" || n < best) {
			best = n
		}
	}
	if best != "" {
		return best
	}
	return "#" + strconv.Itoa(int(id))
}

// Entry is one decoded state entry.
type Entry struct {
	KeyGroup int
	Stage    uint8
	Kind     state.Kind
	// Key is the user key (value and timer).
	Key []byte
	// Sub is the operator's sub-key (value).
	Sub []byte
	// Value is the payload: a value's (without the TTL header) or a
	// counter's bytes.
	Value []byte
	// HasExpiry and ExpiryMs: a value's TTL.
	HasExpiry bool
	ExpiryMs  int64
	// Domain and Time: a timer's.
	Domain uint8
	Time   int64
	// Counter is a counter's id.
	Counter uint8
}

// decodeEntry decodes a stored key and value; the slices alias k and v.
func decodeEntry(k, v []byte) (Entry, error) {
	key, err := state.DecodeKey(k)
	if err != nil {
		return Entry{}, err
	}
	e := Entry{KeyGroup: key.KeyGroup, Stage: key.Stage, Kind: key.Kind, Key: key.UserKey, Sub: key.Sub,
		Domain: key.Domain, Time: key.Time, Counter: key.Counter, Value: v}
	if key.Kind == state.KindValue {
		if e.Value, e.ExpiryMs, e.HasExpiry, err = state.DecodeValue(v); err != nil {
			return Entry{}, fmt.Errorf("key %x: %w", k, err)
		}
	}
	return e, nil
}

// appendTo appends the stored key, then the stored value, of e (KeyGroup
// set) to dst, and returns dst and the key's length.
func (e *Entry) appendTo(dst []byte) ([]byte, int) {
	n := len(dst)
	switch e.Kind {
	case state.KindValue:
		dst = state.AppendValueKey(dst, e.KeyGroup, e.Stage, e.Key, e.Sub)
		k := len(dst) - n
		return state.AppendValue(dst, e.Value, e.ExpiryMs, e.HasExpiry), k
	case state.KindTimer:
		dst = state.AppendTimerKey(dst, e.KeyGroup, e.Stage, e.Domain, e.Time, e.Key)
		return dst, len(dst) - n
	}
	k, v := e.encode()
	return append(append(dst, k...), v...), len(k)
}

// encode is the stored key and value of e (KeyGroup set).
func (e *Entry) encode() (k, v []byte) {
	switch e.Kind {
	case state.KindValue:
		return state.ValueKey(e.KeyGroup, e.Stage, e.Key, e.Sub), state.EncodeValue(e.Value, e.ExpiryMs, e.HasExpiry)
	case state.KindTimer:
		return state.TimerKey(e.KeyGroup, e.Stage, e.Domain, e.Time, e.Key), nil
	default:
		return state.CounterKey(e.KeyGroup, e.Counter), e.Value
	}
}

// StagesOf names the state of chain (the job's name, or <job>.s<k> for
// sub-topology k of a job graph) after the job file: its keyed stage's name
// for state id 1, besides DefaultStages.
func StagesOf(j *job.Job, chain string) Stages {
	s := DefaultStages()
	for _, sub := range j.Graph() {
		name := j.Name
		if sub.Index > 0 {
			name = j.Name + ".s" + strconv.Itoa(sub.Index)
		}
		if name != chain {
			continue
		}
		if st, ok := sub.Keyed(); ok {
			s[st.Name] = 1
		}
	}
	return s
}
