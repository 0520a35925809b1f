package statetool

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"sync"
	"sync/atomic"

	"cairn/checkpoint"
	"cairn/internal/base/procs"
	"cairn/operators/abi"
	"cairn/state"
	"cairn/wasm"
)

// MigrateOptions configures Migrate. At least one of Module, Rename and
// Drop is set.
type MigrateOptions struct {
	Store checkpoint.Store
	// From is the checkpoint or savepoint to read (recovery.Select), and
	// FromSpec its name for the record ("savepoint:OLD").
	From     *checkpoint.Manifest
	FromSpec string
	// Job and To: the savepoint to write, <Job>/savepoints/<To>.
	Job string
	To  string
	// Stages names the state ids (DefaultStages when nil).
	Stages Stages
	// Stage is the stage Module migrates.
	Stage string
	// Module is a migration module (exports cairn_migrate; built with
	// sdk.RegisterMigration), ModuleName its name for errors.
	Module     []byte
	ModuleName string
	// Config is handed to the migration module as its config (sdk.Config).
	Config []byte
	// StateVersion, when > 0, is recorded as Stage's state version
	// instead of the one Module declares.
	StateVersion int
	// Rename renames stages (old name → new name) in what the manifest
	// records (modules, state versions): a stage renamed in the job file
	// keeps its state (its state id is its place in the sub-topology).
	Rename map[string]string
	// Drop removes the state of these stages.
	Drop []string
	// Into, when set, writes the savepoint of another sub-topology
	// instead: the state of the keyed stage of the one read, run through
	// Module when set (Stage is then not needed), as the state of
	// Into.Stage. Rename and Drop do not go with it.
	Into *Into
	// ResetOutputs drops the engine's count of outputs to the sub-topology's
	// first target, per key group: its output moved to a stage split off
	// behind it (Into.MoveOutputs), and it now writes a new repartition
	// stream, whose indexes start at 1.
	ResetOutputs bool
	// Runtime compiles Module (a new one when nil).
	Runtime *wasm.Runtime
	// Workers bounds the key groups migrated at once (default: the CPUs).
	Workers int
	// BatchEntries bounds the entries of one migration call (default 4096).
	BatchEntries int
	TempDir      string
	Logger       *slog.Logger
}

// MigrateStats counts a migration.
type MigrateStats struct {
	// Read is what the source held, Written what the savepoint holds.
	Read, Written Stats
	// Migrated is the entries given to the migration function.
	Migrated int64
	// StateVersion is Stage's state version in the new savepoint.
	StateVersion int
}

