package recovery

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"cairn/internal/base/datadir"
)

// oldStates lists the renamed-away states in dataDir.
func oldStates(t *testing.T, dataDir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dataDir)
	if err != nil {
		t.Fatal(err)
	}
	var olds []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), oldStatePrefix) {
			olds = append(olds, e.Name())
		}
	}
	return olds
}

func writeFile(t *testing.T, p, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestSwapStateRemovesTheOldStateAfterReturning: the new state is in place
// when swapState returns, and the replaced one is gone once removed closes.
func TestSwapStateRemovesTheOldStateAfterReturning(t *testing.T) {
	dataDir := t.TempDir()
	for i := range 200 {
		writeFile(t, filepath.Join(datadir.State(dataDir), "slot-0", fmt.Sprintf("%06d.sst", i)), "old")
	}
	newState := filepath.Join(dataDir, tmpPrefix+"1", "state")
	writeFile(t, filepath.Join(newState, "slot-0", "new.sst"), "new")
	removed, err := swapState(dataDir, newState, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(datadir.State(dataDir), "slot-0", "new.sst")); err != nil || string(b) != "new" {
		t.Fatalf("the new state is not in place: %q, %v", b, err)
	}
	<-removed
	if olds := oldStates(t, dataDir); len(olds) != 0 {
		t.Fatalf("the replaced state is still on disk: %v", olds)
	}
	// With no state to replace, removed is closed at once.
	empty := t.TempDir()
	newState = filepath.Join(empty, tmpPrefix+"1", "state")
	writeFile(t, filepath.Join(newState, "slot-0", "new.sst"), "new")
	removed, err = swapState(empty, newState, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	<-removed
}

// TestCleanDataDirRemovesAnOldStateACrashLeft: a crash while the old state
// was being removed leaves it renamed away beside the new one; the next
// restore's cleanDataDir removes it and keeps the current state.
func TestCleanDataDirRemovesAnOldStateACrashLeft(t *testing.T) {
	dataDir := t.TempDir()
	writeFile(t, filepath.Join(datadir.State(dataDir), "slot-0", "new.sst"), "new")
	writeFile(t, filepath.Join(dataDir, oldStatePrefix+"00000000000000000001", "slot-0", "old.sst"), "old")
	if err := cleanDataDir(dataDir); err != nil {
		t.Fatal(err)
	}
	if olds := oldStates(t, dataDir); len(olds) != 0 {
		t.Fatalf("left: %v", olds)
	}
	if b, err := os.ReadFile(filepath.Join(datadir.State(dataDir), "slot-0", "new.sst")); err != nil || string(b) != "new" {
		t.Fatalf("the current state changed: %q, %v", b, err)
	}
}

// TestCleanDataDirForAnEmptyStart: a start that restores nothing removes a
// replaced state a killed process left (and, as for a crash between
// swapState's renames, puts a lone old state back first, so the caller's
// removal of the state takes it); a data directory that does not exist is
// clean.
func TestCleanDataDirForAnEmptyStart(t *testing.T) {
	dataDir := t.TempDir()
	writeFile(t, filepath.Join(datadir.State(dataDir), "slot-0", "new.sst"), "new")
	writeFile(t, filepath.Join(dataDir, oldStatePrefix+"00000000000000000001", "slot-0", "old.sst"), "old")
	if err := CleanDataDir(dataDir); err != nil {
		t.Fatal(err)
	}
	if olds := oldStates(t, dataDir); len(olds) != 0 {
		t.Fatalf("left: %v", olds)
	}
	if err := CleanDataDir(filepath.Join(dataDir, "missing")); err != nil {
		t.Fatalf("a missing data directory: %v", err)
	}
}
