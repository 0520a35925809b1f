package recovery

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"cairn/checkpoint"
	"cairn/internal/base/par"
	"cairn/recovery/model"
)

// CacheIndexName is the trust index of a standby cache, at its root.
const CacheIndexName = "CACHE-INDEX.json"

// Standby follows a job's checkpoints in the store and keeps a local cache
// of the files of every retained committed checkpoint, so a failover
// restore (Options.CacheDir) downloads only what the cache lacks: at most
// the newest checkpoint's delta.
//
// Cache layout: an object <job>/<rest> is cached at <cacheDir>/<rest>, so
// shared SSTs are cached once by content (shared/<h[0:2]>/<h>.sst) and
// private files per checkpoint (chk-<id>/slot-<i>/...). A file appears under
// its final name only after its size and SHA-256 were verified, and is
// recorded in CACHE-INDEX.json so a restore can trust it without hashing.
// Stop the standby before restoring from its cache (failover): it prunes
// files that retention dropped.
type Standby struct {
	store       checkpoint.Store
	job         string
	dir         string
	log         *slog.Logger
	concurrency int

	// OnSync, if set, is told every download a sync round made (one per
	// checkpoint that brought new files): the restore model calibrates
	// its fetch terms from it, so a failover is predicted at the bandwidth
	// the standby measured. Set before Run.
	OnSync func(model.Transfer)

	mu struct {
		sync.Mutex
		// manifests are the retained committed checkpoints, by id.
		manifests map[uint64]*checkpoint.Manifest
		// idx is the cache's trust index.
		idx *checkpoint.TrustIndex
	}
	// lagMu guards lag separately, so Lag does not wait for a sync round.
	lagMu sync.Mutex
	// lag is the last computed lag.
	lag StandbyLag
}

// StandbyLag is how far a standby's cache is behind the store.
type StandbyLag struct {
	// LastSynced is the newest checkpoint whose files are all in the cache
	// (0: none).
	LastSynced uint64
	// Latest is the newest committed checkpoint in the store.
	Latest uint64
	// CheckpointsBehind counts committed checkpoints newer than LastSynced.
	CheckpointsBehind int
	// BytesBehind is what a restore of Latest would still download.
	BytesBehind int64
	// SyncedAt is when the last sync round finished.
	SyncedAt time.Time
	// Err is the last sync round's error (nil when it succeeded).
	Err error
}

// NewStandby returns a standby for job caching into cacheDir (created when
// missing). logger nil means slog.Default().
func NewStandby(store checkpoint.Store, job, cacheDir string, logger *slog.Logger) *Standby {
	if logger == nil {
		logger = slog.Default()
	}
	s := &Standby{store: store, job: job, dir: cacheDir, log: logger.With("job", job, "component", "standby"), concurrency: 8}
	s.mu.manifests = map[uint64]*checkpoint.Manifest{}
	return s
}

// Lag returns the lag computed by the last sync round.
func (s *Standby) Lag() StandbyLag {
	s.lagMu.Lock()
	defer s.lagMu.Unlock()
	return s.lag
}

// Run syncs every poll until ctx ends; a failed round is logged and retried
// at the next poll. It returns ctx's error.
func (s *Standby) Run(ctx context.Context, poll time.Duration) error {
	if poll <= 0 {
		poll = time.Second
	}
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		if err := s.Sync(ctx); err != nil && ctx.Err() == nil {
			s.log.Warn("standby sync failed", "err", err)
		}
		t.Reset(poll)
	}
}

// Sync runs one round: load new committed manifests, download the files of
// every retained checkpoint that the cache lacks (newest checkpoint first),
// verify them, and prune cached files no retained checkpoint references.
func (s *Standby) Sync(ctx context.Context) (err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	defer func() {
		s.lagMu.Lock()
		s.lag.Err = err
		s.lag.SyncedAt = time.Now()
		s.lagMu.Unlock()
	}()
	if err := os.MkdirAll(s.dir, 0o755); err != nil {
		return fmt.Errorf("recovery: standby: %w", err)
	}
	if s.mu.idx == nil {
		s.mu.idx = checkpoint.ReadTrustIndex(filepath.Join(s.dir, CacheIndexName))
	}
	// Only the ids are listed each round; a manifest is read once, when
	// its checkpoint first appears (manifests never change).
	retainedIDs, err := checkpoint.ManifestIDs(ctx, s.store, s.job)
	if err != nil {
		return fmt.Errorf("recovery: standby: list: %w", err)
	}
	retained := map[uint64]bool{}
	for _, id := range retainedIDs {
		retained[id] = true
		if s.mu.manifests[id] == nil {
			m, err := checkpoint.Load(ctx, s.store, s.job, id)
			if err != nil {
				if errors.Is(err, checkpoint.ErrNotFound) {
					continue // dropped by retention since the listing
				}
				return fmt.Errorf("recovery: standby: %w", err)
			}
			s.mu.manifests[id] = m
		}
	}
	for id := range s.mu.manifests {
		if !retained[id] {
			delete(s.mu.manifests, id)
		}
	}
	ids := make([]uint64, 0, len(s.mu.manifests))
	for id := range s.mu.manifests {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] > ids[j] })
	s.updateLagLocked(ids)

	wanted := map[string]bool{}
	for _, id := range ids {
		for _, o := range s.mu.manifests[id].Objects {
			wanted[cacheRel(s.job, o.Path)] = true
		}
	}
	var errs []error
	for _, id := range ids {
		if err := s.syncManifestLocked(ctx, s.mu.manifests[id]); err != nil {
			errs = append(errs, fmt.Errorf("checkpoint %d: %w", id, err))
			if ctx.Err() != nil {
				break
			}
		}
		s.updateLagLocked(ids)
	}
	if err := s.pruneLocked(wanted); err != nil {
		errs = append(errs, err)
	}
	if err := s.mu.idx.Write(filepath.Join(s.dir, CacheIndexName)); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("recovery: standby: %w", err)
	}
	return nil
}

