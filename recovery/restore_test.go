package recovery

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"cairn/checkpoint"
	"cairn/internal/base/datadir"
	"cairn/internal/testutil/testservers"
	"cairn/state"
)

var modes = []checkpoint.Mode{checkpoint.ModeIncremental, checkpoint.ModeFull}

func TestRestoreSameSlots(t *testing.T) {
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			e := newEnv(t, nil, 64, 3, mode, 1)
			e.write(20000, 40000, 80, 0)
			_, want1 := e.checkpoint("")
			data := t.TempDir()
			// A chain: updates and deletes, several checkpoints; restore
			// an older one first, then the latest over it.
			var m *checkpoint.Manifest
			var want map[string]string
			for range 4 {
				e.write(5000, 40000, 80, 1000)
				m, want = e.checkpoint("")
			}
			if mode == checkpoint.ModeIncremental && m.ChainLength != 5 {
				t.Fatalf("chain length %d, want 5", m.ChainLength)
			}
			first, err := Select(e.ctx, e.store, testJob, "1")
			if err != nil {
				t.Fatal(err)
			}
			if _, err := Restore(e.ctx, first, e.opts(data, 0)); err != nil {
				t.Fatal(err)
			}
			checkRestored(t, data, 64, 3, want1)
			latest, err := Select(e.ctx, e.store, testJob, "latest")
			if err != nil {
				t.Fatal(err)
			}
			if latest.ID != m.ID {
				t.Fatalf("latest %d, want %d", latest.ID, m.ID)
			}
			r, err := Restore(e.ctx, latest, e.opts(data, 0))
			if err != nil {
				t.Fatal(err)
			}
			checkRestored(t, data, 64, 3, want)
			if r.Rescaled || r.FromSlots != 3 || r.ToSlots != 3 || r.ID != m.ID || r.SourceSeq != m.SourceSeq || r.Mode != mode {
				t.Fatalf("result %+v", r)
			}
			if mode == checkpoint.ModeIncremental && r.BytesDownloaded != m.Figures.FullStateSize {
				t.Fatalf("downloaded %d, state size %d", r.BytesDownloaded, m.Figures.FullStateSize)
			}
			if r.BytesLocal != 0 || r.Files == 0 {
				t.Fatalf("result %+v", r)
			}
			<-r.OldStateRemoved // the replaced state goes after Restore returns
			assertNoLeftovers(t, data)
		})
	}
}

func assertNoLeftovers(t *testing.T, dataDir string) {
	t.Helper()
	ents, err := os.ReadDir(dataDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if e.Name() != datadir.StateDir {
			t.Fatalf("leftover %s in the data directory", e.Name())
		}
	}
}

func TestSelect(t *testing.T) {
	e := newEnv(t, nil, 16, 1, checkpoint.ModeIncremental, 2)
	ctx := context.Background()
	for _, spec := range []string{"", "latest", "none"} {
		m, err := Select(ctx, e.store, testJob, spec)
		if m != nil || err != nil {
			t.Fatalf("%q on an empty store: %v %v", spec, m, err)
		}
	}
	if _, err := Select(ctx, e.store, testJob, "7"); !errors.Is(err, checkpoint.ErrNotFound) {
		t.Fatalf("missing id: %v", err)
	}
	for _, bad := range []string{"x", "0", "-1", "savepoint:"} {
		if _, err := Select(ctx, e.store, testJob, bad); err == nil {
			t.Fatalf("%q accepted", bad)
		}
	}
	e.write(100, 1000, 10, 0)
	e.checkpoint("")
	e.checkpoint("")
	if m, err := Select(ctx, e.store, testJob, "none"); m != nil || err != nil {
		t.Fatal("none selected something")
	}
	m, err := Select(ctx, e.store, testJob, "1")
	if err != nil || m.ID != 1 {
		t.Fatal(m, err)
	}
}

// TestRescaleMatrix checkpoints at p slots and restores at p' slots, for
// p, p' in {1, 2, 3, 4, 7} with p' <= 4p, in both modes.
func TestRescaleMatrix(t *testing.T) {
	counts := []int{1, 2, 3, 4, 7}
	const kgs = 64
	for _, mode := range modes {
		for _, p := range counts {
			t.Run(fmt.Sprintf("%s/from-%d", mode, p), func(t *testing.T) {
				e := newEnv(t, nil, kgs, p, mode, uint64(p))
				e.write(8000, 12000, 40, 0)
				e.checkpoint("")
				e.write(3000, 12000, 40, 800) // a chain with deletes
				m, want := e.checkpoint("")
				for _, q := range counts {
					if q > MaxRescaleFactor*p {
						continue
					}
					data := t.TempDir()
					r, err := Restore(e.ctx, m, e.opts(data, q))
					if err != nil {
						t.Fatalf("%d -> %d: %v", p, q, err)
					}
					if r.Rescaled != (p != q) || r.ToSlots != q || r.FromSlots != p {
						t.Fatalf("%d -> %d: result %+v", p, q, r)
					}
					checkRestored(t, data, kgs, q, want)
					<-r.OldStateRemoved
					assertNoLeftovers(t, data)
				}
			})
		}
	}
}

