package statetool

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"

	"cairn/checkpoint"
	"cairn/internal/base/datadir"
	"cairn/recovery"
	"cairn/state"
)

// reader reads a checkpoint's state key group by key group, concurrently.
// A full checkpoint (every savepoint) is read straight from its canonical
// segments, one ranged read per key group; an incremental one is restored
// into a temporary directory first (one slot) and read from Pebble.
type reader struct {
	m     *checkpoint.Manifest
	store checkpoint.Store

	// Full: each slot's index, read once.
	mu      sync.Mutex
	indexes map[int]*checkpoint.SegmentIndex

	// Incremental: the restored DB and its directory.
	db  *state.DB
	tmp string
}

// openReader opens m for reading. tmpDir holds the restored DB of an
// incremental checkpoint ("": the system's).
func openReader(ctx context.Context, store checkpoint.Store, m *checkpoint.Manifest, tmpDir string) (*reader, error) {
	r := &reader{m: m, store: store, indexes: map[int]*checkpoint.SegmentIndex{}}
	if m.Mode == checkpoint.ModeFull {
		return r, nil
	}
	tmp, err := os.MkdirTemp(tmpDir, "cairn-state-")
	if err != nil {
		return nil, err
	}
	r.tmp = tmp
	if _, err := recovery.Restore(ctx, m, recovery.Options{Store: store, Job: m.Job, KeyGroups: m.KeyGroups, Slots: 1, DataDir: tmp,
		Logger: slog.New(slog.DiscardHandler)}); err != nil {
		os.RemoveAll(tmp)
		return nil, fmt.Errorf("restore checkpoint %d: %w", m.ID, err)
	}
	all := state.KeyGroupRange{First: 0, Last: m.KeyGroups - 1}
	if r.db, err = state.Open(datadir.Slot(tmp, 0), state.Options{KeyGroups: m.KeyGroups, Range: all, ReadOnly: true}); err != nil {
		os.RemoveAll(tmp)
		return nil, err
	}
	return r, nil
}

func (r *reader) Close() error {
	var err error
	if r.db != nil {
		err = r.db.Close()
	}
	if r.tmp != "" {
		os.RemoveAll(filepath.Clean(r.tmp))
	}
	return err
}

// keyGroup calls fn with every stored entry of key group kg, in key order.
func (r *reader) keyGroup(ctx context.Context, kg int, fn func(k, v []byte) error) error {
	if r.db != nil {
		return r.db.ScanRaw(state.KeyGroupRange{First: kg, Last: kg}, fn)
	}
	slot, x, err := r.index(ctx, kg)
	if err != nil {
		return err
	}
	return checkpoint.ReadSegment(ctx, r.store, r.m, slot, x, kg, fn)
}

// index returns the slot holding kg and its index, read once.
func (r *reader) index(ctx context.Context, kg int) (int, *checkpoint.SegmentIndex, error) {
	slot := state.SlotOf(kg, len(r.m.Slots), r.m.KeyGroups)
	r.mu.Lock()
	x := r.indexes[slot]
	r.mu.Unlock()
	if x != nil {
		return slot, x, nil
	}
	x, err := checkpoint.ReadIndex(ctx, r.store, r.m, slot)
	if err != nil {
		return 0, nil, err
	}
	r.mu.Lock()
	r.indexes[slot] = x
	r.mu.Unlock()
	return slot, x, nil
}

// ordered runs work(kg) for every key group on up to workers goroutines and
// hands each result to emit in key-group order, holding at most 2×workers
// results at a time. The first error stops everything.
func ordered[T any](ctx context.Context, keyGroups, workers int, work func(ctx context.Context, kg int) (T, error), emit func(kg int, v T) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	workers = max(1, workers)
	type res struct {
		v   T
		err error
	}
	window := 2 * workers
	slots := make([]chan res, keyGroups)
	for i := range slots {
		slots[i] = make(chan res, 1)
	}
	sem := make(chan struct{}, window)
	var wg sync.WaitGroup
	next := make(chan int)
	wg.Go(func() {
		defer close(next)
		for kg := range keyGroups {
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				return
			}
			select {
			case next <- kg:
			case <-ctx.Done():
				return
			}
		}
	})
	for range workers {
		wg.Go(func() {
			for kg := range next {
				v, err := work(ctx, kg)
				slots[kg] <- res{v, err}
			}
		})
	}
	var err error
	for kg := range keyGroups {
		var r res
		select {
		case r = <-slots[kg]:
		case <-ctx.Done():
			err = context.Cause(ctx)
		}
		if err != nil {
			break
		}
		<-sem
		if r.err != nil {
			err = fmt.Errorf("key group %d: %w", kg, r.err)
			break
		}
		if err = emit(kg, r.v); err != nil {
			break
		}
	}
	cancel(err)
	// Unblock the feeder and workers.
	go func() {
		for range sem {
		}
	}()
	wg.Wait()
	close(sem)
	return err
}

var _ io.Closer = (*reader)(nil)
