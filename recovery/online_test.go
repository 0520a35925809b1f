package recovery

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"cairn/checkpoint"
	"cairn/internal/base/datadir"
	"cairn/internal/testutil/testservers"
	"cairn/state"
)

// TestOnlineRestore: an online restore returns with the SSTs still in the
// store; the slot DBs open at once and read every key correctly (fetching
// what they touch); a checkpoint taken before the download finishes
// uploads none of the remote SSTs and restores exactly; Download then
// makes every file local and verified. Same slots and a scale-up, file and
// S3 stores.
func TestOnlineRestore(t *testing.T) {
	ctx := context.Background()
	for _, kind := range []string{"file", "s3"} {
		for _, c := range []struct{ from, to int }{{3, 3}, {2, 4}, {1, 3}} {
			t.Run(fmt.Sprintf("%s/%d-to-%d", kind, c.from, c.to), func(t *testing.T) {
				e := newEnv(t, storeOf(t, kind), 64, c.from, checkpoint.ModeIncremental, 11)
				e.write(30000, 60000, 100, 0)
				e.checkpoint("")
				e.write(5000, 60000, 100, 500)
				m, want := e.checkpoint("")

				data := t.TempDir()
				o := e.opts(data, c.to)
				o.Online = true
				r, err := Restore(ctx, m, o)
				if err != nil {
					t.Fatal(err)
				}
				var meta int64
				for _, ob := range m.Objects {
					if ob.Kind != checkpoint.KindSST {
						meta += ob.Size
					}
				}
				if r.Remote == nil || r.OnlineRefused != "" || r.FilesRemote == 0 || r.BytesDownloaded != meta {
					t.Fatalf("online restore result: remote %v refused %q files_remote %d downloaded %d (want only the %d bytes of metadata)", r.Remote != nil, r.OnlineRefused, r.FilesRemote, r.BytesDownloaded, meta)
				}
				defer r.Remote.Close()
				if len(r.RemoteObjects) != r.FilesRemote || len(r.Read) != 0 {
					t.Fatalf("online restore: %d remote objects listed for %d remote files, %d shared objects read", len(r.RemoteObjects), r.FilesRemote, len(r.Read))
				}
				for _, o := range r.RemoteObjects {
					if o.Kind != checkpoint.KindSST || o.SHA256 == "" {
						t.Fatalf("remote object %+v", o)
					}
				}
				files, remaining := r.Remote.Remaining()
				if files != r.FilesRemote || remaining == 0 {
					t.Fatalf("remaining %d files %d bytes, restore says %d files", files, remaining, r.FilesRemote)
				}

				// The job's open: read-write, every key read back.
				dbs := openSlotDBs(t, data, 64, c.to)
				checkKeyGroups(t, dbs, want)

				// A checkpoint of the restored DBs while files are remote:
				// written by another writer (a new process), it references
				// the remote SSTs it found in the store.
				w, err := checkpoint.NewWriter(ctx, e.store, checkpoint.WriterConfig{Job: testJob, KeyGroups: 64, Slots: c.to, Mode: checkpoint.ModeIncremental, Retain: 100, Logger: quietLogger()})
				if err != nil {
					t.Fatal(err)
				}
				local := t.TempDir()
				var snaps []state.SlotSnapshot
				for i, db := range dbs {
					sd := datadir.SlotIn(datadir.Checkpoint(local, 50), i)
					if err := db.Checkpoint(sd); err != nil {
						t.Fatal(err)
					}
					snaps = append(snaps, state.SlotSnapshot{Slot: i, Range: db.Range(), Dir: sd})
				}
				if _, left := r.Remote.Remaining(); left == 0 {
					t.Fatal("everything was fetched before the checkpoint: the test shows nothing")
				}
				m2, err := w.Commit(ctx, 50, checkpoint.Meta{SourceStream: "in", SourceSeq: 5000, Mode: checkpoint.ModeIncremental, ABIVersion: 1}, snaps)
				if err != nil {
					t.Fatal(err)
				}
				if err := checkpoint.WriteLocalIndex(datadir.Checkpoint(local, 50), m2.Objects); err != nil {
					t.Fatal(err)
				}
				for _, ob := range m2.Objects {
					if ob.Kind == checkpoint.KindSST && m2.Figures.BytesUploaded >= ob.Size && !referenced(m, ob.Path) {
						t.Fatalf("checkpoint during the online phase uploaded SST %s (%d bytes)", ob.Path, ob.Size)
					}
				}
				if m2.Figures.BytesUploaded > m.Figures.FullStateSize/10 {
					t.Fatalf("checkpoint during the online phase uploaded %d bytes of %d", m2.Figures.BytesUploaded, m.Figures.FullStateSize)
				}
				idx := checkpoint.ReadTrustIndex(filepath.Join(datadir.Checkpoint(local, 50), checkpoint.LocalIndexName))
				for rel := range idx.Files {
					if state.RemoteIncomplete(filepath.Join(datadir.Checkpoint(local, 50), rel)) {
						t.Fatalf("the local trust index vouches for %s, which is not downloaded yet", rel)
					}
				}

				if err := r.Remote.Download(ctx, 0, 4); err != nil {
					t.Fatal(err)
				}
				if files, left := r.Remote.Remaining(); files != 0 || left != 0 {
					t.Fatalf("after Download: %d files, %d bytes remote", files, left)
				}
				for _, db := range dbs {
					if err := db.Close(); err != nil {
						t.Fatal(err)
					}
				}
				checkRestored(t, data, 64, c.to, want)

				// The checkpoint taken during the online phase restores
				// exactly (offline, from the store).
				data2 := t.TempDir()
				if _, err := Restore(ctx, m2, e.opts(data2, c.to)); err != nil {
					t.Fatal(err)
				}
				checkRestored(t, data2, 64, c.to, want)
			})
		}
	}
}

