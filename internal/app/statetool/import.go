package statetool

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"

	"sort"

	"cairn/checkpoint"
	"cairn/engine"
	"cairn/internal/base/par"
	"cairn/internal/base/procs"
	"cairn/state"
)

// ImportOptions configures Import. Zero fields take the export header's
// value (when the file has one), then the default.
type ImportOptions struct {
	Store checkpoint.Store
	// Job and Name: the savepoint to write, <Job>/savepoints/<Name>.
	Job  string
	Name string
	// File names the input in errors and in the savepoint's origin.
	File string
	// KeyGroups is the job's key_groups (header, then 128).
	KeyGroups int
	// Slots is the savepoint's slot count (header, then 1); a restore
	// rescales it to the job's.
	Slots int
	// SourceStream and SourceSeq: the input position the savepoint
	// resumes after (header's; SetSourceSeq overrides with SourceSeq).
	SourceStream string
	SourceSeq    uint64
	SetSourceSeq bool
	// Stages are the stage names lines may use (a job file's); nil: the
	// header's and DefaultStages.
	Stages Stages
	// Modules and StateVersions are recorded in the manifest (header's
	// when nil).
	Modules       map[string]string
	StateVersions map[string]int
	// MaxKeyBytes bounds a user key (default engine.DefaultMaxKeyBytes).
	MaxKeyBytes int
	TempDir     string
	Logger      *slog.Logger
}

// rawLine is one entry line as written.
type rawLine struct {
	Stage     *string         `json:"stage"`
	Kind      string          `json:"kind"`
	KG        *int            `json:"kg"`
	Key       *string         `json:"key"`
	KeyB64    *string         `json:"key_b64"`
	Sub       *string         `json:"sub"`
	SubB64    *string         `json:"sub_b64"`
	Value     *string         `json:"value"`
	ValueJSON json.RawMessage `json:"value_json"`
	ExpiresMs *int64          `json:"expires_ms"`
	Domain    string          `json:"domain"`
	Time      *int64          `json:"time"`
	Counter   *int            `json:"counter"`
}

// record is one encoded entry of a key group, with its line.
type record struct {
	k, v []byte
	line int
}

// bucketSource is the imported entries, sorted per key group.
type bucketSource struct{ kgs [][]record }

func (b *bucketSource) ScanRaw(r state.KeyGroupRange, fn func(k, v []byte) error) error {
	for kg := r.First; kg <= r.Last; kg++ {
		for _, rec := range b.kgs[kg] {
			if err := fn(rec.k, rec.v); err != nil {
				return err
			}
		}
	}
	return nil
}

