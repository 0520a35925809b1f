package runtime

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"cairn/internal/app/job"
)

// ErrWouldStartOver refuses a start from nothing that the data directory
// shows to be wrong: the job committed checkpoints before, but the
// checkpoint store it was given holds none (a wrong or new store, a
// mistyped URL, a store emptied by hand). Starting anyway would read the
// input again from its first message and rebuild the state from it,
// silently: wrong wherever the input no longer starts at its first
// message, and slow everywhere.
var ErrWouldStartOver = errors.New("runtime: the job would start over from nothing")

// committedFile is the data directory's record of the job's newest
// committed checkpoint: the evidence a start with nothing to restore is
// checked against. Rewritten after every commit, removed by --restore none.
const committedFile = "last-committed.json"

// lastCommitted is committedFile's content.
type lastCommitted struct {
	Job       string    `json:"job"`
	Store     string    `json:"store"` // redacted
	ID        uint64    `json:"id"`
	SourceSeq uint64    `json:"source_seq"`
	Time      time.Time `json:"time"`
}

// noteCommitted records a committed checkpoint in the data directory. It
// is evidence, not state: written through a temporary file and a rename,
// without fsync (a crash that loses it loses only the refusal it would
// give); a failure is logged by the caller and changes nothing else.
func noteCommitted(dataDir string, c lastCommitted) error {
	b, err := json.Marshal(c)
	if err != nil {
		return err
	}
	tmp := filepath.Join(dataDir, "."+committedFile+".tmp")
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dataDir, committedFile))
}

// checkFreshStart refuses a start with nothing to restore when the data
// directory records a checkpoint this job committed. restoreNone (the
// start over on purpose) drops the record instead.
func checkFreshStart(j *job.Job, store string, restoreNone bool) error {
	path := filepath.Join(j.DataDir, committedFile)
	if restoreNone {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("--restore none: remove %s: %w", path, err)
		}
		return nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil // none: nothing to go by
	}
	var c lastCommitted
	if json.Unmarshal(b, &c) != nil || c.Job != j.Name || c.ID == 0 {
		return nil // not ours, or damaged: no evidence
	}
	where := "this store"
	if c.Store != RedactURL(store) {
		where = "the store " + c.Store
	}
	return fmt.Errorf("%w: the checkpoint store %s holds no checkpoint of job %s, but the data directory records that checkpoint %d (input position %d) was committed to %s at %s (%s): "+
		"point checkpoint.store (or --store) at the store that holds it; or start over on purpose with --restore none (the input is read again from its first message, outputs already published are skipped)",
		ErrWouldStartOver, RedactURL(store), j.Name, c.ID, c.SourceSeq, where, c.Time.UTC().Format(time.RFC3339), path)
}
