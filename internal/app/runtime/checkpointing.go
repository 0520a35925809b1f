package runtime

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"cairn/checkpoint"
	"cairn/engine"
	"cairn/internal/app/job"
	"cairn/internal/base/datadir"
	"cairn/recovery/model"
)

// abiVersion is recorded in every manifest.
const abiVersion = 1

// committer ships an engine barrier's local snapshots through a checkpoint.Writer.
type committer struct {
	log     *slog.Logger
	w       *checkpoint.Writer
	stream  string
	modules map[string]string
	// stateVersions are the keyed stages' declared state versions.
	stateVersions map[string]int
	// store and spRetain: after a savepoint commits, only the newest
	// spRetain savepoints are kept (0: all).
	store    checkpoint.Store
	job      string
	spRetain int
	// afterCommit, when set, is called after each committed checkpoint
	// (not savepoint) with its barrier and manifest: a job graph's
	// repartition purge and graph checkpoints.
	afterCommit []func(ctx context.Context, b engine.Barrier, m *checkpoint.Manifest)
	// afterSavepoint is called after each committed savepoint with its
	// barrier: a savepoint pins the repartition stream it reads from.
	afterSavepoint []func(b engine.Barrier)
	// model is the job's restore model: every commit's upload calibrates
	// its bandwidth, and the restore budget asks it (budget.go).
	model  *model.Model
	budget time.Duration
	slots  int
	// keyGroups is the job's key group count (a full checkpoint's
	// restore reads its data once per key group).
	keyGroups int
	// dataDir and storeURL (redacted): each commit is recorded in the
	// data directory (freshstart.go).
	dataDir, storeURL string

	mu struct {
		sync.Mutex
		// reasons are why a checkpoint's mode was chosen for it (the
		// restore budget), by id, for the dashboard.
		reasons map[uint64]string
		// unmet is set while the budget cannot be met (logged once).
		unmet bool
		// budget is what the restore budget measured so far; seeded is
		// set once it learned from the retained checkpoints.
		budget budgetState
		seeded bool
	}
}

// reason returns why checkpoint id's mode was chosen ("" when by default).
func (c *committer) reason(id uint64) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mu.reasons[id]
}

func (c *committer) Commit(ctx context.Context, b engine.Barrier) error {
	slots := b.Slots
	meta := checkpoint.Meta{
		SourceStream:  c.stream,
		SourceSeq:     b.SourceSeq,
		Modules:       c.modules,
		StateVersions: c.stateVersions,
		ABIVersion:    abiVersion,
		Mode:          checkpoint.Mode(b.Mode),
	}
	if name := b.Savepoint; name != "" {
		meta.Mode = ""
		if _, err := c.w.Savepoint(ctx, b.ID, name, meta, slots); err != nil {
			return err
		}
		for _, f := range c.afterSavepoint {
			f(b)
		}
		// The savepoint is committed: a failed prune is a warning, not a
		// failed savepoint.
		if deleted, err := checkpoint.PruneSavepoints(ctx, c.store, c.job, c.spRetain); err != nil {
			c.log.Warn("savepoints.retain: older savepoints not removed", "retain", c.spRetain, "err", err)
		} else if len(deleted) > 0 {
			c.log.Info("savepoints.retain: removed older savepoints", "retain", c.spRetain, "removed", deleted)
		}
		return nil
	}
	if meta.Mode == "" && c.budget > 0 {
		c.applyBudget(b.ID, &meta)
	}
	m, err := c.w.Commit(ctx, b.ID, meta, slots)
	if err != nil {
		return err
	}
	if c.budget > 0 {
		c.mu.Lock()
		if c.mu.seeded {
			c.mu.budget.observe(m)
		}
		c.mu.Unlock()
	}
	if c.model != nil {
		// Uploads calibrate the bandwidth until a download has.
		f := m.Figures
		_ = c.model.ObserveTransfer(model.Transfer{Bytes: f.BytesUploaded, Objects: f.FilesUploaded, Seconds: f.Async.Seconds(), Upload: true, From: "upload", Time: m.Time})
	}
	if c.dataDir != "" {
		lc := lastCommitted{Job: c.job, Store: c.storeURL, ID: m.ID, SourceSeq: m.SourceSeq, Time: m.Time}
		if err := noteCommitted(c.dataDir, lc); err != nil {
			c.log.Warn("the data directory's record of the last committed checkpoint not written (a start on an empty store will not be refused)", "id", m.ID, "err", err)
		}
	}
	for _, f := range c.afterCommit {
		f(ctx, b, m)
	}
	return nil
}

// applyBudget makes this checkpoint full when the restore budget asks it
// (budget.go), and says so.
func (c *committer) applyBudget(id uint64, meta *checkpoint.Meta) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.mu.seeded {
		c.mu.seeded = true
		for _, m := range c.w.Committed() {
			c.mu.budget.observe(m)
		}
	}
	d := budgetMode(c.budget, c.mu.budget, c.slots, c.keyGroups, c.model)
	if d.Full {
		meta.Mode = checkpoint.ModeFull
		if c.mu.reasons == nil {
			c.mu.reasons = map[uint64]string{}
		}
		c.mu.reasons[id] = d.Reason
		if len(c.mu.reasons) > 256 {
			for k := range c.mu.reasons {
				if k+256 < id {
					delete(c.mu.reasons, k)
				}
			}
		}
		c.log.Info("restore budget: this checkpoint is full", "id", id, "reason", d.Reason)
	}
	if d.Unmet && !c.mu.unmet {
		c.log.Warn("restore budget cannot be met with either checkpoint mode", "reason", d.Reason)
	}
	c.mu.unmet = d.Unmet
}

