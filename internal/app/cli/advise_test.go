package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"cairn/checkpoint"
	"cairn/recovery"
	"cairn/recovery/model"
	"cairn/state"
)

// adviseStore is a file store holding job j's manifests: no objects, only
// the figures the advisor reads.
type adviseStore struct {
	t     *testing.T
	dir   string
	store checkpoint.Store
}

func newAdviseStore(t *testing.T) *adviseStore {
	dir := t.TempDir()
	s, err := checkpoint.NewFileStore(dir, true)
	if err != nil {
		t.Fatal(err)
	}
	return &adviseStore{t: t, dir: dir, store: s}
}

var adviseT0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

// put commits checkpoint id (or savepoint sp) of mode: 10 s apart, sync 5
// ms, the rest of took async, uploaded up, referencing state bytes.
func (s *adviseStore) put(id uint64, sp string, mode checkpoint.Mode, chain int, took time.Duration, up, stateBytes int64) {
	m := &checkpoint.Manifest{FormatVersion: checkpoint.FormatVersion, Job: "j", ID: id, Mode: mode, KeyGroups: 8, ChainLength: chain,
		Time: adviseT0.Add(time.Duration(id) * 10 * time.Second),
		Figures: checkpoint.Figures{SyncMax: 5 * time.Millisecond, SyncPerSlot: []time.Duration{5 * time.Millisecond, 4 * time.Millisecond},
			Async: took - 5*time.Millisecond, BytesUploaded: up, FilesUploaded: 4, FullStateSize: stateBytes}}
	for i := range 2 {
		m.Slots = append(m.Slots, checkpoint.SlotInfo{Slot: i, Range: state.SlotRange(i, 2, 8)})
	}
	b, err := m.Encode()
	if err != nil {
		s.t.Fatal(err)
	}
	name := checkpoint.ManifestPath("j", id)
	if sp != "" {
		name = checkpoint.SavepointManifestPath("j", sp)
	}
	if err := s.store.Create(context.Background(), name, b); err != nil {
		s.t.Fatal(err)
	}
}

func (s *adviseStore) run(args ...string) string {
	s.t.Helper()
	var out, errb bytes.Buffer
	args = append(append([]string{}, args...), "--store", "file://"+s.dir, "--job", "j")
	if err := cmdCheckpoints(context.Background(), args, &out, &errb); err != nil {
		s.t.Fatalf("cairn checkpoints %v: %v\n%s", args, err, errb.String())
	}
	return out.String()
}

// calibrate gives dir's restore model 8 MiB/s downloads, 10 ms open and
// 1 s/GiB full decode.
func calibrate(t *testing.T, dir string) {
	mod := model.Load(dir)
	_, _ = mod.ObserveRestore(model.Input{Mode: model.Incremental, Source: model.SourceLocal}, 10*time.Millisecond, "test")
	if err := mod.ObserveTransfer(model.Transfer{Bytes: 8 << 20, Objects: 1, Seconds: 1, From: "test"}); err != nil {
		t.Fatal(err)
	}
	if _, err := mod.ObserveRestore(model.Input{Mode: model.Full, Source: model.SourceLocal, BytesRebuild: 1 << 30}, 1010*time.Millisecond, "test"); err != nil {
		t.Fatal(err)
	}
}

