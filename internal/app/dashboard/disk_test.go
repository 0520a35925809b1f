package dashboard

import (
	"crypto/rand"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"cairn/internal/base/datadir"
	"cairn/state"
)

// diskSource is a fakeSource that knows a data directory laid out as a node's.
type diskSource struct {
	*fakeSource
	dirs []DiskDir
}

func (d diskSource) DiskDirs() []DiskDir { return d.dirs }

// TestDiskMetrics measures a real data directory: two live Pebble slots, a local
// checkpoint of one (hard links to its SSTs), an embedded-NATS-like store and a missing
// store folder.
func TestDiskMetrics(t *testing.T) {
	dir := t.TempDir()
	all := state.KeyGroupRange{First: 0, Last: 127}
	var dbs []*state.DB
	for i := range 2 {
		db, err := state.Open(datadir.Slot(dir, i), state.Options{KeyGroups: 128, Range: all})
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		dbs = append(dbs, db)
	}
	b := dbs[0].NewBatch()
	key, val := make([]byte, 16), make([]byte, 100)
	for i := range 20000 {
		rand.Read(key)
		rand.Read(val)
		b.Put(1, i%128, key, nil, val)
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	b.Close()
	chk := datadir.Checkpoint(datadir.Checkpoints(dir), 1)
	if err := dbs[0].Checkpoint(datadir.SlotIn(chk, 0)); err != nil {
		t.Fatal(err)
	}
	natsFile := filepath.Join(dir, datadir.NATSDir, "jetstream", "msgs.blk")
	if err := os.MkdirAll(filepath.Dir(natsFile), 0o755); err != nil {
		t.Fatal(err)
	}
	writeRandom(t, natsFile, 3<<20)

	src := diskSource{newFakeSource(), []DiskDir{
		{"state", datadir.State(dir)},
		{"checkpoints", datadir.Checkpoints(dir)},
		{"nats", filepath.Join(dir, datadir.NATSDir)},
		{"store", filepath.Join(dir, "store")}, // missing: 0
	}}
	srv := httptest.NewServer(Handler(src, Options{}))
	defer srv.Close()
	fams, _ := scrape(t, srv.URL)
	get := func(component, slot string) float64 {
		return value(t, fams, "cairn_disk_allocated_bytes", "component", component, "slot", slot)
	}
	slot0, slot1, cks, nats, store := get("state", "0"), get("state", "1"), get("checkpoints", ""), get("nats", ""), get("store", "")
	t.Logf("state slot 0 %.0f, slot 1 %.0f, checkpoints %.0f, nats %.0f, store %.0f bytes", slot0, slot1, cks, nats, store)
	// 20k random 116-byte entries: ~2.3 MB of SSTs. The WALs are not preallocated
	// (state/walfs.go): with Pebble's own WAL files slot 0 held 4 x 35 MiB.
	if slot0 < 2<<20 || slot0 > 16<<20 {
		t.Errorf("state slot 0: %.0f bytes, want its ~2.3 MB of SSTs and WAL, under 16 MiB", slot0)
	}
	if slot1 <= 0 || slot1 > 1<<20 {
		t.Errorf("state slot 1 (empty): %.0f bytes, want > 0 and < 1 MiB", slot1)
	}
	// The checkpoint's SSTs are hard links to slot 0's: counted once, in state.
	if cks <= 0 || cks > 512<<10 {
		t.Errorf("checkpoints: %.0f bytes, want only the copy's own metadata (> 0, < 512 KiB)", cks)
	}
	if nats < 3<<20 || nats > 3<<20+64<<10 {
		t.Errorf("nats: %.0f bytes, want the 3 MiB file's blocks", nats)
	}
	if store != 0 {
		t.Errorf("store (missing folder): %.0f bytes, want 0", store)
	}

	// A measurement is reused for diskInterval, then taken again.
	u := &diskUsage{src: src, every: diskInterval}
	t0 := time.Now()
	before := find(u.get(t0), "nats")
	writeRandom(t, natsFile+".2", 1<<20)
	if got := find(u.get(t0.Add(diskInterval-time.Millisecond)), "nats"); got != before {
		t.Errorf("nats within the interval: %d, want the cached %d", got, before)
	}
	if got := find(u.get(t0.Add(diskInterval)), "nats"); got != before+1<<20 {
		t.Errorf("nats after the interval: %d, want %d", got, before+1<<20)
	}
}

func find(vs []diskValue, component string) int64 {
	for _, v := range vs {
		if v.component == component {
			return v.bytes
		}
	}
	return -1
}

func writeRandom(t *testing.T, path string, n int) {
	t.Helper()
	buf := make([]byte, n)
	rand.Read(buf)
	if err := os.WriteFile(path, buf, 0o644); err != nil {
		t.Fatal(err)
	}
}
