package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"
)

// The savepoint lifecycle: savepoints are never removed by checkpoint
// retention or GC; they go when a user removes one (DeleteSavepoint, `cairn
// savepoint rm`) or when the job's own savepoint policy
// (savepoints.retain, PruneSavepoints) keeps only the newest ones.

// SavepointInfo describes one savepoint of a job.
type SavepointInfo struct {
	Name      string
	ID        uint64
	Time      time.Time
	SourceSeq uint64
	Slots     int
	KeyGroups int
	// Bytes is the total size of the savepoint's objects.
	Bytes int64
	// Modules is each stage's module hash.
	Modules map[string]string
	// Corrupt, when set, says why the manifest does not decode (damaged,
	// or a format newer than this binary's); the other fields but Name
	// are then zero.
	Corrupt string
}

// ListSavepointInfo describes every committed savepoint of job, oldest
// first (by time, then name). A manifest that does not decode is listed
// with Corrupt set instead of failing the list; one that cannot be read
// now (a store error) fails it, naming the savepoint.
func ListSavepointInfo(ctx context.Context, s Store, job string) ([]SavepointInfo, error) {
	names, err := ListSavepoints(ctx, s, job)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: list savepoints of %s: %w", job, err)
	}
	out := make([]SavepointInfo, 0, len(names))
	for _, name := range names {
		m, err := LoadSavepoint(ctx, s, job, name)
		if err != nil {
			if errors.Is(err, ErrNotFound) { // removed meanwhile
				continue
			}
			if !IsCorruption(err) && !errors.Is(err, ErrUnsupportedVersion) {
				// Not read now (a store error, a stop): not a verdict on
				// the savepoint. Listed as corrupt, a prune would skip
				// it, and a user might remove a good one by hand.
				return nil, fmt.Errorf("checkpoint: read savepoint %s of %s: %w", name, job, err)
			}
			out = append(out, SavepointInfo{Name: name, Corrupt: err.Error()})
			continue
		}
		info := SavepointInfo{Name: name, ID: m.ID, Time: m.Time, SourceSeq: m.SourceSeq, Slots: len(m.Slots), KeyGroups: m.KeyGroups, Modules: m.Modules}
		for _, o := range m.Objects {
			info.Bytes += o.Size
		}
		out = append(out, info)
	}
	sort.SliceStable(out, func(i, j int) bool {
		if !out[i].Time.Equal(out[j].Time) {
			return out[i].Time.Before(out[j].Time)
		}
		return out[i].Name < out[j].Name
	})
	return out, nil
}

// DeleteSavepoint removes savepoint name of job: its manifest first, so
// that no restore ever opens a half-deleted savepoint, then every object
// under its folder (also the leftovers of an earlier removal that was
// interrupted, when the manifest is already gone). It returns the number
// of objects and bytes deleted; an error wrapping ErrNotFound when there
// was nothing to delete.
func DeleteSavepoint(ctx context.Context, s Store, job, name string) (objects int, bytes int64, err error) {
	if err := ValidateSavepointName(name); err != nil {
		return 0, 0, err
	}
	if err := validJob(job); err != nil {
		return 0, 0, fmt.Errorf("checkpoint: delete savepoint: %w", err)
	}
	mpath := SavepointManifestPath(job, name)
	if fi, err := s.Stat(ctx, mpath); err == nil {
		if err := s.Delete(ctx, mpath); err != nil {
			return 0, 0, fmt.Errorf("checkpoint: delete savepoint %s: manifest: %w", name, err)
		}
		objects, bytes = 1, fi.Size
	} else if !errors.Is(err, ErrNotFound) {
		return 0, 0, fmt.Errorf("checkpoint: delete savepoint %s: %w", name, err)
	}
	var rest []ObjectInfo
	if err := s.List(ctx, SavepointDir(job, name)+"/", func(o ObjectInfo) error {
		rest = append(rest, o)
		return nil
	}); err != nil {
		return objects, bytes, fmt.Errorf("checkpoint: delete savepoint %s: list: %w", name, err)
	}
	for _, o := range rest {
		if err := s.Delete(ctx, o.Name); err != nil {
			return objects, bytes, fmt.Errorf("checkpoint: delete savepoint %s: %s: %w", name, o.Name, err)
		}
		objects++
		bytes += o.Size
	}
	if objects == 0 {
		return 0, 0, fmt.Errorf("checkpoint: savepoint %s of job %s: %w", name, job, ErrNotFound)
	}
	return objects, bytes, nil
}

// PruneSavepoints keeps the newest retain savepoints of job and deletes the
// older ones (retain <= 0: keeps all). A savepoint whose manifest does not
// load is neither counted nor deleted: it is reported by `cairn savepoint
// ls`, and removed only by name. It returns the names deleted.
func PruneSavepoints(ctx context.Context, s Store, job string, retain int) ([]string, error) {
	if retain <= 0 {
		return nil, nil
	}
	list, err := ListSavepointInfo(ctx, s, job)
	if err != nil {
		return nil, err
	}
	var good []SavepointInfo
	for _, sp := range list {
		if sp.Corrupt == "" {
			good = append(good, sp)
		}
	}
	var deleted []string
	for len(good) > retain {
		name := good[0].Name
		good = good[1:]
		if _, _, err := DeleteSavepoint(ctx, s, job, name); err != nil && !errors.Is(err, ErrNotFound) {
			return deleted, err
		}
		deleted = append(deleted, name)
	}
	return deleted, nil
}