// TestAdviseCommand: `cairn checkpoints advise` says what is missing
// until both modes are measured and the model is calibrated, then
// recommends, with the same predicted restore as `checkpoints ls`.
func TestAdviseCommand(t *testing.T) {
	s := newAdviseStore(t)
	data := t.TempDir()
	for id := uint64(1); id <= 3; id++ {
		s.put(id, "", checkpoint.ModeIncremental, int(id), 100*time.Millisecond, 2<<20, 40<<20)
	}
	out := s.run("advise", "--data-dir", data)
	if !regexp.MustCompile(`(?m)^full +0 +- `).MatchString(out) {
		t.Errorf("advise lacks an empty full row:\n%s", out)
	}
	for _, want := range []string{"ADVICE: unknown", "api/action/checkpoint?mode=full", "calibrating"} {
		if !strings.Contains(out, want) {
			t.Errorf("advise with incremental checkpoints only lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "Recommended") {
		t.Errorf("a recommendation without a full checkpoint:\n%s", out)
	}

	// A full checkpoint and a calibrated model: 40 MiB incremental at
	// 8 MiB/s = 5 s; the full one's 20 MiB = 2.5 s + decode; it took 3 s,
	// under half the 10 s between checkpoints: full.
	s.put(4, "", checkpoint.ModeFull, 1, 3*time.Second, 20<<20, 20<<20)
	calibrate(t, data)
	out = s.run("advise", "--data-dir", data)
	for _, want := range []string{"ADVICE: full", "job j: 4 retained checkpoints (3 incremental, 1 full), interval 10s (measured between checkpoints)",
		"incremental saves 2.90 s per checkpoint", "Recommended: full"} {
		if !strings.Contains(out, want) {
			t.Errorf("advise lacks %q:\n%s", want, out)
		}
	}
	// The same prediction as `checkpoints ls` for the same checkpoint.
	mod := model.Load(data)
	ls := s.run("ls", "--data-dir", data)
	for _, c := range []struct {
		mode checkpoint.Mode
		f    checkpoint.Figures
	}{
		{checkpoint.ModeIncremental, checkpoint.Figures{SyncPerSlot: make([]time.Duration, 2), FilesUploaded: 4, FullStateSize: 40 << 20}},
		{checkpoint.ModeFull, checkpoint.Figures{SyncPerSlot: make([]time.Duration, 2), FilesUploaded: 4, FullStateSize: 20 << 20}},
	} {
		want := mod.Predict(recovery.StoreInput(c.mode, 0, 8, c.f)).Short()
		if want == "calibrating" || !strings.Contains(out, want) || !strings.Contains(ls, want) {
			t.Errorf("%s: predicted %s: in advise %v, in ls %v\n%s\n%s", c.mode, want, strings.Contains(out, want), strings.Contains(ls, want), out, ls)
		}
	}

	var j adviseJSON
	if err := json.Unmarshal([]byte(s.run("advise", "--data-dir", data, "--json")), &j); err != nil {
		t.Fatal(err)
	}
	if j.Recommend != model.RecommendFull || j.Full == nil || j.Full.RestoreSeconds == nil || j.Incremental == nil || j.Incremental.Checkpoints != 3 ||
		j.AddsToRestoreSeconds == nil || *j.AddsToRestoreSeconds <= 2 {
		t.Errorf("--json: %+v", j)
	}
}

// TestAdviseSavepoint: with no full checkpoint retained, the newest
// savepoint (a full checkpoint retention keeps) is the full measurement.
func TestAdviseSavepoint(t *testing.T) {
	s := newAdviseStore(t)
	data := t.TempDir()
	calibrate(t, data)
	s.put(1, "old", checkpoint.ModeFull, 1, 5*time.Second, 30<<20, 30<<20)
	s.put(2, "new", checkpoint.ModeFull, 1, 3*time.Second, 20<<20, 20<<20)
	s.put(3, "", checkpoint.ModeIncremental, 1, 100*time.Millisecond, 2<<20, 40<<20)
	s.put(4, "", checkpoint.ModeIncremental, 2, 100*time.Millisecond, 2<<20, 40<<20)
	out := s.run("advise", "--data-dir", data)
	for _, want := range []string{"savepoint:new", "a full checkpoint (savepoint new) takes 3.00 s", "ADVICE: full"} {
		if !strings.Contains(out, want) {
			t.Errorf("advise lacks %q:\n%s", want, out)
		}
	}
	// checkpoints ls lists the same savepoints as intact (it once loaded
	// them under the savepoint's name as the job's and called them CORRUPT).
	ls := s.run("ls")
	if strings.Contains(ls, "CORRUPT") || !strings.Contains(ls, "SAVEPOINTS") || !strings.Contains(ls, "new") {
		t.Errorf("checkpoints ls:\n%s", ls)
	}
}