// StoreURL is the job's checkpoint store, defaulting to a folder in the data dir.
func StoreURL(j *job.Job) (string, error) {
	if j.Checkpoint.Store != "" {
		return j.Checkpoint.Store, nil
	}
	return checkpoint.FileStoreURL(filepath.Join(j.DataDir, "store"), true)
}

// setupCheckpoints opens the store and the writer and returns the engine's
// checkpoint configuration.
func setupCheckpoints(ctx context.Context, j *job.Job, hashes map[string]string, events checkpoint.EventListener, mod *model.Model, wrap func(checkpoint.Store) checkpoint.Store, log *slog.Logger) (*engine.CheckpointConfig, *checkpoint.Writer, checkpoint.Store, *committer, error) {
	u, err := StoreURL(j)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	if strings.HasPrefix(u, "s3://") {
		logAWSCredentials(log, u, os.Getenv)
	}
	if err := ensureFileStoreDir(u, j, log); err != nil {
		return nil, nil, nil, nil, err
	}
	store, err := checkpoint.OpenStore(ctx, u)
	if err != nil {
		return nil, nil, nil, nil, &job.Error{Field: "checkpoint.store", Reason: err.Error()}
	}
	if wrap != nil {
		store = wrap(store)
	}
	w, err := checkpoint.NewWriter(ctx, store, checkpoint.WriterConfig{
		Job:         j.Name,
		KeyGroups:   j.KeyGroups,
		Slots:       j.Slots,
		Mode:        checkpoint.Mode(j.Checkpoint.Mode),
		FullEvery:   j.Checkpoint.FullEvery,
		Retain:      j.Checkpoint.Retain,
		OrphanGrace: j.Checkpoint.OrphanGrace,
		Scrub:       scrubConfig(j.Checkpoint),
		Events:      events,
		Logger:      log,
	})
	if err != nil {
		_ = store.Close(ctx)
		return nil, nil, nil, nil, fmt.Errorf("checkpoint store %s: %w", RedactURL(u), err)
	}
	c := &committer{log: log, w: w, stream: j.Input.Stream, modules: hashes, store: store, job: j.Name, spRetain: j.Savepoints.Retain,
		model: mod, budget: j.Checkpoint.RestoreBudget, slots: j.Slots, keyGroups: j.KeyGroups, dataDir: j.DataDir, storeURL: RedactURL(u)}
	return &engine.CheckpointConfig{Interval: j.Checkpoint.Interval, Committer: c}, w, store, c, nil
}

var _ engine.Committer = (*committer)(nil)

// scrubConfig maps the job's scrub fields: a rate of "off" disables the
// background scrub (the checks at start and before a first reuse stay).
func scrubConfig(c *job.Checkpoint) checkpoint.ScrubConfig {
	sc := checkpoint.ScrubConfig{Every: c.ScrubEvery}
	switch c.ScrubRate {
	case "":
	case "off":
		sc.Disabled = true
	default:
		n, _ := job.ParseBytes(c.ScrubRate) // validated with the job
		sc.BytesPerSecond = n
	}
	return sc
}

// eventHub fans the checkpoint writer's events out to whoever subscribes
// (the dashboard's observer); the writer itself logs them and keeps no
// history.
type eventHub struct {
	mu   sync.Mutex
	subs []func(checkpoint.Stats)
}

func (h *eventHub) listener() checkpoint.EventListener {
	return checkpoint.EventListener{CheckpointEnd: func(s checkpoint.Stats) {
		h.mu.Lock()
		subs := h.subs
		h.mu.Unlock()
		for _, f := range subs {
			f(s)
		}
	}}
}

// subscribe adds f; it is called with the writer's lock held, so it must
// only take note.
func (h *eventHub) subscribe(f func(checkpoint.Stats)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.subs = append(h.subs, f)
}

// ensureFileStoreDir creates a missing file:// store directory on a job's
// first start, and refuses when the data directory shows that this job
// checkpointed before: a store that vanished, or a mistyped path, must not
// restart a job from nothing.
func ensureFileStoreDir(storeURL string, j *job.Job, log *slog.Logger) error {
	u, err := url.Parse(storeURL)
	if err != nil || u.Scheme != "file" || u.Query().Get("create_dir") != "" {
		return nil // OpenStore says what is wrong, or creates it as asked
	}
	dir, err := checkpoint.FileStorePath(u)
	if err != nil {
		return nil // OpenStore says what is wrong
	}
	if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if ents, _ := os.ReadDir(datadir.Checkpoints(j.DataDir)); len(ents) > 0 {
		return &job.Error{Field: "checkpoint.store", Reason: fmt.Sprintf(
			"the store directory %s does not exist, but the data directory %s holds checkpoints of this job: a mistyped path, or a store that is gone? Fix the path, or remove %s to start the job from nothing",
			dir, j.DataDir, datadir.Checkpoints(j.DataDir))}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return &job.Error{Field: "checkpoint.store", Reason: fmt.Sprintf("create the store directory %s: %v", dir, err)}
	}
	log.Info("created the checkpoint store directory (first start of this job)", "dir", dir)
	return nil
}
