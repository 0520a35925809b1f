package recovery

// Putting a restored state in place: fsync the new tree, clear what an
// interrupted restore left, and swap the state directory atomically.
import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"cairn/checkpoint"
	"cairn/internal/base/datadir"
)

// syncTree fsyncs every directory under (and including) root; file contents
// were synced when written, or are hard links to durable files.
func syncTree(root string) error {
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			return checkpoint.SyncDir(p)
		}
		return nil
	})
}

// CleanDataDir is cleanDataDir for a start that restores nothing: a state
// replaced by an earlier restore and not yet removed (its removal runs
// after Restore returns, see swapState) goes with the rest. A data
// directory that does not exist is clean.
func CleanDataDir(dataDir string) error {
	if err := cleanDataDir(dataDir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// cleanDataDir finishes or undoes what a crashed restore left: temporary
// directories are removed; when state is missing but a renamed-away old
// state exists (a crash between the two renames of swapState), it is put
// back, so the data directory is never left without its state.
func cleanDataDir(dataDir string) error {
	ents, err := os.ReadDir(dataDir)
	if err != nil {
		return err
	}
	cur := datadir.State(dataDir)
	_, statErr := os.Lstat(cur)
	var olds []string
	for _, e := range ents {
		switch {
		case strings.HasPrefix(e.Name(), tmpPrefix):
			if err := os.RemoveAll(filepath.Join(dataDir, e.Name())); err != nil {
				return err
			}
		case strings.HasPrefix(e.Name(), oldStatePrefix):
			olds = append(olds, e.Name())
		}
	}
	sort.Strings(olds) // names carry a zero-padded time: newest last
	if errors.Is(statErr, fs.ErrNotExist) && len(olds) > 0 {
		newest := olds[len(olds)-1]
		olds = olds[:len(olds)-1]
		if err := os.Rename(filepath.Join(dataDir, newest), cur); err != nil {
			return err
		}
		if err := checkpoint.SyncDir(dataDir); err != nil {
			return err
		}
	}
	for _, n := range olds {
		if err := os.RemoveAll(filepath.Join(dataDir, n)); err != nil {
			return err
		}
	}
	return nil
}

// swapState replaces dataDir/state by newState: rename the old away, rename
// the new in, fsync the data directory. The old state is removed in the
// background (removed is closed then): freeing a downloaded state of
// hundreds of MiB takes longer than the rest of a small restore, and
// nothing waits for it. A crash meanwhile leaves it renamed away, and the
// next restore's cleanDataDir removes it.
func swapState(dataDir, newState string, log *slog.Logger) (removed <-chan struct{}, err error) {
	done := make(chan struct{})
	cur := datadir.State(dataDir)
	old := ""
	if _, err := os.Lstat(cur); err == nil {
		old = filepath.Join(dataDir, fmt.Sprintf("%s%020d", oldStatePrefix, time.Now().UnixNano()))
		if err := os.Rename(cur, old); err != nil {
			return nil, fmt.Errorf("swap: %w", err)
		}
	}
	if err := os.Rename(newState, cur); err != nil {
		if old != "" {
			if rerr := os.Rename(old, cur); rerr != nil {
				return nil, fmt.Errorf("swap: %w (and putting the old state back failed: %v; it is at %s)", err, rerr, old)
			}
		}
		return nil, fmt.Errorf("swap: %w", err)
	}
	// INVARIANT: an fsync failure is fatal and not retried.
	if err := checkpoint.SyncDir(dataDir); err != nil {
		return nil, fmt.Errorf("swap: %w", err)
	}
	if old == "" {
		close(done)
		return done, nil
	}
	go func() {
		defer close(done)
		if err := os.RemoveAll(old); err != nil {
			log.Warn("restore: the replaced state stays on disk until the next restore removes it", "dir", old, "err", err)
		}
	}()
	return done, nil
}