// TestOnlineRestoreCorruptObject: an SST changed in the store is reported by
// the download as a *checkpoint.CorruptionError naming it.
func TestOnlineRestoreCorruptObject(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, nil, 32, 2, checkpoint.ModeIncremental, 12)
	e.write(20000, 40000, 100, 0)
	m, _ := e.checkpoint("")
	bad := largestObject(m, checkpoint.KindSST)
	corrupt(t, filepath.Join(e.storeRoot, filepath.FromSlash(bad.Path)))
	o := e.opts(t.TempDir(), 0)
	o.Online = true
	r, err := Restore(ctx, m, o)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Remote.Close()
	err = r.Remote.Download(ctx, 0, 2)
	var ce *checkpoint.CorruptionError
	if !errors.As(err, &ce) || ce.Object != bad.Path {
		t.Fatalf("download of a corrupt object: %v, want a CorruptionError naming %s", err, bad.Path)
	}
}

// TestOnlineRestoreRefused: a scale-down and a full checkpoint restore
// offline, saying why.
func TestOnlineRestoreRefused(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		mode     checkpoint.Mode
		from, to int
	}{{checkpoint.ModeIncremental, 4, 2}, {checkpoint.ModeFull, 2, 2}} {
		e := newEnv(t, nil, 32, c.from, c.mode, 13)
		e.write(5000, 10000, 50, 0)
		m, want := e.checkpoint("")
		data := t.TempDir()
		o := e.opts(data, c.to)
		o.Online = true
		r, err := Restore(ctx, m, o)
		if err != nil {
			t.Fatal(err)
		}
		if r.Remote != nil || r.OnlineRefused == "" || r.FilesRemote != 0 {
			t.Fatalf("%s %d->%d: remote %v, refused %q", c.mode, c.from, c.to, r.Remote != nil, r.OnlineRefused)
		}
		checkRestored(t, data, 32, c.to, want)
	}
}

func referenced(m *checkpoint.Manifest, path string) bool {
	for _, o := range m.Objects {
		if o.Path == path {
			return true
		}
	}
	return false
}