// Import reads JSON lines (the export format) from in and builds savepoint
// o.Name of o.Job from them, with each entry in the key group the runtime
// computes for its key. Every line is checked before anything is written:
// a bad line, an unknown stage, a key longer than MaxKeyBytes, a key group
// that is not the key's, or the same entry twice is refused with its line
// number (a *LineError), and the store is left untouched.
func Import(ctx context.Context, in io.Reader, o ImportOptions) (*checkpoint.Manifest, Stats, error) {
	if o.File == "" {
		o.File = "-"
	}
	if o.MaxKeyBytes <= 0 {
		o.MaxKeyBytes = engine.DefaultMaxKeyBytes
	}
	if err := checkpoint.ValidateSavepointName(o.Name); err != nil {
		return nil, Stats{}, err
	}
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 256<<20)
	var (
		h      *Header
		kgs    [][]record
		stages Stages
		st     Stats
		arena  []byte
	)
	start := func() error {
		if o.KeyGroups == 0 {
			o.KeyGroups = state.DefaultKeyGroups
			if h != nil && h.KeyGroups > 0 {
				o.KeyGroups = h.KeyGroups
			}
		}
		if err := state.ValidateKeyGroups(o.KeyGroups); err != nil {
			return err
		}
		if o.Slots == 0 {
			o.Slots = 1
			if h != nil && h.Slots > 0 && h.Slots <= o.KeyGroups {
				o.Slots = h.Slots
			}
		}
		if err := state.ValidateSlots(o.Slots, o.KeyGroups); err != nil {
			return err
		}
		stages = o.Stages
		if stages == nil {
			stages = DefaultStages()
			if h != nil {
				for n, id := range h.Stages {
					stages[n] = id
				}
			}
		}
		kgs = make([][]record, o.KeyGroups)
		return nil
	}
	lineNo := 0
	for sc.Scan() {
		lineNo++
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		bad := func(reason string, err error) error {
			return &LineError{File: o.File, Line: lineNo, Reason: reason, Err: err}
		}
		if kgs == nil {
			if bytes.Contains(b, []byte(`"cairn_state_export"`)) {
				var hd Header
				dec := json.NewDecoder(bytes.NewReader(b))
				dec.DisallowUnknownFields()
				if err := dec.Decode(&hd); err != nil {
					return nil, st, bad("header: "+err.Error(), ErrBadLine)
				}
				if hd.Format != ExportFormat {
					return nil, st, bad(fmt.Sprintf("export format %d, this build reads %d", hd.Format, ExportFormat), ErrBadLine)
				}
				h = &hd
				if err := start(); err != nil {
					return nil, st, bad(err.Error(), ErrBadLine)
				}
				continue
			}
			if err := start(); err != nil {
				return nil, st, fmt.Errorf("statetool: import %s: %w", o.File, err)
			}
		}
		var l rawLine
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&l); err != nil {
			return nil, st, bad(err.Error(), ErrBadLine)
		}
		if dec.More() {
			return nil, st, bad("more than one JSON value", ErrBadLine)
		}
		e, err := l.entry(stages, o.MaxKeyBytes)
		if err != nil {
			return nil, st, &LineError{File: o.File, Line: lineNo, Reason: err.reason, Err: err.err}
		}
		if e.Stage == state.SystemStage {
			if *l.KG < 0 || *l.KG >= o.KeyGroups {
				return nil, st, bad(fmt.Sprintf("kg %d out of range [0, %d)", *l.KG, o.KeyGroups), ErrWrongKeyGroup)
			}
			if h != nil && h.KeyGroups != o.KeyGroups {
				return nil, st, bad(fmt.Sprintf("engine state of key group %d cannot move from key_groups %d to %d", *l.KG, h.KeyGroups, o.KeyGroups), ErrWrongKeyGroup)
			}
			e.KeyGroup = *l.KG
		} else {
			e.KeyGroup = state.KeyGroup(e.Key, o.KeyGroups)
			if l.KG != nil && (h == nil || h.KeyGroups == o.KeyGroups) && *l.KG != e.KeyGroup {
				return nil, st, bad(fmt.Sprintf("kg %d, but key %q is in key group %d of %d", *l.KG, e.Key, e.KeyGroup, o.KeyGroups), ErrWrongKeyGroup)
			}
		}
		k, v := e.encode()
		if len(arena)+len(k)+len(v) > cap(arena) {
			arena = make([]byte, 0, max(1<<20, len(k)+len(v)))
		}
		n := len(arena)
		arena = append(arena, k...)
		arena = append(arena, v...)
		rec := record{k: arena[n : n+len(k) : n+len(k)], v: arena[n+len(k) : len(arena) : len(arena)], line: lineNo}
		kgs[e.KeyGroup] = append(kgs[e.KeyGroup], rec)
		st.Entries++
		st.Bytes += int64(len(k) + len(v))
	}
	if err := sc.Err(); err != nil {
		return nil, st, &LineError{File: o.File, Line: lineNo + 1, Reason: "read", Err: err}
	}
	if kgs == nil {
		if err := start(); err != nil {
			return nil, st, fmt.Errorf("statetool: import %s: %w", o.File, err)
		}
	}
	// Sort each key group; the same key twice is refused.
	var dupErr error
	err := par.Do(ctx, len(kgs), procs.CPUs(), func(ctx context.Context, kg int) error {
		recs := kgs[kg]
		sort.SliceStable(recs, func(i, j int) bool { return bytes.Compare(recs[i].k, recs[j].k) < 0 })
		for i := 1; i < len(recs); i++ {
			if bytes.Equal(recs[i].k, recs[i-1].k) {
				a, b := recs[i-1].line, recs[i].line
				return &LineError{File: o.File, Line: max(a, b), Reason: fmt.Sprintf("the same entry as line %d", min(a, b)), Err: ErrDuplicate}
			}
		}
		return nil
	})
	if err != nil {
		dupErr = err
	}
	if dupErr != nil {
		return nil, st, dupErr
	}
	spec := checkpoint.BuildSpec{Job: o.Job, Name: o.Name, ID: 1, KeyGroups: o.KeyGroups, Slots: o.Slots,
		Origin: &checkpoint.Origin{Tool: "import", From: o.File}, TempDir: o.TempDir, Logger: o.Logger,
		Meta: checkpoint.Meta{SourceStream: o.SourceStream, SourceSeq: o.SourceSeq, Modules: o.Modules}, StateVersions: o.StateVersions}
	if h != nil {
		if h.ID > 0 {
			spec.ID = h.ID
			spec.Origin.FromID = h.ID
		}
		if spec.Meta.SourceStream == "" {
			spec.Meta.SourceStream = h.SourceStream
		}
		if !o.SetSourceSeq {
			spec.Meta.SourceSeq = h.SourceSeq
		}
		if spec.Meta.Modules == nil {
			spec.Meta.Modules = h.Modules
		}
		spec.Meta.ABIVersion = h.ABIVersion
		if spec.StateVersions == nil {
			spec.StateVersions = h.StateVersions
		}
	}
	m, err := checkpoint.BuildSavepoint(ctx, o.Store, spec, &bucketSource{kgs: kgs})
	if err != nil {
		return nil, st, fmt.Errorf("statetool: import %s: %w", o.File, err)
	}
	return m, st, nil
}

