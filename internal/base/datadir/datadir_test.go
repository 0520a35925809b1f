package datadir

import (
	"path/filepath"
	"testing"
)

// TestLayout pins the names: every node's data directory has them on disk.
func TestLayout(t *testing.T) {
	for got, want := range map[string]string{
		Slot("/d", 3):                              "/d/state/slot-3",
		Checkpoint(Checkpoints("/d"), 42):          "/d/checkpoints/chk-00000000000000000042",
		SlotIn(Checkpoint("/d/checkpoints", 1), 0): "/d/checkpoints/chk-00000000000000000001/slot-0",
	} {
		if got != filepath.FromSlash(want) {
			t.Errorf("got %s, want %s", got, want)
		}
	}
	for name, want := range map[string]uint64{"chk-00000000000000000042": 42, "chk-18446744073709551615": 1<<64 - 1} {
		if id, ok := ParseCheckpointName(name); !ok || id != want {
			t.Errorf("ParseCheckpointName(%q) = %d, %v", name, id, ok)
		}
	}
	for _, bad := range []string{"chk-42", "chk-0000000000000000004x", "slot-0", "chk-000000000000000000042", "chk-99999999999999999999"} {
		if _, ok := ParseCheckpointName(bad); ok {
			t.Errorf("ParseCheckpointName(%q) accepted", bad)
		}
	}
}
