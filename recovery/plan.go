package recovery

import (
	"cairn/checkpoint"
	"cairn/internal/base/procs"
	"cairn/recovery/model"
	"cairn/state"
)

// Plan is what a restore of a manifest will read, told before it runs: the
// bytes it finds on local disk (the node's local checkpoint copy, a standby
// cache) and the bytes it must download from the store, and per new slot
// what it fetches and which key groups move.
type Plan struct {
	ID          uint64
	Mode        checkpoint.Mode
	ChainLength int
	FromSlots   int
	ToSlots     int
	Rescaled    bool
	// BytesLocal is found on local disk (BytesCache of it in the standby
	// cache); BytesDownload comes from the store, in ObjectsDownload
	// objects read with RequestsDownload requests (fullRequests).
	BytesLocal, BytesCache, BytesDownload int64
	Files, ObjectsDownload                int
	RequestsDownload                      int
	// SSTsDownload is how many of ObjectsDownload are SSTs (an online
	// restore leaves them in the store and downloads the rest).
	SSTsDownload int
	// BytesRebuild is what the rebuild works on: a full checkpoint's data
	// segments (decoded and ingested); for an incremental scale-down, the
	// key groups scanned from old slots that are not a new slot's base.
	BytesRebuild int64
	// Concurrency is the download parallelism.
	Concurrency int
	// Slots is one entry per new slot.
	Slots []SlotPlan
}

// SlotPlan is one new slot of a restore.
type SlotPlan struct {
	Slot  int
	Range state.KeyGroupRange
	// From are the old slots whose state the new slot takes, Base the one
	// it is built from (incremental: hard links clipped to the range).
	From []int
	Base int
	// Objects and Bytes are what the slot reads, wherever from (a full
	// checkpoint's data counted by the slot's share of the key groups);
	// ObjectsDownload and BytesDownload of them come from the store, read
	// with RequestsDownload requests (as if the slot restored alone).
	Objects, ObjectsDownload, RequestsDownload int
	Bytes, BytesDownload                       int64
	// KeyGroupsMoved counts the slot's key groups that another slot
	// index held before; BytesRebuild is as Plan's, for this slot.
	KeyGroupsMoved int
	BytesRebuild   int64
}

// PlanRestore tells what Restore(m, o) would read, by the same rules as the
// restore itself (a local file counts when its trust index or its content
// matches the manifest), without writing anything. A full checkpoint reads
// only the key groups' segments it needs; the plan counts every segment,
// which is what a restore onto any slot count reads in total.
func PlanRestore(m *checkpoint.Manifest, o Options) (Plan, error) {
	if err := check(m, &o); err != nil {
		return Plan{}, err
	}
	p := Plan{
		ID: m.ID, Mode: m.Mode, ChainLength: m.ChainLength, FromSlots: m.SlotCount(), ToSlots: o.Slots,
		Rescaled: o.Slots != m.SlotCount(), Files: len(m.Objects), Concurrency: o.Concurrency,
	}
	f := newFetcher(m, &o, &counters{})
	down := make([]bool, len(m.Objects))
	for i, obj := range m.Objects {
		_, local := f.candidate(obj, fromLocal)
		if !local {
			if _, local = f.candidate(obj, fromCache); local {
				p.BytesCache += obj.Size
			}
		}
		if local {
			p.BytesLocal += obj.Size
		} else {
			p.BytesDownload += obj.Size
			p.ObjectsDownload++
			down[i] = true
			if obj.Kind == checkpoint.KindSST {
				p.SSTsDownload++
			}
		}
		if obj.Kind == checkpoint.KindFullData {
			p.BytesRebuild += obj.Size
		}
	}
	b := &builder{m: m, o: &o}
	for i, obj := range m.Objects {
		if down[i] {
			p.RequestsDownload += requestsAll(b, obj, o.Slots)
		}
	}
	old := map[int]state.KeyGroupRange{}
	for _, s := range m.Slots {
		old[s.Slot] = s.Range
	}
	var moved int64
	for i := range o.Slots {
		nr := state.SlotRange(i, o.Slots, m.KeyGroups)
		sp := SlotPlan{Slot: i, Range: nr, Base: baseSlot(m, old, nr)}
		for _, s := range m.Slots {
			if s.Range.Overlaps(nr) {
				sp.From = append(sp.From, s.Slot)
			}
		}
		for kg := nr.First; kg <= nr.Last; kg++ {
			if r, ok := old[i]; !ok || !r.Contains(kg) {
				sp.KeyGroupsMoved++
			}
		}
		for j, obj := range m.Objects {
			r, ok := old[obj.Slot]
			if !ok || !r.Overlaps(nr) {
				continue
			}
			size := obj.Size
			if obj.Kind == checkpoint.KindFullData && r.Len() > 0 {
				// Range reads: the slot's share of the key groups.
				size = obj.Size * int64(intersect(nr, r).Len()) / int64(r.Len())
				sp.BytesRebuild += size
			} else if m.Mode == checkpoint.ModeIncremental && obj.Slot != sp.Base && r.Len() > 0 {
				// Scanned from a non-base old slot and ingested.
				share := obj.Size * int64(intersect(nr, r).Len()) / int64(r.Len())
				sp.BytesRebuild += share
				moved += share
			}
			sp.Objects++
			sp.Bytes += size
			if down[j] {
				sp.ObjectsDownload++
				sp.BytesDownload += size
				sp.RequestsDownload += requests(b, obj, nr)
			}
		}
		p.Slots = append(p.Slots, sp)
	}
	if m.Mode == checkpoint.ModeIncremental {
		p.BytesRebuild = moved
	}
	return p, nil
}

