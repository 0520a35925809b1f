package recovery

import (
	"reflect"
	"strings"
	"testing"

	"cairn/checkpoint"
	"cairn/recovery/model"
	"cairn/state"
)

// TestPlanPerSlot: the rescale preview's arithmetic — per new slot, the
// old slots it takes, the objects and bytes it reads, the key groups that
// change slot and the bytes rebuilt — for a scale-down and a scale-up of
// an incremental checkpoint and a scale-up of a full one.
func TestPlanPerSlot(t *testing.T) {
	inc := &checkpoint.Manifest{FormatVersion: checkpoint.FormatVersion, Job: "j", ID: 7, Mode: checkpoint.ModeIncremental, KeyGroups: 8, ChainLength: 2,
		Slots: []checkpoint.SlotInfo{{Slot: 0, Range: state.KeyGroupRange{First: 0, Last: 3}}, {Slot: 1, Range: state.KeyGroupRange{First: 4, Last: 7}}},
		Objects: []checkpoint.Object{
			{Path: "a", Size: 100, Kind: checkpoint.KindSST, Slot: 0}, {Path: "b", Size: 100, Kind: checkpoint.KindMeta, Slot: 0},
			{Path: "c", Size: 300, Kind: checkpoint.KindSST, Slot: 1},
		}}
	fix := func(m *checkpoint.Manifest) {
		for i := range m.Objects {
			o := &m.Objects[i]
			o.File, o.Path, o.SHA256 = o.Path, "j/shared/"+o.Path, strings.Repeat("0", 64)
		}
	}
	fix(inc)
	store, err := checkpoint.NewFileStore(t.TempDir(), true)
	if err != nil {
		t.Fatal(err)
	}
	o := Options{Store: store, Job: "j", KeyGroups: 8, DataDir: t.TempDir(), Slots: 1}
	p, err := PlanRestore(inc, o)
	if err != nil {
		t.Fatal(err)
	}
	want := []SlotPlan{{Slot: 0, Range: state.KeyGroupRange{First: 0, Last: 7}, From: []int{0, 1}, Base: 0, Objects: 3, ObjectsDownload: 3, RequestsDownload: 3, Bytes: 500, BytesDownload: 500, KeyGroupsMoved: 4, BytesRebuild: 300}}
	if !reflect.DeepEqual(p.Slots, want) || p.BytesRebuild != 300 || p.ObjectsDownload != 3 {
		t.Fatalf("2→1: %+v", p)
	}
	if in := p.Input(); in.Rescale != model.Down || in.Source != model.SourceStore || in.BytesFetch != 500 || in.Objects != 3 || in.BytesRebuild != 300 || in.Parallelism != 8 {
		t.Fatalf("2→1 input %+v", in)
	}
	o.Slots = 4
	if p, err = PlanRestore(inc, o); err != nil {
		t.Fatal(err)
	}
	moved := []int{0, 2, 2, 2}
	bytes := []int64{200, 200, 300, 300}
	for i, s := range p.Slots {
		if s.KeyGroupsMoved != moved[i] || s.Bytes != bytes[i] || s.BytesRebuild != 0 || len(s.From) != 1 {
			t.Fatalf("2→4 slot %d: %+v", i, s)
		}
	}
	if p.BytesRebuild != 0 || p.Input().Rescale != model.Up {
		t.Fatalf("2→4: a scale-up clips, it moves nothing to rebuild: %+v", p)
	}
	if n := movedBytes(inc, 4); n != 0 {
		t.Fatalf("2→4: a restore reports %d bytes moved", n)
	}
	// 2 → 3: the middle slot takes key groups of both old slots; those of
	// the one that is not its base are moved.
	o.Slots = 3
	if p, err = PlanRestore(inc, o); err != nil {
		t.Fatal(err)
	}
	if p.BytesRebuild == 0 || p.Input().Rescale != model.Up || p.Input().BytesRebuild != p.BytesRebuild {
		t.Fatalf("2→3: the middle slot's key groups from its other old slot are not counted as moved: %+v", p)
	}
	if n := movedBytes(inc, 3); n != p.BytesRebuild {
		t.Fatalf("2→3: a restore reports %d bytes moved, the plan %d", n, p.BytesRebuild)
	}
	if in := ResultInput(&Result{Mode: checkpoint.ModeIncremental, Rescaled: true, FromSlots: 2, ToSlots: 3, BytesMoved: p.BytesRebuild}, 0); in.BytesRebuild != p.BytesRebuild || in.Rescale != model.Up {
		t.Fatalf("2→3 result input %+v", in)
	}
	o.Slots = 4
	full := &checkpoint.Manifest{FormatVersion: checkpoint.FormatVersion, Job: "j", ID: 8, Mode: checkpoint.ModeFull, KeyGroups: 8, ChainLength: 1,
		Slots:   []checkpoint.SlotInfo{{Slot: 0, Range: state.KeyGroupRange{First: 0, Last: 7}}},
		Objects: []checkpoint.Object{{Path: "d", Size: 1000, Kind: checkpoint.KindFullData, Slot: 0}, {Path: "i", Size: 10, Kind: checkpoint.KindIndex, Slot: 0}}}
	fix(full)
	if p, err = PlanRestore(full, o); err != nil {
		t.Fatal(err)
	}
	for _, s := range p.Slots {
		// Its index and a ranged read per key group of its two.
		if s.Bytes != 260 || s.BytesRebuild != 250 || s.Objects != 2 || s.RequestsDownload != 3 {
			t.Fatalf("full 1→4 slot %+v", s)
		}
	}
	// The index once, and each of the 8 key groups once.
	if p.BytesRebuild != 1000 || p.BytesDownload != 1010 || p.RequestsDownload != 9 || p.Input().Objects != 0 || p.Input().Requests != 9 {
		t.Fatalf("full 1→4: %+v", p)
	}
}
