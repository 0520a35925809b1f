package runtime

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"cairn/checkpoint"
	"cairn/internal/app/job"
	"cairn/state"
)

// noEntries is a savepoint's empty state.
type noEntries struct{}

func (noEntries) ScanRaw(state.KeyGroupRange, func(k, v []byte) error) error { return nil }

// failGets fails every read of an object whose name contains part.
type failGets struct {
	checkpoint.Store
	part string
	err  error
}

func (f failGets) Get(ctx context.Context, name string) (io.ReadCloser, error) {
	if strings.Contains(name, f.part) {
		return nil, f.err
	}
	return f.Store.Get(ctx, name)
}

// TestSavepointsPin: the purge's bound from a downstream's savepoints is
// the oldest one's position + 1; a corrupt savepoint needs nothing; one
// that cannot be read for another reason (here a store error) is an
// error, so that nothing is purged below a position that is unknown (it
// was skipped as if corrupt, and the purge could pass a savepoint a later
// restore needs).
func TestSavepointsPin(t *testing.T) {
	ctx := context.Background()
	store, err := checkpoint.OpenStore(ctx, "file://"+t.TempDir()+"?create_dir=true")
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close(ctx)
	const name = "g.s1"
	for _, sp := range []struct {
		name string
		seq  uint64
	}{{"late", 900}, {"early", 400}, {"middle", 600}} {
		spec := checkpoint.BuildSpec{Job: name, Name: sp.name, ID: 1, KeyGroups: 4, Slots: 1, Meta: checkpoint.Meta{SourceStream: "RP", SourceSeq: sp.seq}, Logger: quietLog()}
		if _, err := checkpoint.BuildSavepoint(ctx, store, spec, noEntries{}); err != nil {
			t.Fatal(err)
		}
	}
	if pin, err := savepointsPin(ctx, store, name); err != nil || pin != 401 {
		t.Fatalf("pin %d, %v: want 401", pin, err)
	}
	// The oldest corrupt: the next one pins.
	corrupt := failGets{store, "/savepoints/early/", &checkpoint.CorruptionError{Object: "early", Reason: "bit flip"}}
	if pin, err := savepointsPin(ctx, corrupt, name); err != nil || pin != 601 {
		t.Fatalf("with the oldest corrupt: pin %d, %v: want 601", pin, err)
	}
	// The oldest unreadable: no bound at all.
	down := errors.New("store: connection reset")
	unreadable := failGets{store, "/savepoints/early/", down}
	pin, err := savepointsPin(ctx, unreadable, name)
	var ue *unreadableSavepointError
	if !errors.As(err, &ue) || !errors.Is(err, down) || ue.name != "early" {
		t.Fatalf("with the oldest unreadable: pin %d, %v: want an unreadableSavepointError naming early", pin, err)
	}
	// A downstream in this process pins the whole stream then, until its
	// next start (a downstream elsewhere is not purged at that commit:
	// remoteReader.cutoff returns the same error).
	if pin, err := savepointPin(ctx, &Running{Store: unreadable, Job: &job.Job{Name: name}}, quietLog()); err != nil || pin != 1 {
		t.Fatalf("savepointPin with an unreadable savepoint: %d, %v: want 1 (nothing purged)", pin, err)
	}
}