// TestRestoreOverExistingState restores a different slot count over an
// existing state directory: extra old slots disappear.
func TestRestoreOverExistingState(t *testing.T) {
	e := newEnv(t, nil, 32, 4, checkpoint.ModeIncremental, 3)
	e.write(5000, 10000, 40, 0)
	m, want := e.checkpoint("")
	data := t.TempDir()
	if _, err := Restore(e.ctx, m, e.opts(data, 4)); err != nil {
		t.Fatal(err)
	}
	if _, err := Restore(e.ctx, m, e.opts(data, 2)); err != nil {
		t.Fatal(err)
	}
	checkRestored(t, data, 32, 2, want)
}

func TestLocalRecovery(t *testing.T) {
	e := newEnv(t, nil, 32, 2, checkpoint.ModeIncremental, 4)
	e.write(20000, 30000, 80, 0)
	e.checkpoint("")
	e.write(5000, 30000, 80, 500)
	m, want := e.checkpoint("")
	for _, db := range e.dbs {
		db.Close() // the files below are shared with the source DBs
	}
	data := t.TempDir()
	o := e.opts(data, 0)
	o.LocalDir = e.localDir

	r, err := Restore(e.ctx, m, o)
	if err != nil {
		t.Fatal(err)
	}
	checkRestored(t, data, 32, 2, want)
	if r.BytesDownloaded != 0 || r.FilesDownloaded != 0 || r.BytesLocal != m.Figures.FullStateSize {
		t.Fatalf("intact local copy: %+v (state %d)", r, m.Figures.FullStateSize)
	}

	// Without the trust index every file is hashed: still nothing
	// downloaded.
	idx := filepath.Join(datadir.Checkpoint(e.localDir, m.ID), checkpoint.LocalIndexName)
	saved, err := os.ReadFile(idx)
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(idx)
	if r, err = Restore(e.ctx, m, o); err != nil || r.BytesDownloaded != 0 {
		t.Fatalf("without index: %+v %v", r, err)
	}
	if err := os.WriteFile(idx, saved, 0o644); err != nil {
		t.Fatal(err)
	}

	// One corrupted local file: only that file is downloaded.
	sst := largestObject(m, checkpoint.KindSST)
	corrupt(t, filepath.Join(datadir.Checkpoint(e.localDir, m.ID), datadir.SlotName(sst.Slot), sst.File))
	r, err = Restore(e.ctx, m, o)
	if err != nil {
		t.Fatal(err)
	}
	if r.FilesDownloaded != 1 || r.BytesDownloaded != sst.Size || r.BytesLocal != m.Figures.FullStateSize-sst.Size {
		t.Fatalf("one corrupt local file (%d bytes): %+v", sst.Size, r)
	}
	// What the restore read from the store and checked: that one object,
	// which a checkpoint writer then need not read back.
	if len(r.Read) != 1 || r.Read[0] != sst || len(r.RemoteObjects) != 0 {
		t.Fatalf("one object downloaded: Read %+v, RemoteObjects %+v", r.Read, r.RemoteObjects)
	}
	checkRestored(t, data, 32, 2, want)

	// A missing local folder: everything comes from the store.
	os.RemoveAll(datadir.Checkpoint(e.localDir, m.ID))
	if r, err = Restore(e.ctx, m, o); err != nil || r.BytesLocal != 0 || r.BytesDownloaded != m.Figures.FullStateSize {
		t.Fatalf("no local copy: %+v %v", r, err)
	}
	checkRestored(t, data, 32, 2, want)
}

