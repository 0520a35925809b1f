// Package datadir owns the layout of a node's data directory and the
// durable-write helpers (fsync a folder, write a file atomically) every
// package that writes there uses.
//
// The layout, under the job's data_dir:
//
//	state/slot-<i>/                       the live database of slot i
//	checkpoints/chk-<20-digit id>/slot-<i>/ the node's local copy of a checkpoint (local recovery)
//	nats/                                 the embedded NATS server's store
//
// INVARIANT: these names are read by the engine, recovery, the standby, the
// drill and the CLI; they change only here, and a change strands the data
// of every node that upgrades.
package datadir

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Names of the layout.
const (
	StateDir       = "state"
	CheckpointsDir = "checkpoints"
	NATSDir        = "nats"
	slotPrefix     = "slot-"
	chkPrefix      = "chk-"
)

// State is the folder of the live slot databases.
func State(dataDir string) string { return filepath.Join(dataDir, StateDir) }

// Slot is where slot i's live database lives.
func Slot(dataDir string, i int) string { return SlotIn(State(dataDir), i) }

// SlotIn is slot i's folder inside a folder of slots (the live state, a
// local checkpoint copy, a restore's staging folder).
func SlotIn(dir string, i int) string { return filepath.Join(dir, SlotName(i)) }

// SlotName is the folder name of slot i.
func SlotName(i int) string { return slotPrefix + strconv.Itoa(i) }

// Checkpoints is the folder of the local checkpoint copies.
func Checkpoints(dataDir string) string { return filepath.Join(dataDir, CheckpointsDir) }

// Checkpoint is the local copy of checkpoint id inside a checkpoints folder.
func Checkpoint(checkpointsDir string, id uint64) string {
	return filepath.Join(checkpointsDir, CheckpointName(id))
}

// CheckpointName is the folder name of checkpoint id.
func CheckpointName(id uint64) string { return fmt.Sprintf("%s%020d", chkPrefix, id) }

// ParseCheckpointName returns the id of a local checkpoint folder name; ok
// is false for any other name.
func ParseCheckpointName(name string) (id uint64, ok bool) {
	digits, found := strings.CutPrefix(name, chkPrefix)
	if !found || len(digits) != 20 {
		return 0, false
	}
	id, err := strconv.ParseUint(digits, 10, 64)
	return id, err == nil
}

// SyncError is an fsync failure: fatal, never retried (a failed fsync may
// have dropped the dirty pages it was meant to write).
type SyncError struct {
	Path string
	Err  error
}

func (e *SyncError) Error() string { return fmt.Sprintf("fsync %s: %v", e.Path, e.Err) }
func (e *SyncError) Unwrap() error { return e.Err }

// SyncDir fsyncs a directory so that the entries created or renamed in it
// survive a crash. A failure is a *SyncError.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return &SyncError{Path: dir, Err: err}
	}
	return nil
}

// WriteFileAtomic writes data to path through a synced temp file and a
// rename, then syncs the folder: a crash leaves the old file or the new
// one, never a torn one.
func WriteFileAtomic(path string, data []byte) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		os.Remove(tmp)
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		os.Remove(tmp)
		return &SyncError{Path: tmp, Err: err}
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	return SyncDir(filepath.Dir(path))
}
