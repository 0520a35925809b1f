package checkpoint

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"cairn/internal/base/failpoint"
	"cairn/internal/base/procs"
	"cairn/state"
)

// Savepoints built offline: a state tool (`cairn state import|migrate`)
// produces a job's state without a running job or a Pebble DB, key group
// by key group, and BuildSavepoint writes it in the canonical format under
// <job>/savepoints/<name>/ exactly as a job's savepoint is written (the same
// encoder, in parallel over key groups) and commits the manifest last, with
// the same create-if-absent rule: a build killed at any point leaves no
// manifest, so no savepoint, and a rerun writes it again.

// EntrySource yields a built savepoint's entries. ScanRaw is called with a
// range of one key group, concurrently for different key groups, and must
// call fn with that key group's entries (raw Pebble keys and stored values)
// in strictly increasing key order; k and v may be reused after fn returns.
type EntrySource interface {
	ScanRaw(r state.KeyGroupRange, fn func(k, v []byte) error) error
}

// BuildSpec describes a savepoint to build.
type BuildSpec struct {
	Job  string
	Name string
	// ID is recorded as the savepoint's id (the id of the checkpoint its
	// state came from, or 1); it must not be 0.
	ID        uint64
	KeyGroups int
	Slots     int
	Meta      Meta
	// StateVersions and Origin are recorded in the manifest.
	StateVersions map[string]int
	Origin        *Origin
	// TempDir holds the data files of a store that takes no stream (S3)
	// until they are uploaded ("": the system's).
	TempDir string
	// Concurrency bounds parallel uploads (default 4).
	Concurrency int
	Logger      *slog.Logger
	Now         func() time.Time
}

// BuildSavepoint writes savepoint spec.Name of spec.Job from src and
// commits its manifest last. It refuses a name that exists
// (ErrSavepointExists). Objects under the savepoint's folder without a
// manifest — an earlier build that was killed — are deleted first: a
// savepoint without a manifest does not exist.
func BuildSavepoint(ctx context.Context, s Store, spec BuildSpec, src EntrySource) (*Manifest, error) {
	if err := ValidateSavepointName(spec.Name); err != nil {
		return nil, err
	}
	if err := validJob(spec.Job); err != nil {
		return nil, fmt.Errorf("checkpoint: build savepoint: %w", err)
	}
	if err := state.ValidateKeyGroups(spec.KeyGroups); err != nil {
		return nil, fmt.Errorf("checkpoint: build savepoint %s: %w", spec.Name, err)
	}
	if err := state.ValidateSlots(spec.Slots, spec.KeyGroups); err != nil {
		return nil, fmt.Errorf("checkpoint: build savepoint %s: %w", spec.Name, err)
	}
	if spec.ID == 0 {
		return nil, fmt.Errorf("checkpoint: build savepoint %s: id 0", spec.Name)
	}
	if spec.Now == nil {
		spec.Now = time.Now
	}
	if spec.Logger == nil {
		spec.Logger = slog.Default()
	}
	if spec.Concurrency <= 0 {
		spec.Concurrency = 4
	}
	what := "savepoint " + spec.Name
	mpath := SavepointManifestPath(spec.Job, spec.Name)
	if _, err := s.Stat(ctx, mpath); err == nil {
		return nil, fmt.Errorf("checkpoint: %s: %w (choose another name)", what, ErrSavepointExists)
	} else if !errors.Is(err, ErrNotFound) {
		return nil, fmt.Errorf("checkpoint: %s: %w", what, err)
	}
	left, err := listAll(ctx, s, SavepointDir(spec.Job, spec.Name)+"/")
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %s: list: %w", what, err)
	}
	for _, o := range left {
		if err := s.Delete(ctx, o.Name); err != nil && !errors.Is(err, ErrNotFound) {
			return nil, fmt.Errorf("checkpoint: %s: remove leftover %s: %w", what, o.Name, err)
		}
	}
	if len(left) > 0 {
		spec.Logger.Info("removed the objects of an earlier attempt that never committed", "savepoint", spec.Name, "objects", len(left))
	}
	start := spec.Now()
	meta := spec.Meta
	m := &Manifest{
		FormatVersion: FormatVersion, Job: spec.Job, ID: spec.ID, Mode: ModeFull, Time: start,
		KeyGroups: spec.KeyGroups, SourceStream: meta.SourceStream, SourceSeq: meta.SourceSeq,
		Modules: meta.Modules, ABIVersion: meta.ABIVersion, ChainLength: 1,
		StateVersions: spec.StateVersions, Origin: spec.Origin,
	}
	for i := range spec.Slots {
		m.Slots = append(m.Slots, SlotInfo{Slot: i, Range: state.SlotRange(i, spec.Slots, spec.KeyGroups)})
		m.Figures.SyncPerSlot = append(m.Figures.SyncPerSlot, 0)
	}
	ups, cleanup, err := buildSlots(ctx, s, m, spec, src)
	defer func() {
		for _, p := range cleanup {
			os.Remove(p)
		}
	}()
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %s: %w", what, err)
	}
	for _, u := range ups {
		m.Objects = append(m.Objects, u.obj)
		m.Figures.FullStateSize += u.obj.Size
		m.Figures.FilesUploaded++
		m.Figures.BytesUploaded += u.obj.Size
	}
	w := &Writer{store: s, cfg: WriterConfig{Concurrency: spec.Concurrency}}
	if err := w.putAll(ctx, ups); err != nil {
		return nil, fmt.Errorf("checkpoint: %s: upload: %w", what, err)
	}
	failpoint.Hit(failpoint.SavepointBuildBeforeManifest)
	m.Figures.Async = spec.Now().Sub(start)
	data, err := m.Encode()
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %s: %w", what, err)
	}
	if err := s.Create(ctx, mpath, data); err != nil {
		if errors.Is(err, ErrExists) {
			err = fmt.Errorf("%w: %w", ErrSavepointExists, err)
		}
		return nil, fmt.Errorf("checkpoint: %s: manifest: %w", what, err)
	}
	spec.Logger.Info("savepoint built", "name", spec.Name, "job", spec.Job, "bytes", m.Figures.BytesUploaded, "slots", spec.Slots, "duration", m.Figures.Async)
	return m, nil
}