// requests is the store requests the restore makes to read object o for the
// new slot of range nr, by the rules of builder.full and
// checkpoint.ReadSegment: a full checkpoint's data object is read with one
// ranged request per key group the slot takes from it (over the same old
// slots, builder.overlapping, and ranges, intersect, that the restore walks);
// every other object (an index, read whole by checkpoint.ReadIndex; an
// incremental checkpoint's files) with one request. A key group with no keys
// has an empty segment, which ReadSegment does not request: for a state
// with empty key groups the count is an upper bound.
func requests(b *builder, o checkpoint.Object, nr state.KeyGroupRange) int {
	if b.m.Mode != checkpoint.ModeFull || o.Kind != checkpoint.KindFullData {
		return 1
	}
	n := 0
	for _, s := range b.overlapping(nr) {
		if s == o.Slot {
			n += intersect(nr, b.m.Slots[s].Range).Len()
		}
	}
	return n
}

// requestsAll is requests over every new slot of a restore onto slots: an
// index is read once for all of them (builder.full reads each old slot's
// index once), a data object once per key group of each new slot.
func requestsAll(b *builder, o checkpoint.Object, slots int) int {
	if b.m.Mode != checkpoint.ModeFull || o.Kind != checkpoint.KindFullData {
		return 1
	}
	n := 0
	for i := range slots {
		n += requests(b, o, state.SlotRange(i, slots, b.m.KeyGroups))
	}
	return n
}

// rescale names the plan's change of slot count for the model.
func (p Plan) rescale() string {
	switch {
	case p.ToSlots > p.FromSlots:
		return model.Up
	case p.ToSlots < p.FromSlots:
		return model.Down
	}
	return model.Same
}

// source names where most of the plan's bytes come from.
func (p Plan) source() string {
	switch {
	case p.BytesDownload == 0 && p.BytesCache == 0:
		return model.SourceLocal
	case p.BytesCache > 0 && p.BytesCache >= p.BytesDownload:
		return model.SourceStandby
	case p.BytesDownload == 0:
		return model.SourceStandby
	}
	return model.SourceStore
}

// Input is the plan as the restore model's input. An incremental
// checkpoint's objects are downloaded whole, each into a file (the model's
// Objects); a full checkpoint's are read into memory (its indexes) or
// streamed into the rebuild (its key-group segments, ranged): reads that
// write no file, the model's Requests.
func (p Plan) Input() model.Input {
	in := model.Input{
		Mode: string(p.Mode), Source: p.source(), Rescale: p.rescale(),
		BytesFetch: p.BytesDownload, BytesRebuild: p.BytesRebuild, Parallelism: p.Concurrency,
		Workers: min(max(1, p.ToSlots), procs.CPUs()),
	}
	in.Objects, in.Requests = splitRequests(p.Mode, p.RequestsDownload)
	if in.Objects > 0 {
		in.SSTs = p.SSTsDownload
	}
	return in
}

// splitRequests is a restore's store reads as the model counts them: whole
// objects written to files (incremental) or reads that write no file
// (full).
func splitRequests(mode checkpoint.Mode, requests int) (objects, reads int) {
	if mode == checkpoint.ModeFull {
		return 0, requests
	}
	return requests, 0
}