// TestRefusals checks each typed refusal, and that none changes the data
// directory.
func TestRefusals(t *testing.T) {
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			e := newEnv(t, nil, 32, 2, mode, 5)
			e.write(3000, 5000, 40, 0)
			m1, want := e.checkpoint("")
			data := t.TempDir()
			if _, err := Restore(e.ctx, m1, e.opts(data, 0)); err != nil {
				t.Fatal(err)
			}
			e.write(1000, 5000, 40, 0)
			m, _ := e.checkpoint("")
			before := treeHash(t, data)
			storeRoot := e.storeRoot

			refuse := func(name string, m *checkpoint.Manifest, o Options, is func(error) bool) {
				t.Helper()
				_, err := Restore(e.ctx, m, o)
				if err == nil || !is(err) {
					t.Fatalf("%s: got %v", name, err)
				}
				if after := treeHash(t, data); after != before {
					t.Fatalf("%s changed the data directory", name)
				}
				assertNoLeftovers(t, data)
			}
			o := e.opts(data, 0)
			o.KeyGroups = 64
			refuse("key_groups", m, o, func(err error) bool { return errors.Is(err, ErrKeyGroupsMismatch) })
			o = e.opts(data, 0)
			o.Job = "other"
			refuse("job", m, o, func(err error) bool { return errors.Is(err, ErrWrongJob) })
			o = e.opts(data, 0)
			o.SourceStream = "ANOTHER_STREAM"
			if m.SourceStream == "" || m.SourceStream == o.SourceStream {
				t.Fatalf("test is vacuous: checkpoint of stream %q", m.SourceStream)
			}
			refuse("stream", m, o, func(err error) bool { return errors.Is(err, ErrStreamMismatch) })
			refuse("slots", m, e.opts(data, 9), func(err error) bool { return errors.Is(err, ErrSlotCount) })
			refuse("slots", m, e.opts(data, -1), func(err error) bool { return errors.Is(err, ErrSlotCount) })
			bad := *m
			bad.FormatVersion = 99
			refuse("version", &bad, e.opts(data, 0), func(err error) bool { return errors.Is(err, checkpoint.ErrUnsupportedVersion) })

			// A manifest of an unknown format version in the store.
			raw, err := os.ReadFile(filepath.Join(storeRoot, checkpoint.ManifestPath(testJob, m.ID)))
			if err != nil {
				t.Fatal(err)
			}
			v99 := strings.Replace(string(raw), `"format_version": 1`, `"format_version": 99`, 1)
			if err := e.store.Create(e.ctx, checkpoint.ManifestPath(testJob, 1000), []byte(v99)); err != nil {
				t.Fatal(err)
			}
			if _, err := Select(e.ctx, e.store, testJob, "1000"); !errors.Is(err, checkpoint.ErrUnsupportedVersion) {
				t.Fatalf("select v99: %v", err)
			}
			if _, err := Select(e.ctx, e.store, testJob, "latest"); !errors.Is(err, checkpoint.ErrUnsupportedVersion) {
				t.Fatalf("select latest with a v99 manifest: %v", err)
			}
			e.store.Delete(e.ctx, checkpoint.ManifestPath(testJob, 1000))

			// A manifest of another job copied under this job.
			if err := e.store.Create(e.ctx, checkpoint.ManifestPath("other", m.ID), raw); err != nil {
				t.Fatal(err)
			}
			if _, err := Select(e.ctx, e.store, "other", fmt.Sprint(m.ID)); !errors.Is(err, ErrWrongJob) {
				t.Fatalf("select another job's manifest: %v", err)
			}

			// Corrupt, then missing objects: typed errors naming the object.
			obj := largestObject(m, checkpoint.KindSST)
			if mode == checkpoint.ModeFull {
				obj = largestObject(m, checkpoint.KindFullData)
			}
			p := filepath.Join(storeRoot, filepath.FromSlash(obj.Path))
			saved, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			corrupt(t, p)
			refuse("corrupt", m, e.opts(data, 0), func(err error) bool {
				return checkpoint.IsCorruption(err) && strings.Contains(err.Error(), obj.Path)
			})
			refuse("corrupt rescaled", m, e.opts(data, 3), func(err error) bool {
				return checkpoint.IsCorruption(err) && strings.Contains(err.Error(), obj.Path)
			})
			os.Remove(p)
			refuse("missing", m, e.opts(data, 0), func(err error) bool {
				return errors.Is(err, checkpoint.ErrNotFound) && strings.Contains(err.Error(), obj.Path)
			})
			idx := largestObject(m, checkpoint.KindMeta)
			if mode == checkpoint.ModeFull {
				idx = largestObject(m, checkpoint.KindIndex)
			}
			os.WriteFile(p, saved, 0o644)
			os.Remove(filepath.Join(storeRoot, filepath.FromSlash(idx.Path)))
			refuse("missing "+string(idx.Kind), m, e.opts(data, 0), func(err error) bool {
				return errors.Is(err, checkpoint.ErrNotFound) && strings.Contains(err.Error(), idx.Path)
			})
			checkRestored(t, data, 32, 2, want)
		})
	}
}

