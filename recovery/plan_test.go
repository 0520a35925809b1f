package recovery

import (
	"os"
	"path/filepath"
	"testing"

	"cairn/checkpoint"
	"cairn/internal/base/datadir"
)

// TestPlanRestore: the plan tells, before a restore, the bytes the restore
// then reads locally and downloads: an intact local copy, one corrupt local
// file, no local copy, and a full checkpoint (never local).
func TestPlanRestore(t *testing.T) {
	e := newEnv(t, nil, 32, 2, checkpoint.ModeIncremental, 5)
	e.write(20000, 30000, 80, 0)
	m, _ := e.checkpoint("")
	for _, db := range e.dbs {
		db.Close()
	}
	o := e.opts(t.TempDir(), 0)
	o.LocalDir = e.localDir
	agree := func(what string, m *checkpoint.Manifest, o Options) {
		t.Helper()
		p, err := PlanRestore(m, o)
		if err != nil {
			t.Fatal(err)
		}
		r, err := Restore(e.ctx, m, o)
		if err != nil {
			t.Fatal(err)
		}
		if p.BytesLocal != r.BytesLocal || p.BytesDownload != r.BytesDownloaded || p.ID != r.ID || p.Rescaled != r.Rescaled {
			t.Fatalf("%s: plan %+v, restore read %d local, %d downloaded", what, p, r.BytesLocal, r.BytesDownloaded)
		}
		if p.BytesLocal+p.BytesDownload != m.Figures.FullStateSize {
			t.Fatalf("%s: plan covers %d bytes of %d", what, p.BytesLocal+p.BytesDownload, m.Figures.FullStateSize)
		}
	}
	agree("intact local copy", m, o)
	sst := largestObject(m, checkpoint.KindSST)
	corrupt(t, filepath.Join(datadir.Checkpoint(e.localDir, m.ID), datadir.SlotName(sst.Slot), sst.File))
	agree("one corrupt local file", m, o)
	os.RemoveAll(datadir.Checkpoint(e.localDir, m.ID))
	agree("no local copy", m, o)
	o.Slots = 3
	agree("rescaled, no local copy", m, o)
	if _, err := PlanRestore(m, Options{Store: e.store, Job: "other", KeyGroups: 32, DataDir: t.TempDir()}); err == nil {
		t.Fatal("a plan for another job's checkpoint")
	}
}
