package demo

import (
	"context"
	"log/slog"
	"path/filepath"
	"testing"

	"cairn/checkpoint"
	"cairn/internal/base/datadir"
	"cairn/recovery"
	"cairn/state"
)

// TestSeedState bulk-loads a small state into real Pebble DBs, commits it
// to a real file store, and restores it twice: from the job's local copy
// (nothing to download, as the job's first start does) and from the store
// onto an empty disk; both hold every ballast key, in its key group.
func TestSeedState(t *testing.T) {
	ctx := context.Background()
	store, err := checkpoint.NewFileStore(t.TempDir(), true)
	if err != nil {
		t.Fatal(err)
	}
	jobDir := filepath.Join(t.TempDir(), "job")
	const size = 2 << 20
	res, err := seedState(ctx, store, jobDir, 2, size, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if res.Keys != size/ballastValueLen || res.Bytes < size {
		t.Fatalf("seeded %+v, want %d keys and at least %d bytes", res, size/ballastValueLen, size)
	}
	m, err := checkpoint.Latest(ctx, store, demoJobName)
	if err != nil || m.ID != 1 || m.SourceSeq != 0 {
		t.Fatalf("latest checkpoint %+v, %v; want #1 at source sequence 0", m, err)
	}
	for _, c := range []struct {
		name, local string
	}{{"local copy", datadir.Checkpoints(jobDir)}, {"store", ""}} {
		dir := filepath.Join(t.TempDir(), "restored")
		o := recovery.Options{Store: store, Job: demoJobName, KeyGroups: demoKeyGroups, SourceStream: demoInputStream,
			Slots: 2, DataDir: dir, LocalDir: c.local, Logger: slog.New(slog.DiscardHandler)}
		p, err := recovery.PlanRestore(m, o)
		if err != nil {
			t.Fatal(err)
		}
		if (c.local != "") != (p.BytesDownload == 0) {
			t.Errorf("%s: the plan downloads %d bytes", c.name, p.BytesDownload)
		}
		if _, err := recovery.Restore(ctx, m, o); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		keys := 0
		for s := range 2 {
			rng := state.SlotRange(s, 2, demoKeyGroups)
			db, err := state.Open(datadir.Slot(dir, s), state.Options{KeyGroups: demoKeyGroups, Range: rng, ReadOnly: true})
			if err != nil {
				t.Fatal(err)
			}
			err = db.ScanRaw(rng, func(key, value []byte) error {
				k, err := state.DecodeKey(key)
				if err != nil {
					return err
				}
				if state.KeyGroup(k.UserKey, demoKeyGroups) != int(key[0])<<8|int(key[1]) || len(value) != ballastValueLen {
					t.Errorf("%s: key %q in the wrong key group or a value of %d bytes", c.name, k.UserKey, len(value))
				}
				keys++
				return nil
			})
			_ = db.Close()
			if err != nil {
				t.Fatal(err)
			}
		}
		if keys != res.Keys {
			t.Errorf("%s: restored %d keys, want %d", c.name, keys, res.Keys)
		}
	}
}