// Input is one new slot's restore as the model's input, as if it ran alone.
func (s SlotPlan) Input(p Plan) model.Input {
	in := p.Input()
	in.Objects, in.Requests = splitRequests(p.Mode, s.RequestsDownload)
	in.BytesFetch, in.BytesRebuild, in.Workers, in.SSTs = s.BytesDownload, s.BytesRebuild, 1, 0
	return in
}

// ResultInput is a finished restore as the model's input (what it
// measured, to calibrate the model with).
func ResultInput(r *Result, concurrency int) model.Input {
	p := Plan{Mode: r.Mode, FromSlots: r.FromSlots, ToSlots: r.ToSlots, BytesLocal: r.BytesLocal + r.BytesCache,
		BytesCache: r.BytesCache, BytesDownload: r.BytesDownloaded, ObjectsDownload: r.FilesDownloaded, Concurrency: concurrency,
		RequestsDownload: r.FilesDownloaded}
	in := p.Input()
	if r.Mode == checkpoint.ModeFull {
		// A Result counts a full checkpoint's files, not its ranged
		// reads (fewer than PlanRestore counts): no request count, so
		// that this restore does not measure the request term.
		in.Requests = 0
	}
	// A Result does not say what was rebuilt: a full checkpoint decodes its
	// state; a scale-down scans about 1 - to/from of it from old slots that
	// are not a new slot's base (exact for 2→1, 4→2).
	switch {
	case r.Mode == checkpoint.ModeFull:
		in.BytesRebuild = r.Figures.FullStateSize
	case r.BytesMoved > 0:
		in.BytesRebuild = r.BytesMoved
	case r.ToSlots < r.FromSlots && r.FromSlots > 0:
		in.BytesRebuild = r.Figures.FullStateSize * int64(r.FromSlots-r.ToSlots) / int64(r.FromSlots)
	}
	return in
}

// baseSlot is the old slot (of m, whose ranges are old) that a new slot
// with key groups nr is built on: the one overlapping it most, the first
// such in manifest order on a tie; -1 when none overlaps.
func baseSlot(m *checkpoint.Manifest, old map[int]state.KeyGroupRange, nr state.KeyGroupRange) int {
	base := -1
	for _, s := range m.Slots {
		if s.Range.Overlaps(nr) && (base < 0 || intersect(nr, s.Range).Len() > intersect(nr, old[base]).Len()) {
			base = s.Slot
		}
	}
	return base
}

// movedBytes is what a restore of incremental checkpoint m onto slots
// scans from old slots that are not a new slot's base and ingests: each
// such old slot's files, times the share of its key groups the new slot
// takes (PlanRestore's BytesRebuild of an incremental checkpoint).
func movedBytes(m *checkpoint.Manifest, slots int) int64 {
	old := map[int]state.KeyGroupRange{}
	for _, s := range m.Slots {
		old[s.Slot] = s.Range
	}
	var moved int64
	for i := range slots {
		nr := state.SlotRange(i, slots, m.KeyGroups)
		base := baseSlot(m, old, nr)
		for _, obj := range m.Objects {
			r, ok := old[obj.Slot]
			if ok && r.Overlaps(nr) && obj.Slot != base && r.Len() > 0 {
				moved += obj.Size * int64(intersect(nr, r).Len()) / int64(r.Len())
			}
		}
	}
	return moved
}

// StoreInput is the model's input for a restore of a checkpoint from the
// store onto its own slot count, from its recorded figures alone: what the
// dashboard, `cairn checkpoints ls|show` and the drill's checkpoint list
// predict for every checkpoint (one number for one checkpoint).
//
// slots is the checkpoint's slot count (0: len(f.SyncPerSlot)), keyGroups
// its key groups (0: unknown).
func StoreInput(mode checkpoint.Mode, slots, keyGroups int, f checkpoint.Figures) model.Input {
	if slots <= 0 {
		slots = len(f.SyncPerSlot)
	}
	in := model.Input{Mode: string(mode), Source: model.SourceStore, Rescale: model.Same,
		BytesFetch: f.FullStateSize, Workers: min(max(1, slots), procs.CPUs())}
	requests := f.FilesUploaded + f.FilesReused
	if mode == checkpoint.ModeFull && keyGroups > 0 && slots > 0 {
		// What PlanRestore counts for the same restore: each slot's index
		// once, its data object once per key group.
		requests = slots + keyGroups
	}
	in.Objects, in.Requests = splitRequests(mode, requests)
	if mode == checkpoint.ModeFull {
		in.BytesRebuild = f.FullStateSize
	}
	return in
}