type lineErr struct {
	reason string
	err    error
}

// entry checks a line and decodes it (KeyGroup not set).
func (l *rawLine) entry(stages Stages, maxKey int) (Entry, *lineErr) {
	bad := func(format string, args ...any) (Entry, *lineErr) {
		return Entry{}, &lineErr{fmt.Sprintf(format, args...), ErrBadLine}
	}
	if l.Stage == nil {
		return bad("no stage")
	}
	id, ok := stages.id(*l.Stage)
	if !ok {
		return Entry{}, &lineErr{fmt.Sprintf("stage %q (this job's: %s)", *l.Stage, stageList(stages)), ErrUnknownStage}
	}
	e := Entry{Stage: id}
	bytesField := func(name string, s, b64 *string) ([]byte, bool, *lineErr) {
		switch {
		case s != nil && b64 != nil:
			return nil, false, &lineErr{fmt.Sprintf("both %s and %s_b64", name, name), ErrBadLine}
		case s != nil:
			return []byte(*s), true, nil
		case b64 != nil:
			v, err := base64.StdEncoding.DecodeString(*b64)
			if err != nil {
				return nil, false, &lineErr{fmt.Sprintf("%s_b64: %v", name, err), ErrBadLine}
			}
			return v, true, nil
		}
		return nil, false, nil
	}
	var err *lineErr
	var hasKey bool
	if e.Key, hasKey, err = bytesField("key", l.Key, l.KeyB64); err != nil {
		return Entry{}, err
	}
	if e.Sub, _, err = bytesField("sub", l.Sub, l.SubB64); err != nil {
		return Entry{}, err
	}
	if l.ValueJSON != nil {
		if l.Value != nil {
			return bad("both value and value_json")
		}
		// The raw JSON as it stands in the line: the stored bytes.
		e.Value = []byte(l.ValueJSON)
	}
	if l.Value != nil {
		v, derr := base64.StdEncoding.DecodeString(*l.Value)
		if derr != nil {
			return bad("value: %v (values are base64)", derr)
		}
		e.Value = v
	}
	if len(e.Key) > maxKey {
		return Entry{}, &lineErr{fmt.Sprintf("key of %d bytes, max_key_bytes is %d", len(e.Key), maxKey), ErrKeyTooLong}
	}
	if id == state.SystemStage && l.KG == nil {
		return bad("stage %s needs kg: the engine's state is kept per key group", SystemStageName)
	}
	switch l.Kind {
	case "value", "":
		e.Kind = state.KindValue
		if !hasKey {
			return bad("a value needs key or key_b64")
		}
		if l.Time != nil || l.Counter != nil || l.Domain != "" {
			return bad("a value has no time, domain or counter")
		}
		if l.ExpiresMs != nil {
			e.HasExpiry, e.ExpiryMs = true, *l.ExpiresMs
		}
	case "timer":
		e.Kind = state.KindTimer
		if !hasKey || l.Time == nil {
			return bad("a timer needs key (or key_b64) and time")
		}
		if l.Value != nil || l.ValueJSON != nil || l.Sub != nil || l.SubB64 != nil || l.ExpiresMs != nil || l.Counter != nil {
			return bad("a timer has no value, sub, expires_ms or counter")
		}
		switch l.Domain {
		case "", "event":
			e.Domain = state.DomainEventTime
		case "processing":
			e.Domain = state.DomainProcessingTime
		default:
			return bad("timer domain %q (event or processing)", l.Domain)
		}
		e.Time = *l.Time
	case "counter":
		e.Kind = state.KindCounter
		if id != state.SystemStage {
			return bad("counters belong to stage %s", SystemStageName)
		}
		if l.Counter == nil || *l.Counter < 1 || *l.Counter > 255 {
			return bad("a counter needs counter in [1, 255]")
		}
		if hasKey || l.Sub != nil || l.SubB64 != nil || l.ExpiresMs != nil || l.Time != nil {
			return bad("a counter has only kg, counter and value")
		}
		e.Counter = uint8(*l.Counter)
	default:
		return bad("kind %q (value, timer or counter)", l.Kind)
	}
	return e, nil
}
