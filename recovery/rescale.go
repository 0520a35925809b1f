package recovery

// A rescaled restore of native (incremental) files: each new slot's key
// groups from the old slots that overlap it, clipped where the new range
// lies inside one old slot, ingested where it does not.
import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"cairn/checkpoint"
	"cairn/internal/base/datadir"
	"cairn/internal/base/par"
	"cairn/internal/base/procs"
	"cairn/state"
)

// overlapping returns the old slots whose ranges overlap r, in key order.
func (b *builder) overlapping(r state.KeyGroupRange) []int {
	var out []int
	for _, s := range b.m.Slots {
		if s.Range.Overlaps(r) {
			out = append(out, s.Slot)
		}
	}
	return out
}

func intersect(a, c state.KeyGroupRange) state.KeyGroupRange {
	return state.KeyGroupRange{First: max(a.First, c.First), Last: min(a.Last, c.Last)}
}

// rescaleNative restores an incremental checkpoint onto another slot
// count, as the old slots' native files clipped to the new ranges. Each new
// slot starts from the old slot it overlaps most: its SSTs hard-linked, its
// metadata copied, the DB opened and every key outside the new range
// excised (no key is rewritten). A new range inside one old slot (every
// slot of a scale-up) is then complete, and the next incremental checkpoint
// finds its SSTs already in the store. A new range that spans old slots (a
// scale-down) gets the key groups of the other overlapping old slots
// ingested, scanned from them in key order (the general, always-correct
// path of docs/DESIGN.md, "Facts about the parts underneath", for that part
// only).
func (b *builder) rescaleNative(ctx context.Context) error {
	src := filepath.Join(b.tmp, "src")
	if err := os.Mkdir(src, 0o755); err != nil {
		return err
	}
	base := make([]int, b.o.Slots) // the old slot each new slot is clipped from
	needed, scanned := map[int]bool{}, map[int]bool{}
	for i := range b.o.Slots {
		nr := state.SlotRange(i, b.o.Slots, b.m.KeyGroups)
		ov := b.overlapping(nr)
		base[i] = ov[0]
		for _, s := range ov {
			if intersect(nr, b.m.Slots[s].Range).Len() > intersect(nr, b.m.Slots[base[i]].Range).Len() {
				base[i] = s
			}
		}
		for _, s := range ov {
			needed[s] = true
			scanned[s] = scanned[s] || s != base[i]
		}
	}
	var old []int
	for s := range needed {
		old = append(old, s)
	}
	sort.Ints(old)
	// The sources are only read (a clipped slot copies what it may write
	// to): everything may be linked.
	if err := b.fetchSlots(ctx, src, old, func(checkpoint.Object) bool { return true }); err != nil {
		return err
	}
	b.prog.phase(PhaseBuild)
	dbs := make([]*state.DB, b.m.SlotCount())
	defer func() {
		for _, db := range dbs {
			if db != nil {
				db.Close()
			}
		}
	}()
	for _, s := range old {
		if !scanned[s] {
			continue
		}
		db, err := state.Open(datadir.SlotIn(src, s), b.slotOptions(b.m.SlotCount(), s, true))
		if err != nil {
			return fmt.Errorf("old slot %d: open: %w", s, err)
		}
		dbs[s] = db
	}
	return par.Do(ctx, b.o.Slots, procs.CPUs(), func(ctx context.Context, i int) error {
		nr := state.SlotRange(i, b.o.Slots, b.m.KeyGroups)
		return b.clip(ctx, datadir.SlotIn(src, base[i]), base[i], i, func(yield func(k, v []byte) error) error {
			for _, s := range b.overlapping(nr) {
				if s == base[i] {
					continue
				}
				if err := ctx.Err(); err != nil {
					return err
				}
				if err := dbs[s].ScanRaw(intersect(nr, b.m.Slots[s].Range), yield); err != nil {
					return fmt.Errorf("old slot %d: %w", s, err)
				}
			}
			return nil
		})
	})
}

// clip builds new slot i from old slot s's files in from: SSTs hard-linked
// (immutable), every other file copied (a read-write DB may append to or
// recycle it), the keys outside slot i's range excised, then the pairs of
// rest (the slot's key groups that old slot s does not hold) ingested.
func (b *builder) clip(ctx context.Context, from string, s, i int, rest func(yield func(k, v []byte) error) error) error {
	to := datadir.SlotIn(b.newState, i)
	if err := os.Mkdir(to, 0o755); err != nil {
		return fmt.Errorf("slot %d: %w", i, err)
	}
	for _, o := range b.m.SlotObjects(s) {
		if err := place(filepath.Join(from, o.File), filepath.Join(to, o.File), o.Kind == checkpoint.KindSST); err != nil {
			return fmt.Errorf("slot %d from old slot %d: %w", i, s, err)
		}
	}
	o := b.slotOptions(b.o.Slots, i, false)
	o.NoCompactions = true // the job's own open compacts
	db, err := state.Open(to, o)
	if err != nil {
		return fmt.Errorf("slot %d from old slot %d: open: %w", i, s, err)
	}
	if err := db.DeleteOutsideRange(ctx); err != nil {
		db.Close()
		return fmt.Errorf("slot %d from old slot %d: %w", i, s, err)
	}
	if err := db.IngestSorted(rest); err != nil {
		db.Close()
		return fmt.Errorf("slot %d: build: %w", i, err)
	}
	if err := db.Close(); err != nil {
		return fmt.Errorf("slot %d from old slot %d: close: %w", i, s, err)
	}
	return nil
}

// ingest builds new slot i from sorted pairs and closes it (the build's
// open is the validation).
func (b *builder) ingest(i int, kvs func(yield func(k, v []byte) error) error) error {
	db, err := state.IngestSorted(datadir.SlotIn(b.newState, i), b.slotOptions(b.o.Slots, i, false), kvs)
	if err != nil {
		return fmt.Errorf("slot %d: build: %w", i, err)
	}
	if err := db.Close(); err != nil {
		return fmt.Errorf("slot %d: build: %w", i, err)
	}
	return nil
}