// buildSlots writes every slot's canonical files from src, as fullSlots
// does from snapshots: streamed into a store that takes streams, else into
// temporary files (returned for removal) to upload.
func buildSlots(ctx context.Context, s Store, m *Manifest, spec BuildSpec, src EntrySource) ([]upload, []string, error) {
	ss, stream := asStreamStore(s)
	n := len(m.Slots)
	cs := make([]*canonicalSlot, n)
	objs := make([]objectWriter, n)
	files := make([]*os.File, n)
	tmps := make([]string, n)
	var cleanup []string
	defer func() {
		for i := range n {
			if objs[i] != nil {
				objs[i].Abort()
			}
			if files[i] != nil {
				files[i].Close()
			}
		}
	}()
	dir := func(slot int) string { return fmt.Sprintf("%s/slot-%d", SavepointDir(m.Job, spec.Name), slot) }
	for i, si := range m.Slots {
		cs[i] = &canonicalSlot{db: src, r: si.Range, done: func() error {
			if o := objs[i]; o != nil {
				objs[i] = nil
				return o.Commit()
			}
			f := files[i]
			files[i] = nil
			return f.Close()
		}}
		var err error
		if stream {
			if objs[i], err = ss.create(ctx, dir(i)+"/"+dataFile); err != nil {
				return nil, cleanup, fmt.Errorf("slot %d: %w", i, err)
			}
			cs[i].out = objs[i]
			continue
		}
		if files[i], err = os.CreateTemp(spec.TempDir, ".cairn-build-*.zst"); err != nil {
			return nil, cleanup, fmt.Errorf("slot %d: %w", i, err)
		}
		cleanup = append(cleanup, files[i].Name())
		tmps[i] = files[i].Name()
		cs[i].out = files[i]
	}
	if err := writeCanonicalSlots(ctx, m.KeyGroups, cs, procs.CPUs()); err != nil {
		return nil, cleanup, err
	}
	var ups []upload
	for i := range m.Slots {
		idx, err := json.Marshal(cs[i].index)
		if err != nil {
			return nil, cleanup, err
		}
		isum := sha256.Sum256(idx)
		d := dir(i)
		ups = append(ups,
			upload{obj: Object{Path: d + "/" + dataFile, File: dataFile, Size: cs[i].size, SHA256: cs[i].sum, Kind: KindFullData, Slot: i}, local: tmps[i], stored: stream},
			upload{obj: Object{Path: d + "/" + indexFile, File: indexFile, Size: int64(len(idx)), SHA256: hex.EncodeToString(isum[:]), Kind: KindIndex, Slot: i}, data: idx})
	}
	return ups, cleanup, nil
}
