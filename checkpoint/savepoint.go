package checkpoint

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"

	"cairn/internal/base/par"
	"cairn/state"
)

// Savepoints (docs/DESIGN.md, "Checkpoints"): a full (canonical) checkpoint
// written under <job>/savepoints/<name>/, self-contained (it references no
// shared object), never deleted by retention or the orphan sweep, and
// relocatable: LoadSavepoint rebases the object paths onto the folder the
// manifest was found in, so the folder can be copied to another store or
// job prefix and restored there.
//
//	<job>/savepoints/<name>/slot-<i>/data.zst
//	<job>/savepoints/<name>/slot-<i>/index.json
//	<job>/savepoints/<name>/MANIFEST.json       written last (create-if-absent)

// ErrSavepointExists is returned (wrapped) by Writer.Savepoint when a
// savepoint of that name already exists: savepoints are never overwritten.
var ErrSavepointExists = errors.New("checkpoint: savepoint already exists")

// SavepointManifestPath is the manifest object of savepoint name.
func SavepointManifestPath(job, name string) string {
	return SavepointDir(job, name) + "/" + manifestName
}

// ValidateSavepointName checks a savepoint name: one path segment of
// [A-Za-z0-9._-].
func ValidateSavepointName(name string) error {
	if err := validJob(name); err != nil {
		return fmt.Errorf("checkpoint: savepoint name %q: only letters, digits, '.', '-', '_'", name)
	}
	return nil
}

// Savepoint writes a savepoint of the slots' local snapshots under
// <job>/savepoints/<name>/ in the canonical (full) format and commits its
// manifest last. id is recorded as the savepoint's id (typically the id of
// the barrier that produced the snapshots); it does not advance or consume
// the writer's checkpoint ids. The savepoint is not a checkpoint: it is not
// a chain parent, not subject to retention, and GC treats its objects as
// referenced forever.
func (w *Writer) Savepoint(ctx context.Context, id uint64, name string, meta Meta, slots []state.SlotSnapshot) (*Manifest, error) {
	if err := ValidateSavepointName(name); err != nil {
		return nil, err
	}
	if id == 0 {
		return nil, fmt.Errorf("checkpoint: savepoint %s: id 0", name)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	start := w.cfg.Now()
	mpath := SavepointManifestPath(w.cfg.Job, name)
	if _, err := w.store.Stat(ctx, mpath); err == nil {
		return nil, fmt.Errorf("checkpoint: savepoint %s: %w (choose another name)", name, ErrSavepointExists)
	} else if !errors.Is(err, ErrNotFound) {
		return nil, fmt.Errorf("checkpoint: savepoint %s: %w", name, err)
	}
	// The same manifest and full slots as a full checkpoint (key groups
	// encoded in parallel), written straight under the savepoint's folder.
	m, slots, err := w.newManifest("savepoint "+name, id, meta, slots, start)
	if err != nil {
		return nil, err
	}
	m.Mode = ModeFull
	var cleanup []string
	defer func() {
		for _, p := range cleanup {
			os.Remove(p)
		}
	}()
	dir := func(slot int) string { return fmt.Sprintf("%s/slot-%d", SavepointDir(m.Job, name), slot) }
	perSlot, err := w.fullSlots(ctx, m, slots, dir, &cleanup)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: savepoint %s: %w", name, err)
	}
	var uploads []upload
	for _, ups := range perSlot {
		uploads = append(uploads, ups...)
	}
	for _, u := range uploads {
		m.Objects = append(m.Objects, u.obj)
		m.Figures.FullStateSize += u.obj.Size
		m.Figures.FilesUploaded++
		m.Figures.BytesUploaded += u.obj.Size
	}
	if err := w.putAll(ctx, uploads); err != nil {
		return nil, fmt.Errorf("checkpoint: savepoint %s: upload: %w", name, err)
	}
	m.Figures.Async = w.cfg.Now().Sub(start)
	data, err := m.Encode()
	if err != nil {
		return nil, fmt.Errorf("checkpoint: savepoint %s: %w", name, err)
	}
	if err := w.store.Create(ctx, mpath, data); err != nil {
		if errors.Is(err, ErrExists) {
			err = fmt.Errorf("%w: %w", ErrSavepointExists, err)
		}
		return nil, fmt.Errorf("checkpoint: savepoint %s: manifest: %w", name, err)
	}
	w.log.Info("savepoint complete", "name", name, "id", id, "bytes", m.Figures.BytesUploaded,
		"files", m.Figures.FilesUploaded, "source_seq", m.SourceSeq, "duration", m.Figures.Async)
	return m, nil
}

