package recovery

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"cairn/checkpoint"
	"cairn/internal/base/datadir"
	"cairn/internal/testutil/wait"
	"cairn/state"
)

const testJob = "job1"

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// env is a source job: slot DBs, a store and a checkpoint writer.
type env struct {
	t         testing.TB
	ctx       context.Context
	keyGroups int
	slots     int
	dbs       []*state.DB
	store     checkpoint.Store
	// storeRoot is the file store's folder ("" for other stores).
	storeRoot string
	w         *checkpoint.Writer
	// localDir receives the local checkpoint copies (<localDir>/chk-<id>).
	localDir string
	rng      *rand.Rand
	// nextID is the next checkpoint id.
	nextID uint64
}

func newEnv(t testing.TB, store checkpoint.Store, keyGroups, slots int, mode checkpoint.Mode, seed uint64) *env {
	t.Helper()
	ctx := context.Background()
	root := ""
	if store == nil {
		var err error
		root = filepath.Join(t.TempDir(), "store")
		store, err = checkpoint.NewFileStore(root, true)
		if err != nil {
			t.Fatal(err)
		}
	}
	e := &env{t: t, ctx: ctx, keyGroups: keyGroups, slots: slots, store: store, storeRoot: root, localDir: filepath.Join(t.TempDir(), "checkpoints"), rng: rand.New(rand.NewPCG(seed, 7)), nextID: 1}
	base := t.TempDir()
	for i := range slots {
		db, err := state.Open(filepath.Join(base, fmt.Sprint("slot-", i)), state.Options{KeyGroups: keyGroups, Range: state.SlotRange(i, slots, keyGroups)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		e.dbs = append(e.dbs, db)
	}
	w, err := checkpoint.NewWriter(ctx, store, checkpoint.WriterConfig{Job: testJob, KeyGroups: keyGroups, Slots: slots, Mode: mode, Retain: 100, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	e.w = w
	return e
}

// write puts n random keys out of a space of space keys (values of valueLen
// random bytes) and deletes about del of them.
func (e *env) write(n, space, valueLen, del int) {
	e.t.Helper()
	batches := make([]*state.Batch, e.slots)
	for i, db := range e.dbs {
		batches[i] = db.NewBatch()
	}
	flush := func(i int, force bool) {
		if batches[i].Len() >= 1000 || force && batches[i].Len() > 0 {
			if err := batches[i].Commit(); err != nil {
				e.t.Fatal(err)
			}
			batches[i].Reset()
		}
	}
	val := make([]byte, valueLen)
	for range n + del {
		key := fmt.Appendf(nil, "key-%09d", e.rng.IntN(space))
		kg := state.KeyGroup(key, e.keyGroups)
		s := state.SlotOf(kg, e.slots, e.keyGroups)
		if e.rng.IntN(n+del) < del {
			batches[s].Delete(1, kg, key, nil)
		} else {
			for j := range val {
				val[j] = byte(e.rng.Uint32())
			}
			batches[s].Put(1, kg, key, nil, val)
		}
		flush(s, false)
	}
	for i, b := range batches {
		flush(i, true)
		b.Close()
	}
}

// checkpoint takes a checkpoint (local copies under localDir, committed to
// the store, local trust index written) and returns it with the source's
// state at that moment.
func (e *env) checkpoint(mode checkpoint.Mode) (*checkpoint.Manifest, map[string]string) {
	e.t.Helper()
	id := e.nextID
	e.nextID++
	snaps, want := e.snapshot(id)
	m, err := e.w.Commit(e.ctx, id, checkpoint.Meta{SourceStream: "in", SourceSeq: id * 100, Mode: mode, ABIVersion: 1}, snaps)
	if err != nil {
		e.t.Fatal(err)
	}
	if err := checkpoint.WriteLocalIndex(datadir.Checkpoint(e.localDir, id), m.Objects); err != nil {
		e.t.Fatal(err)
	}
	return m, want
}

func (e *env) snapshot(id uint64) ([]state.SlotSnapshot, map[string]string) {
	e.t.Helper()
	dir := datadir.Checkpoint(e.localDir, id)
	var snaps []state.SlotSnapshot
	want := map[string]string{}
	for i, db := range e.dbs {
		sd := filepath.Join(dir, fmt.Sprint("slot-", i))
		if err := db.Checkpoint(sd); err != nil {
			e.t.Fatal(err)
		}
		snaps = append(snaps, state.SlotSnapshot{Slot: i, Range: db.Range(), Dir: sd})
		if err := db.ScanRaw(db.Range(), func(k, v []byte) error {
			want[string(k)] = string(v)
			return nil
		}); err != nil {
			e.t.Fatal(err)
		}
	}
	return snaps, want
}

func (e *env) opts(dataDir string, slots int) Options {
	return Options{Store: e.store, Job: testJob, KeyGroups: e.keyGroups, Slots: slots, DataDir: dataDir, Logger: quietLogger()}
}

// checkRestored opens every restored slot, checks that it holds only keys
// of its own key groups, and that together they equal want.
func checkRestored(t testing.TB, dataDir string, keyGroups, slots int, want map[string]string) {
	t.Helper()
	got := map[string]string{}
	for i := range slots {
		r := state.SlotRange(i, slots, keyGroups)
		// Open over every key group so that keys outside r would show.
		db, err := state.Open(datadir.Slot(dataDir, i), state.Options{KeyGroups: keyGroups, Range: state.KeyGroupRange{First: 0, Last: keyGroups - 1}, ReadOnly: true})
		if err != nil {
			t.Fatalf("slot %d: %v", i, err)
		}
		err = db.ScanRaw(state.KeyGroupRange{First: 0, Last: keyGroups - 1}, func(k, v []byte) error {
			if kg := int(binary.BigEndian.Uint16(k)); !r.Contains(kg) {
				return fmt.Errorf("slot %d %v holds key %x of key group %d", i, r, k, kg)
			}
			if _, dup := got[string(k)]; dup {
				return fmt.Errorf("key %x twice", k)
			}
			got[string(k)] = string(v)
			return nil
		})
		db.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(datadir.Slot(dataDir, slots)); err == nil {
		t.Fatalf("slot %d exists beyond %d slots", slots, slots)
	}
	if len(got) != len(want) {
		t.Fatalf("restored %d keys, want %d", len(got), len(want))
	}
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			t.Fatalf("key %x: got %d bytes (present %v), want %d bytes", k, len(g), ok, len(v))
		}
	}
}

// treeHash hashes every path, type and file content under dir.
func treeHash(t testing.TB, dir string) string {
	t.Helper()
	h := sha256.New()
	var paths []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		paths = append(paths, p)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(paths)
	for _, p := range paths {
		fi, err := os.Lstat(p)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(dir, p)
		fmt.Fprintf(h, "%s %v\n", rel, fi.Mode())
		if fi.Mode().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			h.Write(b)
		}
	}
	return hex.EncodeToString(h.Sum(nil))
}

// corrupt flips bytes in the middle of a file, keeping its size.
func corrupt(t testing.TB, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) == 0 {
		t.Fatalf("%s is empty", path)
	}
	for i := len(b) / 2; i < len(b)/2+16 && i < len(b); i++ {
		b[i] ^= 0xff
	}
	// In place, like a disk or an operator would.
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(b, 0); err != nil {
		t.Fatal(err)
	}
	f.Close()
}

// largestObject returns m's largest object of a kind.
func largestObject(m *checkpoint.Manifest, kind checkpoint.Kind) checkpoint.Object {
	var best checkpoint.Object
	for _, o := range m.Objects {
		if o.Kind == kind && o.Size > best.Size {
			best = o
		}
	}
	return best
}

func sortDesc(ids []uint64) { sort.Slice(ids, func(i, j int) bool { return ids[i] > ids[j] }) }

// waitFor polls cond until it holds or the timeout passes.
func waitFor(t testing.TB, timeout time.Duration, cond func() bool) {
	t.Helper()
	wait.For(t, timeout, "the condition", cond)
}

// walkFiles calls fn with the slash path of every file under dir.
func walkFiles(t testing.TB, dir string, fn func(rel string)) {
	t.Helper()
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) {
			return nil // removed by a concurrent prune
		}
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		fn(filepath.ToSlash(rel))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