// Migrate writes savepoint o.To from the state of o.From with o.Stage's
// entries (values with their expiry, and timers) run through the migration
// module, key group by key group on every core, dropped stages left out
// and renamed stages renamed; the manifest records where it came from
// (Origin) and the stage's new state version, and is committed last.
func Migrate(ctx context.Context, o MigrateOptions) (*checkpoint.Manifest, MigrateStats, error) {
	var st MigrateStats
	m := o.From
	if o.Stages == nil {
		o.Stages = DefaultStages()
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.BatchEntries <= 0 {
		o.BatchEntries = 4096
	}
	if o.Workers <= 0 {
		o.Workers = procs.CPUs()
	}
	if o.Module == nil && len(o.Rename) == 0 && len(o.Drop) == 0 && o.Into == nil && !o.ResetOutputs {
		return nil, st, errors.New("statetool: migrate: nothing to do (a migration module, a rename, a drop, a reset of the output counts or a copy into another stage)")
	}
	fail := func(err error) (*checkpoint.Manifest, MigrateStats, error) {
		return nil, st, fmt.Errorf("statetool: migrate %s to savepoint %s: %w", o.FromSpec, o.To, err)
	}
	if err := checkpoint.ValidateSavepointName(o.To); err != nil {
		return fail(err)
	}
	modules := maps.Clone(m.Modules)
	versions := maps.Clone(m.StateVersions)
	if versions == nil {
		versions = map[string]int{}
	}
	origin := &checkpoint.Origin{Tool: "migrate", From: o.FromSpec, FromID: m.ID}
	dropped := map[uint8]bool{}
	for _, name := range o.Drop {
		id, ok := o.Stages.id(name)
		if !ok || id == state.SystemStage {
			return fail(fmt.Errorf("drop stage %q: %w (stages: %s)", name, ErrUnknownStage, stageList(o.Stages)))
		}
		dropped[id] = true
		delete(modules, name)
		delete(versions, name)
		origin.Steps = append(origin.Steps, "drop stage "+name)
	}
	var run *migration
	if o.Module != nil {
		id, ok := o.Stages.id(o.Stage)
		if o.Into != nil {
			id, ok = keyedStage, true
			o.Stage = o.Into.Stage
		}
		if !ok || id == state.SystemStage {
			return fail(fmt.Errorf("stage %q: %w (stages: %s)", o.Stage, ErrUnknownStage, stageList(o.Stages)))
		}
		if dropped[id] {
			return fail(fmt.Errorf("stage %q is both migrated and dropped", o.Stage))
		}
		var err error
		if run, err = newMigration(ctx, o, id); err != nil {
			return fail(err)
		}
		defer run.close(ctx)
		v := run.version
		if o.StateVersion > 0 {
			v = o.StateVersion
		}
		st.StateVersion = v
		if v > 0 {
			versions[o.Stage] = v
		} else {
			delete(versions, o.Stage)
		}
		origin.Steps = append(origin.Steps, fmt.Sprintf("migrate stage %s with %s (sha256 %.12s) to state version %d", o.Stage, o.ModuleName, run.hash, v))
	}
	for _, old := range slices.Sorted(maps.Keys(o.Rename)) {
		to := o.Rename[old]
		if _, ok := o.Stages.id(old); !ok && modules[old] == "" && versions[old] == 0 {
			return fail(fmt.Errorf("rename stage %q: %w (stages: %s)", old, ErrUnknownStage, stageList(o.Stages)))
		}
		if h, ok := modules[old]; ok {
			delete(modules, old)
			modules[to] = h
		}
		if v, ok := versions[old]; ok {
			delete(versions, old)
			versions[to] = v
		}
		origin.Steps = append(origin.Steps, fmt.Sprintf("rename stage %s to %s", old, to))
	}
	if len(versions) == 0 {
		versions = nil
	}
	job, seq, stream := o.Job, m.SourceSeq, m.SourceStream
	only := -1
	if o.Into != nil {
		var steps []string
		var err error
		if versions, steps, err = intoPlan(o, st.StateVersion, run != nil); err != nil {
			return fail(err)
		}
		origin.Steps = append(steps, origin.Steps...)
		origin.NewInput = true
		st.StateVersion = versions[o.Into.Stage]
		job, seq, stream, only = o.Into.Job, 0, o.Into.SourceStream, int(keyedStage)
		modules = nil // the sub-topology's own, which the job file has
	}
	keepOutputs := o.Into != nil && o.Into.MoveOutputs
	if o.ResetOutputs {
		if o.Into != nil {
			return fail(fmt.Errorf("%w: the output counts of the sub-topology read are reset in its own savepoint, not in %s's", ErrInto, o.Into.Job))
		}
		origin.Steps = append(origin.Steps, "reset the output counts")
	}
	r, err := openReader(ctx, o.Store, m, o.TempDir)
	if err != nil {
		return fail(err)
	}
	defer r.Close()
	src := &migrateSource{ctx: ctx, r: r, run: run, dropped: dropped, only: only, keepOutputs: keepOutputs, resetOutputs: o.ResetOutputs,
		keyGroups: m.KeyGroups, batch: o.BatchEntries}
	spec := checkpoint.BuildSpec{Job: job, Name: o.To, ID: m.ID, KeyGroups: m.KeyGroups, Slots: len(m.Slots),
		Meta:          checkpoint.Meta{SourceStream: stream, SourceSeq: seq, Modules: modules, ABIVersion: m.ABIVersion},
		StateVersions: versions, Origin: origin, TempDir: o.TempDir, Logger: o.Logger}
	out, err := checkpoint.BuildSavepoint(ctx, o.Store, spec, src)
	st.Read = Stats{Entries: src.readN.Load(), Bytes: src.readB.Load()}
	st.Written = Stats{Entries: src.wroteN.Load(), Bytes: src.wroteB.Load()}
	st.Migrated = src.migrated.Load()
	if err != nil {
		return fail(err)
	}
	return out, st, nil
}

// migration is a compiled migration module and its instances, one per
// key group being migrated at once.
type migration struct {
	rt      *wasm.Runtime
	ownRT   bool
	mod     *wasm.Module
	name    string
	hash    string
	stage   uint8
	version int
	config  []byte
	pool    chan *wasm.Instance
}

func newMigration(ctx context.Context, o MigrateOptions, stage uint8) (*migration, error) {
	mg := &migration{rt: o.Runtime, name: o.ModuleName, stage: stage, config: o.Config, pool: make(chan *wasm.Instance, o.Workers+1)}
	if mg.rt == nil {
		rt, err := wasm.NewRuntime(ctx, wasm.RuntimeConfig{})
		if err != nil {
			return nil, err
		}
		mg.rt, mg.ownRT = rt, true
	}
	mod, err := mg.rt.Compile(ctx, o.ModuleName, o.Module)
	if err != nil {
		mg.close(ctx)
		return nil, err
	}
	mg.mod, mg.hash = mod, mod.Hash()
	inst, err := mg.instance(ctx)
	if err != nil {
		mg.close(ctx)
		return nil, err
	}
	if !inst.CanMigrate() {
		inst.Close(ctx)
		mg.close(ctx)
		return nil, fmt.Errorf("module %s: %w", o.ModuleName, wasm.ErrNoMigration)
	}
	if mg.version, err = inst.StateVersion(ctx); err != nil {
		inst.Close(ctx)
		mg.close(ctx)
		return nil, err
	}
	mg.put(ctx, inst)
	return mg, nil
}

func (mg *migration) instance(ctx context.Context) (*wasm.Instance, error) {
	select {
	case i := <-mg.pool:
		return i, nil
	default:
	}
	return mg.mod.Instantiate(ctx, wasm.InstanceConfig{Stage: "migrate:" + mg.name, Slot: -1, Config: mg.config})
}

// put keeps a usable instance for the next key group.
func (mg *migration) put(ctx context.Context, i *wasm.Instance) {
	select {
	case mg.pool <- i:
	default:
		i.Close(ctx)
	}
}

func (mg *migration) close(ctx context.Context) {
	for {
		select {
		case i := <-mg.pool:
			i.Close(ctx)
			continue
		default:
		}
		break
	}
	if mg.ownRT {
		mg.rt.Close(ctx)
	}
}

// migrateSource is the new state, computed key group by key group when the
// savepoint writer asks for it (concurrently, on every core).
type migrateSource struct {
	ctx     context.Context
	r       *reader
	run     *migration
	dropped map[uint8]bool
	only    int // when >= 0, the one stage whose entries are kept
	// keepOutputs keeps the engine's output counts besides only's
	// entries; resetOutputs drops them.
	keepOutputs, resetOutputs bool
	keyGroups                 int
	batch                     int

	readN, readB, wroteN, wroteB, migrated atomic.Int64
}

// kgState is one key group's new entries, and the batch for the migration.
type kgState struct {
	kg   int
	recs []record
	mem  []byte
	in   []byte
	keys [][]byte // the batch's input keys, to name a failing entry
	n    int
}

var kgStates = sync.Pool{New: func() any { return &kgState{} }}

// memChunk is the unit of a key group's entry memory: records point into
// chunks, which are never moved (a growing buffer would copy them all).
const memChunk = 1 << 20

// room makes room for n more bytes in the current chunk.
func (s *kgState) room(n int) {
	if cap(s.mem)-len(s.mem) < n {
		s.mem = make([]byte, 0, max(memChunk, n))
	}
}

func (s *kgState) add(k, v []byte) {
	s.room(len(k) + len(v))
	n := len(s.mem)
	s.mem = append(s.mem, k...)
	s.mem = append(s.mem, v...)
	s.recs = append(s.recs, record{k: s.mem[n : n+len(k) : n+len(k)], v: s.mem[n+len(k) : len(s.mem) : len(s.mem)]})
}

// addEntry appends e's stored key and value.
func (s *kgState) addEntry(e *Entry) {
	s.room(len(e.Key) + len(e.Sub) + len(e.Value) + 32)
	n := len(s.mem)
	var kl int
	s.mem, kl = e.appendTo(s.mem)
	s.recs = append(s.recs, record{k: s.mem[n : n+kl : n+kl], v: s.mem[n+kl : len(s.mem) : len(s.mem)]})
}

func (src *migrateSource) ScanRaw(kr state.KeyGroupRange, fn func(k, v []byte) error) error {
	for kg := kr.First; kg <= kr.Last; kg++ {
		if err := src.keyGroup(kg, fn); err != nil {
			return err
		}
	}
	return nil
}

func (src *migrateSource) keyGroup(kg int, fn func(k, v []byte) error) error {
	ctx := src.ctx
	s := kgStates.Get().(*kgState)
	defer func() {
		s.recs, s.mem, s.in, s.keys, s.n = s.recs[:0], s.mem[:0], s.in[:0], s.keys[:0], 0
		kgStates.Put(s)
	}()
	s.kg = kg
	var inst *wasm.Instance
	defer func() {
		if inst != nil {
			src.run.put(ctx, inst)
		}
	}()
	flush := func() error {
		if s.n == 0 {
			return nil
		}
		if inst == nil {
			var err error
			if inst, err = src.run.instance(ctx); err != nil {
				return err
			}
		}
		// The batch was started with a count of 0 (abi.AppendMigrateInput:
		// version, then u32 count): set it.
		binary.LittleEndian.PutUint32(s.in[1:5], uint32(s.n))
		err := inst.Migrate(ctx, s.in, s.n, func(source int32, e *abi.Entry) error {
			ne := Entry{Stage: src.run.stage, Key: e.Key}
			switch e.Kind {
			case abi.EntryValue:
				ne.Kind, ne.Sub, ne.Value = state.KindValue, e.Sub, e.Value
				ne.HasExpiry, ne.ExpiryMs = e.Flags&abi.FlagExpiry != 0, e.When
				if !ne.HasExpiry {
					ne.ExpiryMs = 0
				}
			case abi.EntryTimer:
				ne.Kind, ne.Time = state.KindTimer, e.When
				if e.Flags&abi.FlagProcessing != 0 {
					ne.Domain = state.DomainProcessingTime
				}
			}
			ne.KeyGroup = state.KeyGroup(e.Key, src.keyGroups)
			if ne.KeyGroup != kg {
				return fmt.Errorf("%w: the migration of key %q wrote key %q, which is in key group %d, not %d: a migration keeps keys in their key group (re-key with cairn state export, a program of yours, and cairn state import)",
					ErrMigration, s.keys[source], e.Key, ne.KeyGroup, kg)
			}
			s.addEntry(&ne)
			return nil
		})
		if err != nil {
			var me *wasm.MigrateError
			if errors.As(err, &me) {
				if me.Entry >= 0 && me.Entry < len(s.keys) {
					err = fmt.Errorf("%w: key %q: %s", ErrMigration, s.keys[me.Entry], me.Reason)
				} else {
					err = fmt.Errorf("%w: %w", ErrMigration, me)
				}
				inst.Close(ctx)
				inst = nil
			}
			return err
		}
		src.migrated.Add(int64(s.n))
		s.in, s.keys, s.n = s.in[:0], s.keys[:0], 0
		return nil
	}
	err := src.r.keyGroup(ctx, kg, func(k, v []byte) error {
		src.readN.Add(1)
		src.readB.Add(int64(len(k) + len(v)))
		stage := k[2]
		if stage == state.SystemStage && (src.keepOutputs || src.resetOutputs) && isOutputCount(k) {
			if src.resetOutputs {
				return nil
			}
			s.add(k, v)
			return nil
		}
		if src.dropped[stage] || (src.only >= 0 && int(stage) != src.only) {
			return nil
		}
		if src.run == nil || stage != src.run.stage {
			s.add(k, v)
			return nil
		}
		e, err := decodeEntry(k, v)
		if err != nil {
			return err
		}
		if s.n == 0 {
			s.in = abi.AppendMigrateInput(s.in[:0], 0)
		}
		ae := abi.Entry{Kind: abi.EntryValue, Key: e.Key, Sub: e.Sub, Value: e.Value}
		switch e.Kind {
		case state.KindValue:
			if e.HasExpiry {
				ae.Flags, ae.When = abi.FlagExpiry, e.ExpiryMs
			}
		case state.KindTimer:
			ae.Kind, ae.When = abi.EntryTimer, e.Time
			if e.Domain == state.DomainProcessingTime {
				ae.Flags = abi.FlagProcessing
			}
		default:
			s.add(k, v)
			return nil
		}
		// The key is named in errors: keep it where AppendEntry wrote it
		// (u8 kind, u8 flags, u32 length, key), not as a copy.
		at := len(s.in) + 6
		s.in = abi.AppendEntry(s.in, &ae)
		s.keys = append(s.keys, s.in[at:at+len(e.Key):at+len(e.Key)])
		s.n++
		if s.n >= src.batch || len(s.in) >= 4<<20 {
			return flush()
		}
		return nil
	})
	if err == nil {
		err = flush()
	}
	if err != nil {
		return err // the savepoint writer names the key group
	}
	// A migration that keeps keys writes in key order already (the input
	// is): sort only when it did not.
	if !sort.SliceIsSorted(s.recs, func(i, j int) bool { return bytes.Compare(s.recs[i].k, s.recs[j].k) < 0 }) {
		sort.Slice(s.recs, func(i, j int) bool { return bytes.Compare(s.recs[i].k, s.recs[j].k) < 0 })
	}
	for i, rec := range s.recs {
		if i > 0 && bytes.Equal(rec.k, s.recs[i-1].k) {
			e, _ := decodeEntry(rec.k, rec.v)
			return fmt.Errorf("%w: two entries of key %q sub-key %q (%s)", ErrMigration, e.Key, e.Sub, e.Kind)
		}
		src.wroteN.Add(1)
		src.wroteB.Add(int64(len(rec.k) + len(rec.v)))
		if err := fn(rec.k, rec.v); err != nil {
			return err
		}
	}
	return nil
}