// putAll uploads objects in parallel (those not already stored).
func (w *Writer) putAll(ctx context.Context, ups []upload) error {
	var todo []upload
	for _, u := range ups {
		if !u.stored {
			todo = append(todo, u)
		}
	}
	return par.Do(ctx, len(todo), w.cfg.Concurrency, func(ctx context.Context, i int) error {
		return putUpload(ctx, w.store, todo[i])
	})
}

func putUpload(ctx context.Context, s Store, u upload) error {
	if u.local == "" {
		return s.Put(ctx, u.obj.Path, bytes.NewReader(u.data))
	}
	// An online restore's SST that must be uploaded (its object is not in
	// the store any more) is completed first: its sparse parts read as
	// zeros.
	if err := state.EnsureLocal(ctx, u.local); err != nil {
		return err
	}
	f, err := os.Open(u.local)
	if err != nil {
		return err
	}
	defer f.Close()
	return s.Put(ctx, u.obj.Path, f)
}

// LoadSavepoint reads savepoint name of job. The manifest is rebased onto
// the folder it was found in: Job becomes job and every object path is
// rewritten from the folder it was written in to <job>/savepoints/<name>/,
// so a savepoint copied to another store, job or name restores from its new
// place.
func LoadSavepoint(ctx context.Context, s Store, job, name string) (*Manifest, error) {
	if err := ValidateSavepointName(name); err != nil {
		return nil, err
	}
	if err := validJob(job); err != nil {
		return nil, fmt.Errorf("checkpoint: load savepoint: %w", err)
	}
	mpath := SavepointManifestPath(job, name)
	b, err := readAll(ctx, s, mpath)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: load savepoint %s/%s: %w", job, name, err)
	}
	m, err := DecodeObject(mpath, b)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: load savepoint %s/%s: %w", job, name, err)
	}
	if m.Mode != ModeFull {
		return nil, &CorruptionError{Object: mpath, Reason: fmt.Sprintf("savepoint in mode %s, want full", m.Mode)}
	}
	to := SavepointDir(job, name) + "/"
	var from string
	for i, o := range m.Objects {
		// Written as <oldjob>/savepoints/<oldname>/slot-<i>/<file>.
		parts := strings.Split(o.Path, "/")
		if len(parts) != 5 || parts[1] != "savepoints" {
			return nil, &CorruptionError{Object: mpath, Reason: fmt.Sprintf("object %s is not inside a savepoint folder", o.Path)}
		}
		dir := strings.Join(parts[:3], "/") + "/"
		if i == 0 {
			from = dir
		} else if dir != from {
			return nil, &CorruptionError{Object: mpath, Reason: fmt.Sprintf("object %s is outside the savepoint folder %s", o.Path, from)}
		}
		m.Objects[i].Path = to + strings.TrimPrefix(o.Path, from)
	}
	m.Job = job
	if err := m.Validate(); err != nil {
		return nil, fmt.Errorf("checkpoint: load savepoint %s/%s: %w", job, name, err)
	}
	return m, nil
}

// SavepointName returns the name of the savepoint m was loaded from (by
// LoadSavepoint), or "" when m is a checkpoint.
func SavepointName(m *Manifest) string {
	if len(m.Objects) == 0 {
		return ""
	}
	parts := strings.Split(m.Objects[0].Path, "/")
	if len(parts) == 5 && parts[1] == "savepoints" {
		return parts[2]
	}
	return ""
}

// ListSavepoints returns the names of job's committed savepoints, sorted.
func ListSavepoints(ctx context.Context, s Store, job string) ([]string, error) {
	var names []string
	err := s.List(ctx, job+"/savepoints/", func(o ObjectInfo) error {
		parts := strings.Split(o.Name, "/")
		if len(parts) == 4 && parts[3] == manifestName {
			names = append(names, parts[2])
		}
		return nil
	})
	sort.Strings(names)
	return names, err
}
