package runtime

import (
	"errors"
	"fmt"
	"os"

	"cairn/internal/app/job"
	"cairn/internal/base/datadir"
)

// ErrWouldStartOver refuses a start from nothing that the data directory
// shows to be wrong: the job committed checkpoints before, but the
// checkpoint store it was given holds none (a wrong or new store, a
// mistyped URL, a store emptied by hand). Starting anyway would read the
// input again from its first message and rebuild the state from it,
// silently: wrong wherever the input no longer starts at its first
// message, and slow everywhere.
var ErrWouldStartOver = errors.New("runtime: the job would start over from nothing")

// checkFreshStart looks for the data directory's evidence of committed
// checkpoints before a start with nothing to restore. The engine keeps the
// local copy of its newest committed checkpoint, and checkpoint ids are
// never reused, starting at 1 in an empty store: a local copy numbered 2
// or more means a checkpoint was committed before it. A lone copy of
// checkpoint 1 proves nothing (a crash during the very first checkpoint
// leaves one, uncommitted), so it is let through.
func checkFreshStart(j *job.Job, store string) error {
	dir := datadir.Checkpoints(j.DataDir)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil // none: nothing to go by
	}
	var newest uint64
	for _, e := range ents {
		if id, ok := datadir.ParseCheckpointName(e.Name()); ok {
			newest = max(newest, id)
		}
	}
	if newest < 2 {
		return nil
	}
	return fmt.Errorf("%w: the checkpoint store %s holds no checkpoint of job %s, but the data directory holds the local copy of its checkpoint %d (in %s), so checkpoints were committed before (to another store, or this one emptied since): "+
		"point checkpoint.store (or --store) at the store that holds them; or start over on purpose with --restore none (the input is read again from its first message, outputs already published are skipped)",
		ErrWouldStartOver, RedactURL(store), j.Name, newest, dir)
}
