package cli

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"cairn/checkpoint"
	"cairn/recovery/model"
	"cairn/state"
)

// TestShowRescalePreview: `checkpoints show --rescale-to N` prints per new
// slot the old slots, objects, bytes, key groups moved and a prediction —
// "calibrating" until the data directory's model has the terms, then the
// model's number, the same one `ls` prints for the same checkpoint.
func TestShowRescalePreview(t *testing.T) {
	m := &checkpoint.Manifest{FormatVersion: checkpoint.FormatVersion, Job: "j", ID: 7, Mode: checkpoint.ModeIncremental, KeyGroups: 8, ChainLength: 1}
	for i := range 2 {
		name := fmt.Sprintf("sst-%d", i)
		m.Slots = append(m.Slots, checkpoint.SlotInfo{Slot: i, Range: state.SlotRange(i, 2, 8)})
		m.Objects = append(m.Objects, checkpoint.Object{Path: "j/shared/" + name, File: name, Size: 4 << 20, SHA256: strings.Repeat("0", 64), Kind: checkpoint.KindSST, Slot: i})
	}
	store, err := checkpoint.NewFileStore(t.TempDir(), true)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	var out bytes.Buffer
	if err := showRestorePlan(&out, m, store, dir, 1); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "calibrating") || !strings.Contains(out.String(), "[0,7]") {
		t.Fatalf("uncalibrated preview:\n%s", out.String())
	}
	// Calibrate: open 10 ms, 8 MiB/s, move 1 s/GiB.
	mod := model.Load(dir)
	_, _ = mod.ObserveRestore(model.Input{Mode: model.Incremental, Source: model.SourceLocal}, 10*time.Millisecond, "test")
	_ = mod.ObserveTransfer(model.Transfer{Bytes: 8 << 20, Objects: 1, Seconds: 1, From: "test"})
	_, _ = mod.ObserveRestore(model.Input{Mode: model.Incremental, Source: model.SourceLocal, Rescale: model.Down, BytesRebuild: 1 << 30}, 1010*time.Millisecond, "test")
	out.Reset()
	if err := showRestorePlan(&out, m, store, dir, 1); err != nil {
		t.Fatal(err)
	}
	// 8 MiB at 8 MiB/s + 4 MiB moved at 1 s/GiB + 10 ms open.
	want := model.Seconds(1 + 4.0/1024 + 0.010)
	for _, s := range []string{"onto 1 slots (from 2)", "0,1", "8.0 MiB in 2", "4.0 MiB", want} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("preview lacks %q:\n%s", s, out.String())
		}
	}
}
