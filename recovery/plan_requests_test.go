package recovery

import (
	"context"
	"io"
	"sync/atomic"
	"testing"

	"cairn/checkpoint"
)

// requestCountingStore counts the read requests (Get, GetRange) that reach
// the store.
type requestCountingStore struct {
	checkpoint.Store
	gets atomic.Int64
}

func (s *requestCountingStore) Get(ctx context.Context, name string) (io.ReadCloser, error) {
	s.gets.Add(1)
	return s.Store.Get(ctx, name)
}

func (s *requestCountingStore) GetRange(ctx context.Context, name string, off, n int64) (io.ReadCloser, error) {
	s.gets.Add(1)
	return s.Store.GetRange(ctx, name, off, n)
}

// TestPlanRequests: the plan counts the store requests a restore really
// makes — for a full checkpoint one ranged read per key group and one read
// per slot index, not one per object — for the same slot count, a
// scale-down and a scale-up, and an incremental checkpoint (one request
// per object); the model's input carries that count.
func TestPlanRequests(t *testing.T) {
	const keyGroups = 16
	for _, mode := range []checkpoint.Mode{checkpoint.ModeFull, checkpoint.ModeIncremental} {
		inner, err := checkpoint.NewFileStore(t.TempDir(), true)
		if err != nil {
			t.Fatal(err)
		}
		store := &requestCountingStore{Store: inner}
		e := newEnv(t, store, keyGroups, 2, mode, 3)
		// Enough keys that every key group holds some (a key group with
		// no keys has an empty segment, which is not requested).
		e.write(4000, 1<<20, 50, 0)
		m, want := e.checkpoint("")
		for _, to := range []int{2, 1, 4} {
			o := e.opts(t.TempDir(), to)
			p, err := PlanRestore(m, o)
			if err != nil {
				t.Fatal(err)
			}
			store.gets.Store(0)
			r, err := Restore(e.ctx, m, o)
			if err != nil {
				t.Fatal(err)
			}
			checkRestored(t, o.DataDir, keyGroups, to, want)
			got := int(store.gets.Load())
			if p.RequestsDownload != got {
				t.Fatalf("%s 2→%d: plan counts %d requests, the restore made %d", mode, to, p.RequestsDownload, got)
			}
			// The model's input: a full checkpoint's reads write no file
			// (Requests); an incremental checkpoint's objects are
			// downloaded whole into files (Objects), SSTs counted apart.
			in := p.Input()
			if in.Objects+in.Requests != got || (mode == checkpoint.ModeFull) != (in.Requests == got) {
				t.Fatalf("%s 2→%d: model input counts %d objects and %d requests, the restore made %d requests", mode, to, in.Objects, in.Requests, got)
			}
			// The dashboard's, ls's and show's input for the same restore
			// (from the store, same slots: m's figures, slots and key
			// groups) counts the same reads.
			if to == 2 {
				if si := StoreInput(m.Mode, len(m.Slots), m.KeyGroups, m.Figures); si.Objects != in.Objects || si.Requests != in.Requests {
					t.Fatalf("%s: StoreInput counts %d objects and %d requests, the plan %d and %d", mode, si.Objects, si.Requests, in.Objects, in.Requests)
				}
			}
			if ssts := countKind(m, checkpoint.KindSST); mode != checkpoint.ModeFull && (in.SSTs != ssts || ssts == 0 || ssts >= got) {
				t.Fatalf("incremental 2→%d: input counts %d SSTs of %d objects, the checkpoint has %d", to, in.SSTs, in.Objects, ssts)
			}
			switch mode {
			case checkpoint.ModeFull:
				// Two indexes (one per old slot) and a ranged read per
				// key group, whatever the new slot count.
				if got != 2+keyGroups || p.ObjectsDownload != len(m.Objects) {
					t.Fatalf("full 2→%d: %d requests for %d objects (want %d requests)", to, got, p.ObjectsDownload, 2+keyGroups)
				}
			default:
				if got != len(m.Objects) || r.FilesDownloaded != got {
					t.Fatalf("incremental 2→%d: %d requests, %d objects, %d files downloaded", to, got, len(m.Objects), r.FilesDownloaded)
				}
			}
			// Per new slot, as if it restored alone: the indexes of the old
			// slots it overlaps and the key groups it takes.
			for _, s := range p.Slots {
				want := 0
				if mode == checkpoint.ModeFull {
					want = len(s.From) + s.Range.Len()
				} else {
					want = s.ObjectsDownload
				}
				if si := s.Input(p); s.RequestsDownload != want || si.Objects+si.Requests != want {
					t.Fatalf("%s 2→%d slot %d: %d requests, want %d", mode, to, s.Slot, s.RequestsDownload, want)
				}
			}
		}
		for _, db := range e.dbs {
			db.Close()
		}
	}
}

func countKind(m *checkpoint.Manifest, kind checkpoint.Kind) int {
	n := 0
	for _, o := range m.Objects {
		if o.Kind == kind {
			n++
		}
	}
	return n
}