func TestRestoreS3(t *testing.T) {
	ctx := context.Background()
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			url := testservers.StartGoFakeS3(t)
			store, err := checkpoint.OpenStore(ctx, url)
			if err != nil {
				t.Fatal(err)
			}
			defer store.Close(ctx)
			e := newEnv(t, store, 32, 2, mode, 6)
			e.write(8000, 10000, 60, 0)
			e.checkpoint("")
			e.write(2000, 10000, 60, 300)
			m, want := e.checkpoint("")
			for _, q := range []int{2, 3} {
				data := t.TempDir()
				if _, err := Restore(ctx, m, e.opts(data, q)); err != nil {
					t.Fatal(err)
				}
				checkRestored(t, data, 32, q, want)
			}
		})
	}
}

// TestScaleUpReusesStoredFiles: an incremental checkpoint restored onto
// twice the slots clips each old slot's native files to the new ranges, so
// the restored DBs share the old SSTs, and the next incremental checkpoint
// of the new slots finds them in the store: it uploads a small fraction of
// the state (the general path rewrites every key into new files, which
// would all be uploaded again).
func TestScaleUpReusesStoredFiles(t *testing.T) {
	const kgs = 64
	e := newEnv(t, nil, kgs, 2, checkpoint.ModeIncremental, 11)
	e.write(20000, 40000, 100, 0)
	e.checkpoint("")
	e.write(2000, 40000, 100, 200)
	m, want := e.checkpoint("")
	data := t.TempDir()
	r, err := Restore(e.ctx, m, e.opts(data, 4))
	if err != nil {
		t.Fatal(err)
	}
	if !r.Rescaled {
		t.Fatalf("not rescaled: %+v", r)
	}
	checkRestored(t, data, kgs, 4, want)

	// The restored job checkpoints its 4 slots to the same store.
	w, err := checkpoint.NewWriter(e.ctx, e.store, checkpoint.WriterConfig{Job: testJob, KeyGroups: kgs, Slots: 4, Mode: checkpoint.ModeIncremental, Retain: 100, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	local := filepath.Join(t.TempDir(), "chk")
	var snaps []state.SlotSnapshot
	for i := range 4 {
		db, err := state.Open(datadir.Slot(data, i), state.Options{KeyGroups: kgs, Range: state.SlotRange(i, 4, kgs)})
		if err != nil {
			t.Fatal(err)
		}
		sd := filepath.Join(local, fmt.Sprint("slot-", i))
		if err := db.Checkpoint(sd); err != nil {
			t.Fatal(err)
		}
		db.Close()
		snaps = append(snaps, state.SlotSnapshot{Slot: i, Range: state.SlotRange(i, 4, kgs), Dir: sd})
	}
	m2, err := w.Commit(e.ctx, e.nextID, checkpoint.Meta{SourceStream: "in", SourceSeq: m.SourceSeq, Mode: checkpoint.ModeIncremental, ABIVersion: 1}, snaps)
	if err != nil {
		t.Fatal(err)
	}
	f := m2.Figures
	t.Logf("after the scale-up: %d files reused (%d bytes), %d uploaded (%d bytes) of %d bytes", f.FilesReused, f.BytesReused, f.FilesUploaded, f.BytesUploaded, f.FullStateSize)
	if f.FilesReused == 0 || f.BytesUploaded*4 > f.FullStateSize {
		t.Fatalf("the checkpoint after a scale-up uploaded %d of %d bytes (%d files reused); the clipped slots should share the stored SSTs", f.BytesUploaded, f.FullStateSize, f.FilesReused)
	}
	// And it restores exactly, onto the new slot count and back.
	for _, q := range []int{4, 2} {
		d := t.TempDir()
		if _, err := Restore(e.ctx, m2, e.opts(d, q)); err != nil {
			t.Fatal(err)
		}
		checkRestored(t, d, kgs, q, want)
	}
}

// TestRescaleEmptyState: a checkpoint of empty slots restores onto more and
// fewer slots (nothing to clip or ingest), in both modes.
func TestRescaleEmptyState(t *testing.T) {
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			e := newEnv(t, nil, 16, 2, mode, 5)
			m, want := e.checkpoint("")
			if len(want) != 0 {
				t.Fatalf("state not empty: %d keys", len(want))
			}
			for _, q := range []int{1, 2, 4, 8} {
				data := t.TempDir()
				if _, err := Restore(e.ctx, m, e.opts(data, q)); err != nil {
					t.Fatalf("2 -> %d: %v", q, err)
				}
				checkRestored(t, data, 16, q, want)
			}
		})
	}
}