// cachedLocked reports whether the cache holds o, verified.
func (s *Standby) cachedLocked(o checkpoint.Object) bool {
	rel := cacheRel(s.job, o.Path)
	return s.mu.idx.Trusts(rel, filepath.Join(s.dir, filepath.FromSlash(rel)), o)
}

// updateLagLocked recomputes the lag from the cache's content; ids are
// newest first.
func (s *Standby) updateLagLocked(ids []uint64) {
	s.lagMu.Lock()
	lag := StandbyLag{SyncedAt: s.lag.SyncedAt, Err: s.lag.Err}
	s.lagMu.Unlock()
	for i, id := range ids {
		m := s.mu.manifests[id]
		if i == 0 {
			lag.Latest = id
			seen := map[string]bool{}
			for _, o := range m.Objects {
				if !seen[o.Path] && !s.cachedLocked(o) {
					lag.BytesBehind += o.Size
				}
				seen[o.Path] = true
			}
		}
		complete := true
		for _, o := range m.Objects {
			if !s.cachedLocked(o) {
				complete = false
				break
			}
		}
		if complete {
			lag.LastSynced = id
			break
		}
		lag.CheckpointsBehind++
	}
	s.lagMu.Lock()
	s.lag = lag
	s.lagMu.Unlock()
}

// syncManifestLocked downloads m's objects missing from the cache.
func (s *Standby) syncManifestLocked(ctx context.Context, m *checkpoint.Manifest) error {
	var todo []checkpoint.Object
	seen := map[string]bool{}
	for _, o := range m.Objects {
		if !seen[o.Path] && !s.cachedLocked(o) {
			todo = append(todo, o)
		}
		seen[o.Path] = true
	}
	if len(todo) == 0 {
		return nil
	}
	start := time.Now()
	var mu sync.Mutex
	var bytes int64
	err := par.Do(ctx, len(todo), s.concurrency, func(ctx context.Context, i int) error {
		o := todo[i]
		rel := cacheRel(s.job, o.Path)
		final := filepath.Join(s.dir, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(final), 0o755); err != nil {
			return err
		}
		tmp := final + ".download"
		os.Remove(tmp)
		if err := download(ctx, s.store, o, tmp, nil); err != nil {
			return err
		}
		if err := os.Rename(tmp, final); err != nil {
			os.Remove(tmp)
			return err
		}
		e, err := checkpoint.EntryFor(final, o.SHA256)
		if err != nil {
			return err
		}
		mu.Lock()
		s.mu.idx.Files[rel] = e
		bytes += o.Size
		mu.Unlock()
		return nil
	})
	if err != nil {
		return err
	}
	took := time.Since(start)
	s.log.Info("standby synced checkpoint", "id", m.ID, "files", len(todo), "bytes", bytes, "duration", took)
	if s.OnSync != nil {
		s.OnSync(model.Transfer{Bytes: bytes, Objects: len(todo), Parallelism: min(s.concurrency, len(todo)),
			Seconds: took.Seconds(), From: "standby", Time: time.Now()})
	}
	return nil
}

// pruneLocked removes cached files (and index entries) no retained
// checkpoint references, and leftovers of interrupted downloads.
func (s *Standby) pruneLocked(wanted map[string]bool) error {
	for rel := range s.mu.idx.Files {
		if !wanted[rel] {
			delete(s.mu.idx.Files, rel)
		}
	}
	var dirs []string
	err := filepath.WalkDir(s.dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, rerr := filepath.Rel(s.dir, p)
		if rerr != nil {
			return rerr
		}
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if rel != "." {
				dirs = append(dirs, p)
			}
			return nil
		}
		if rel == CacheIndexName || strings.HasPrefix(rel, CacheIndexName) && !strings.Contains(rel, "/") {
			return nil
		}
		if !wanted[rel] {
			return os.Remove(p)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("prune: %w", err)
	}
	// Deepest first: remove directories left empty.
	sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
	for _, d := range dirs {
		os.Remove(d)
	}
	return nil
}