func openSlotDBs(t testing.TB, dataDir string, keyGroups, slots int) []*state.DB {
	t.Helper()
	var dbs []*state.DB
	for i := range slots {
		db, err := state.Open(datadir.Slot(dataDir, i), state.Options{KeyGroups: keyGroups, Range: state.SlotRange(i, slots, keyGroups)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		dbs = append(dbs, db)
	}
	return dbs
}

// checkKeyGroups reads the first, a middle and the last key group of every
// slot and compares them with want.
func checkKeyGroups(t testing.TB, dbs []*state.DB, want map[string]string) {
	t.Helper()
	for i, db := range dbs {
		r := db.Range()
		for _, kg := range []int{r.First, (r.First + r.Last) / 2, r.Last} {
			n := 0
			err := db.ScanRaw(state.KeyGroupRange{First: kg, Last: kg}, func(k, v []byte) error {
				n++
				if w, ok := want[string(k)]; !ok || w != string(v) {
					return fmt.Errorf("slot %d key %x: %d bytes, want %d (present %v)", i, k, len(v), len(w), ok)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			for k := range want {
				if int(k[0])<<8|int(k[1]) == kg {
					n--
				}
			}
			if n != 0 {
				t.Fatalf("slot %d key group %d: %d keys more than want", i, kg, n)
			}
		}
	}
}

// TestOnlineRestoreLeaseKeepsObjects: while a node reads a restored
// checkpoint's SSTs remotely, the job's checkpoints move on without them (a
// fresh state, as after --restore none elsewhere) and GC runs in a loop with
// retain 1: the node's lease keeps the objects, the download finishes and
// the state is exact. Without the lease the same GC deletes them (the
// control that shows the test can fail).
func TestOnlineRestoreLeaseKeepsObjects(t *testing.T) {
	ctx := context.Background()
	for _, leased := range []bool{true, false} {
		t.Run(fmt.Sprint("leased=", leased), func(t *testing.T) {
			e := newEnv(t, nil, 32, 2, checkpoint.ModeIncremental, 14)
			e.write(20000, 40000, 100, 0)
			m, want := e.checkpoint("")
			data := t.TempDir()
			o := e.opts(data, 0)
			o.Online = true
			r, err := Restore(ctx, m, o)
			if err != nil {
				t.Fatal(err)
			}
			defer r.Remote.Close()
			if leased {
				lh, err := checkpoint.HoldLease(ctx, e.store, checkpoint.Lease{Job: testJob, Holder: "node-a", Checkpoint: m.ID, Objects: r.Remote.Objects()}, time.Minute, quietLogger())
				if err != nil {
					t.Fatal(err)
				}
				defer lh.Release(ctx)
			}
			// The job's newer checkpoints reference none of m's SSTs.
			e2 := newEnv(t, e.store, 32, 2, checkpoint.ModeIncremental, 15)
			e2.localDir = t.TempDir()
			for n := range 2 {
				e2.nextID = uint64(10 + n)
				e2.write(2000, 4000, 50, 0)
				e2.checkpoint("")
			}
			gcDone := make(chan error, 1)
			stop := make(chan struct{})
			go func() {
				for {
					if _, err := checkpoint.GC(ctx, e.store, testJob, 1, 0, false); err != nil {
						gcDone <- err
						return
					}
					select {
					case <-stop:
						gcDone <- nil
						return
					case <-time.After(10 * time.Millisecond):
					}
				}
			}()
			// GC has dropped the checkpoint and, in the same pass, deleted
			// the objects no lease holds (the control waits for that too,
			// or its download could outrun the deletion).
			remote := r.Remote.Objects()
			waitFor(t, 10*time.Second, func() bool {
				_, err := checkpoint.Load(ctx, e.store, testJob, m.ID)
				if !errors.Is(err, checkpoint.ErrNotFound) {
					return false
				}
				_, err = e.store.Stat(ctx, remote[0])
				return leased || errors.Is(err, checkpoint.ErrNotFound)
			})
			dlErr := r.Remote.Download(ctx, 2<<20, 2)
			close(stop)
			if err := <-gcDone; err != nil {
				t.Fatal(err)
			}
			if !leased {
				if !errors.Is(dlErr, checkpoint.ErrNotFound) {
					t.Fatalf("without a lease, GC left the objects (download: %v): the test shows nothing", dlErr)
				}
				return
			}
			if dlErr != nil {
				t.Fatal(dlErr)
			}
			checkRestored(t, data, 32, 2, want)
		})
	}
}

// TestOnlineRestorePrefetch: while files are remote, DB.Prefetch fetches
// what a batch's keys need, so reading those keys afterwards fetches
// nothing more and returns their values; reading keys that were not
// prefetched does fetch (the control that shows the check can fail). Once
// everything is local, Prefetch does nothing. File and S3 stores.
func TestOnlineRestorePrefetch(t *testing.T) {
	ctx := context.Background()
	for _, kind := range []string{"file", "s3"} {
		t.Run(kind, func(t *testing.T) {
			// s3: concurrent ranged GETs to a real S3-protocol server.
			e := newEnv(t, storeOf(t, kind), 64, 2, checkpoint.ModeIncremental, 5)
			e.write(30000, 60000, 100, 0)
			m, want := e.checkpoint("")
			data := t.TempDir()
			o := e.opts(data, 2)
			o.Online = true
			r, err := Restore(ctx, m, o)
			if err != nil {
				t.Fatal(err)
			}
			defer r.Remote.Close()
			dbs := openSlotDBs(t, data, 64, 2)
			db := dbs[0]
			// Slot 0's value keys, in two sets: prefetched, and not.
			var keys [][]byte
			vals := map[string][]byte{}
			for raw, v := range want {
				k, err := state.DecodeKey([]byte(raw))
				if err != nil || k.Kind != state.KindValue || !db.Range().Contains(k.KeyGroup) {
					continue
				}
				keys = append(keys, k.UserKey)
				vals[string(k.UserKey)] = []byte(v)
				if len(keys) == 400 {
					break
				}
			}
			// Fewer keys prefetched than read after: slot 0's state is
			// only ~100 chunks of 16 KiB, and 200 random keys prefetched
			// reached nearly all of them, so the 200 read afterwards
			// found every chunk local in ~3% of runs and the control
			// failed. 100 leave about a third of the chunks remote.
			pre, other := keys[:100], keys[100:]
			remaining := func() int64 { _, n := r.Remote.Remaining(); return n }
			read := func(keys [][]byte) {
				t.Helper()
				for _, k := range keys {
					got, ok, err := db.Get(1, state.KeyGroup(k, 64), k, nil)
					if err != nil || !ok || !bytes.HasSuffix(vals[string(k)], got) || len(got) < 100 {
						t.Fatalf("key %q: %d bytes, found %v, err %v", k, len(got), ok, err)
					}
				}
			}

			// Pebble opens every table in the background after Open
			// (its table statistics), fetching their tails whenever it
			// gets to them: let both slots' DBs finish (the count is the
			// whole restore's), or those fetches are counted as the
			// reads'.
			for _, d := range dbs {
				for deadline := time.Now().Add(10 * time.Second); !d.TableStatsLoaded(); time.Sleep(5 * time.Millisecond) {
					if time.Now().After(deadline) {
						t.Fatal("Pebble's table statistics were not loaded within 10 s")
					}
				}
			}
			before := remaining()
			db.Prefetch(1, pre)
			afterPrefetch := remaining()
			if afterPrefetch >= before {
				t.Fatalf("Prefetch of %d keys fetched nothing (%d bytes remote before and after)", len(pre), before)
			}
			read(pre)
			if n := remaining(); n != afterPrefetch {
				t.Fatalf("reading the prefetched keys fetched %d bytes more", afterPrefetch-n)
			}
			read(other)
			if n := remaining(); n >= afterPrefetch {
				t.Fatal("reading keys that were not prefetched fetched nothing: the check above shows nothing")
			}

			if err := r.Remote.Download(ctx, 0, 4); err != nil {
				t.Fatal(err)
			}
			if files, n := r.Remote.Remaining(); files != 0 || n != 0 {
				t.Fatalf("after the download: %d files, %d bytes remote", files, n)
			}
			db.Prefetch(1, keys) // a no-op now
			read(keys)
		})
	}
}

// storeOf is a checkpoint store of the kind: nil for "file" (newEnv makes
// a file store), or one on an in-process S3 server for "s3", closed when
// the test ends.
func storeOf(t *testing.T, kind string) checkpoint.Store {
	t.Helper()
	if kind != "s3" {
		return nil
	}
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	store, err := checkpoint.OpenStore(context.Background(), testservers.StartGoFakeS3(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close(context.Background()) })
	return store
}
