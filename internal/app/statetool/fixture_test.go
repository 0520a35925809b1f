package statetool

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"cairn/checkpoint"
	"cairn/internal/base/datadir"
	"cairn/recovery"
	"cairn/state"
)

var quiet = slog.New(slog.DiscardHandler)

// newStore opens a file store in a temp dir.
func newStore(t testing.TB) (checkpoint.Store, string) {
	t.Helper()
	dir := t.TempDir()
	s, err := checkpoint.OpenStore(context.Background(), "file://"+filepath.Join(dir, "store")+"?create_dir=true")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(context.Background()) })
	return s, dir
}

// fillFn writes slot state into a batch: the entries of key group kg.
type fillFn func(b *state.Batch, kg int, key []byte, i int)

// mixedState is every kind of entry: values with and without sub-keys
// and TTL, binary keys, timers of both domains, engine counters and
// outbox-like engine values.
func mixedState(b *state.Batch, kg int, key []byte, i int) {
	b.Put(1, kg, key, nil, []byte(fmt.Sprint(i)))
	if i%3 == 0 {
		b.Put(1, kg, key, []byte("sub\x00\xff"), bytes.Repeat([]byte{byte(i)}, i%40))
	}
	if i%5 == 0 {
		b.SetTimer(1, kg, state.DomainEventTime, int64(i)*1000-50000, key)
	}
	if i%7 == 0 {
		b.SetTimer(1, kg, state.DomainProcessingTime, int64(i)*10, key)
	}
	if i%11 == 0 {
		b.SetCounter(kg, state.CounterOutputs, uint64(i))
		b.Put(state.SystemStage, kg, []byte("outbox"), binary.BigEndian.AppendUint64(nil, uint64(i)), []byte("pending"))
	}
}

// keyOf is the i-th key: text, with one in 13 binary (not UTF-8).
func keyOf(i int) []byte {
	if i%13 == 0 {
		return []byte{0xff, 0xfe, byte(i), byte(i >> 8), byte(i >> 16)}
	}
	return fmt.Appendf(nil, "word-%07d", i)
}

// writeSavepoint takes savepoint name of job with n keys over slots slots,
// each key's entries written by fill, through the job's own path: Pebble
// slots, DB.Checkpoint, Writer.Savepoint. ttlEvery > 0 gives every
// ttlEvery-th key's "" value an expiry.
func writeSavepoint(t testing.TB, store checkpoint.Store, dir, job, name string, kgs, slots, n int, fill fillFn, ttl bool) *checkpoint.Manifest {
	t.Helper()
	ctx := context.Background()
	now := time.UnixMilli(1_700_000_000_000)
	var snaps []state.SlotSnapshot
	var dbs []*state.DB
	for i := range slots {
		r := state.SlotRange(i, slots, kgs)
		o := state.Options{KeyGroups: kgs, Range: r, Now: func() time.Time { return now }}
		if ttl {
			o.TTL = map[uint8]time.Duration{1: time.Hour}
		}
		db, err := state.Open(filepath.Join(dir, name, fmt.Sprintf("db-%d", i)), o)
		if err != nil {
			t.Fatal(err)
		}
		dbs = append(dbs, db)
	}
	batches := make([]*state.Batch, slots)
	for i := range batches {
		batches[i] = dbs[i].NewBatch()
	}
	for i := range n {
		key := keyOf(i)
		kg := state.KeyGroup(key, kgs)
		s := state.SlotOf(kg, slots, kgs)
		fill(batches[s], kg, key, i)
		if i%4096 == 4095 {
			for j, b := range batches {
				if err := b.Commit(); err != nil {
					t.Fatal(err)
				}
				batches[j] = dbs[j].NewBatch()
			}
		}
	}
	for i, b := range batches {
		if err := b.Commit(); err != nil {
			t.Fatal(err)
		}
		cdir := filepath.Join(dir, name, fmt.Sprintf("chk-%d", i))
		if err := dbs[i].Checkpoint(cdir); err != nil {
			t.Fatal(err)
		}
		snaps = append(snaps, state.SlotSnapshot{Slot: i, Range: state.SlotRange(i, slots, kgs), Dir: cdir})
	}
	w, err := checkpoint.NewWriter(ctx, store, checkpoint.WriterConfig{Job: job, KeyGroups: kgs, Slots: slots, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close(ctx)
	meta := checkpoint.Meta{SourceStream: "IN", SourceSeq: 12345, Modules: map[string]string{"count": "ab"}, ABIVersion: 2}
	m, err := w.Savepoint(ctx, 42, name, meta, snaps)
	if err != nil {
		t.Fatal(err)
	}
	// The same state as an incremental checkpoint of the job, which the
	// tools read by restoring it.
	meta.Mode = checkpoint.ModeIncremental
	if _, err := w.Commit(ctx, w.NextID(), meta, snaps); err != nil {
		t.Fatal(err)
	}
	for _, db := range dbs {
		db.Close()
	}
	return m
}

// kv is one stored entry.
type kv struct{ k, v string }

// entriesOf reads every stored entry of a checkpoint or savepoint, in key
// order, with the key group of every segment checked.
func entriesOf(t testing.TB, store checkpoint.Store, m *checkpoint.Manifest) []kv {
	t.Helper()
	ctx := context.Background()
	r, err := openReader(ctx, store, m, "")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var out []kv
	for kg := range m.KeyGroups {
		if err := r.keyGroup(ctx, kg, func(k, v []byte) error {
			if got := int(binary.BigEndian.Uint16(k)); got != kg {
				return fmt.Errorf("key %x in segment of key group %d", k, kg)
			}
			out = append(out, kv{string(k), string(v)})
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// restoredEntries restores m onto slots slots, as `cairn run --restore`
// does, and reads every slot's DB: the entries, sorted, each checked to
// lie in its slot's range.
func restoredEntries(t testing.TB, store checkpoint.Store, m *checkpoint.Manifest, job string, slots int) []kv {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	if _, err := recovery.Restore(ctx, m, recovery.Options{Store: store, Job: job, KeyGroups: m.KeyGroups, Slots: slots, DataDir: dir, Logger: quiet}); err != nil {
		t.Fatal(err)
	}
	var out []kv
	for i := range slots {
		r := state.SlotRange(i, slots, m.KeyGroups)
		db, err := state.Open(datadir.Slot(dir, i), state.Options{KeyGroups: m.KeyGroups, Range: r, ReadOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		if err := db.ScanRaw(r, func(k, v []byte) error {
			if kg := int(binary.BigEndian.Uint16(k)); !r.Contains(kg) {
				return fmt.Errorf("slot %d holds key group %d outside %v", i, kg, r)
			}
			out = append(out, kv{string(k), string(v)})
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		db.Close()
	}
	sort.Slice(out, func(i, j int) bool { return out[i].k < out[j].k })
	return out
}

func sameEntries(t testing.TB, what string, got, want []kv) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d entries, want %d", what, len(got), len(want))
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("%s: entry %d is %x=%x, want %x=%x", what, i, got[i].k, got[i].v, want[i].k, want[i].v)
		}
	}
}

func exportString(t testing.TB, store checkpoint.Store, m *checkpoint.Manifest, stages Stages) string {
	t.Helper()
	var b bytes.Buffer
	if _, err := Export(context.Background(), &b, ExportOptions{Store: store, Manifest: m, From: "x", Stages: stages}); err != nil {
		t.Fatal(err)
	}
	return b.String()
}
