package checkpoint

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"cairn/state"
)

// randScanner serves random records per key group, some key groups empty,
// some large; failAt makes ScanRaw of that key group fail midway.
type randScanner struct {
	recs   map[int][][2][]byte
	failAt int
}

func newRandScanner(seed uint64, r state.KeyGroupRange) *randScanner {
	rng := rand.New(rand.NewPCG(seed, 1))
	s := &randScanner{recs: map[int][][2][]byte{}, failAt: -1}
	for kg := r.First; kg <= r.Last; kg++ {
		n := 0
		switch rng.IntN(4) {
		case 0: // empty
		case 1:
			n = rng.IntN(50)
		case 2:
			n = 200 + rng.IntN(1000)
		default:
			n = 2000 + rng.IntN(5000)
		}
		for i := range n {
			k := binary.BigEndian.AppendUint16(nil, uint16(kg))
			k = fmt.Appendf(k, "key-%08d", i)
			v := make([]byte, rng.IntN(200))
			for j := range v {
				v[j] = "0123456789abcdef"[rng.IntN(16)]
			}
			s.recs[kg] = append(s.recs[kg], [2][]byte{k, v})
		}
	}
	return s
}

func (s *randScanner) ScanRaw(r state.KeyGroupRange, fn func(k, v []byte) error) error {
	for kg := r.First; kg <= r.Last; kg++ {
		for i, rec := range s.recs[kg] {
			if kg == s.failAt && i == len(s.recs[kg])/2 {
				return errors.New("injected scan failure")
			}
			if err := fn(rec[0], rec[1]); err != nil {
				return err
			}
		}
	}
	return nil
}

// TestCanonicalParallel: the key groups of several slots encoded on many
// workers, with frames buffered, waiting for their turn at the buffer
// limit, or streamed, give the same bytes as one worker, and the frames
// decode to the records in key order.
func TestCanonicalParallel(t *testing.T) {
	ctx := context.Background()
	const keyGroups = 64
	ranges := []state.KeyGroupRange{{First: 0, Last: 20}, {First: 21, Last: 42}, {First: 43, Last: 63}}
	write := func(workers, limit int) ([]*canonicalSlot, []*bytes.Buffer) {
		t.Helper()
		old := frameBufferBudget
		frameBufferBudget = limit
		defer func() { frameBufferBudget = old }()
		var cs []*canonicalSlot
		var outs []*bytes.Buffer
		for i, r := range ranges {
			var b bytes.Buffer
			cs = append(cs, &canonicalSlot{db: newRandScanner(uint64(i), r), r: r, out: &b})
			outs = append(outs, &b)
		}
		if err := writeCanonicalSlots(ctx, keyGroups, cs, workers); err != nil {
			t.Fatal(err)
		}
		return cs, outs
	}
	ref, refOut := write(1, 32<<20)
	for i, s := range ref {
		sum := sha256.Sum256(refOut[i].Bytes())
		if s.size != int64(refOut[i].Len()) || s.sum != hex.EncodeToString(sum[:]) {
			t.Fatalf("slot %d: size %d sum %s for %d bytes", i, s.size, s.sum, refOut[i].Len())
		}
		checkFrames(t, s.db.(*randScanner), s.index, refOut[i].Bytes())
	}
	for _, tc := range []struct{ workers, limit int }{{2, 32 << 20}, {4, 32 << 20}, {8, 1 << 10}, {3, 64 << 10}} {
		got, gotOut := write(tc.workers, tc.limit)
		for i := range got {
			if !bytes.Equal(gotOut[i].Bytes(), refOut[i].Bytes()) || got[i].sum != ref[i].sum || !reflect.DeepEqual(got[i].index, ref[i].index) {
				t.Errorf("workers %d, buffer limit %d: slot %d differs from one worker's", tc.workers, tc.limit, i)
			}
		}
	}
}

func checkFrames(t *testing.T, s *randScanner, x *SegmentIndex, data []byte) {
	t.Helper()
	dec, err := zstd.NewReader(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer dec.Close()
	for _, seg := range x.Segments {
		recs := s.recs[seg.KeyGroup]
		if seg.Count != int64(len(recs)) || (seg.Length == 0) != (len(recs) == 0) {
			t.Fatalf("segment %+v for %d records", seg, len(recs))
		}
		if seg.Length == 0 {
			continue
		}
		raw, err := dec.DecodeAll(data[seg.Offset:seg.Offset+seg.Length], nil)
		if err != nil {
			t.Fatalf("key group %d: %v", seg.KeyGroup, err)
		}
		var want []byte
		for _, r := range recs {
			want = binary.AppendUvarint(want, uint64(len(r[0])))
			want = append(want, r[0]...)
			want = binary.AppendUvarint(want, uint64(len(r[1])))
			want = append(want, r[1]...)
		}
		if !bytes.Equal(raw, want) || seg.RawBytes != int64(len(want)) {
			t.Fatalf("key group %d: records differ", seg.KeyGroup)
		}
	}
}

// TestCanonicalParallelFailure: a key group that fails to scan fails the
// write, whichever frames were buffered or waiting, without hanging.
func TestCanonicalParallelFailure(t *testing.T) {
	old := frameBufferBudget
	frameBufferBudget = 4 << 10
	defer func() { frameBufferBudget = old }()
	r := state.KeyGroupRange{First: 0, Last: 31}
	for _, failAt := range []int{0, 1, 7, 31} {
		s := newRandScanner(9, r)
		s.failAt = failAt
		if len(s.recs[failAt]) == 0 {
			s.recs[failAt] = [][2][]byte{{{0, byte(failAt)}, []byte("v")}, {{0, byte(failAt)}, []byte("w")}}
		}
		done := make(chan error, 1)
		go func() {
			done <- writeCanonicalSlots(context.Background(), 32, []*canonicalSlot{{db: s, r: r, out: &bytes.Buffer{}}}, 4)
		}()
		select {
		case err := <-done:
			if err == nil || !bytes.Contains([]byte(err.Error()), []byte("injected")) {
				t.Errorf("fail at key group %d: err %v", failAt, err)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("fail at key group %d: hung", failAt)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := writeCanonicalSlots(ctx, 32, []*canonicalSlot{{db: newRandScanner(1, r), r: r, out: &bytes.Buffer{}}}, 2); !errors.Is(err, context.Canceled) {
		t.Errorf("canceled: err %v", err)
	}
}

// TestFullStreamsIntoFileStore: through OpenStore (a RetryStore over the
// file store), a full checkpoint's data objects are encoded straight into
// the store: every key reads back, Verify passes, the upload bandwidth is
// not sampled from them, and no temporary file is left in the store or
// next to the snapshots.
func TestFullStreamsIntoFileStore(t *testing.T) {
	ctx := context.Background()
	const kgs, slots, keys = 16, 2, 20000
	dbs := openSlots(t, kgs, slots)
	write(t, dbs, kgs, 0, keys, 0)
	root := t.TempDir()
	store, err := OpenStore(ctx, "file://"+root)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := asStreamStore(store); !ok {
		t.Fatal("the file store behind OpenStore takes no stream")
	}
	w, err := NewWriter(ctx, store, WriterConfig{Job: testJob, KeyGroups: kgs, Slots: slots, Mode: ModeFull, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close(ctx)
	snaps := snapshot(t, dbs)
	m, err := w.Commit(ctx, w.NextID(), Meta{}, snaps)
	if err != nil {
		t.Fatal(err)
	}
	if m.Figures.FilesUploaded != 2*slots || m.Figures.BytesUploaded != m.Figures.FullStateSize || m.Figures.StoreBandwidth != 0 {
		t.Errorf("figures %+v", m.Figures)
	}
	total := 0
	for slot, d := range dbs {
		for kg := d.r.First; kg <= d.r.Last; kg++ {
			if err := ReadKeyGroup(ctx, store, m, slot, kg, func(k, v []byte) error { total++; return nil }); err != nil {
				t.Fatal(err)
			}
		}
	}
	if total != keys {
		t.Fatalf("read %d entries, wrote %d keys", total, keys)
	}
	if probs, err := Verify(ctx, store, testJob, m.ID); err != nil || len(probs) != 0 {
		t.Fatalf("verify: %v %v", err, probs)
	}
	for _, dir := range []string{root, filepath.Dir(snaps[0].Dir)} {
		filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err == nil && (strings.HasPrefix(d.Name(), tmpPrefix) || strings.HasPrefix(d.Name(), ".cairn-full-")) {
				t.Errorf("temporary file left: %s", p)
			}
			return nil
		})
	}
}

// TestFileStoreStream: an object written through the file store's stream is
// visible only once committed, and an aborted one leaves nothing.
func TestFileStoreStream(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	s, err := NewFileStore(root, true)
	if err != nil {
		t.Fatal(err)
	}
	ss, _ := asStreamStore(s)
	o, err := ss.create(ctx, "a/b/data")
	if err != nil {
		t.Fatal(err)
	}
	o.Write([]byte("hello "))
	o.Write([]byte("world"))
	if _, err := s.Stat(ctx, "a/b/data"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("visible before commit: %v", err)
	}
	if err := o.Commit(); err != nil {
		t.Fatal(err)
	}
	if b, err := readAll(ctx, s, "a/b/data"); err != nil || string(b) != "hello world" {
		t.Fatalf("read %q, %v", b, err)
	}
	o, err = ss.create(ctx, "a/b/other")
	if err != nil {
		t.Fatal(err)
	}
	o.Write([]byte("x"))
	o.Abort()
	objs, err := listAll(ctx, s, "a/")
	if err != nil || len(objs) != 1 || objs[0].Name != "a/b/data" {
		t.Fatalf("after abort: %v %v", objs, err)
	}
}

// TestCanonicalDone: each slot's done runs once, after its last frame is
// written (the output is complete then), and its error fails the write.
func TestCanonicalDone(t *testing.T) {
	ranges := []state.KeyGroupRange{{First: 0, Last: 9}, {First: 10, Last: 19}}
	var cs []*canonicalSlot
	calls := make([]int, len(ranges))
	for i, r := range ranges {
		var b bytes.Buffer
		s := &canonicalSlot{db: newRandScanner(uint64(i), r), r: r, out: &b}
		s.done = func() error {
			calls[i]++
			if s.index == nil || s.size != int64(b.Len()) {
				t.Errorf("slot %d: done before its output is complete", i)
			}
			if i == 1 {
				return errors.New("commit failed")
			}
			return nil
		}
		cs = append(cs, s)
	}
	err := writeCanonicalSlots(context.Background(), 20, cs, 3)
	if err == nil || err.Error() != "commit failed" {
		t.Errorf("err %v", err)
	}
	if calls[0] != 1 || calls[1] != 1 {
		t.Errorf("done calls %v", calls)
	}
}

// TestCanonicalSameBytesAsBefore: the parallel writer's data and index are
// byte for byte those of the single-encoder writer it replaced
// (legacyWriteCanonical): the format did not change, so it needs no new
// version and every stored full checkpoint still reads.
func TestCanonicalSameBytesAsBefore(t *testing.T) {
	r := state.KeyGroupRange{First: 3, Last: 40}
	db := newRandScanner(5, r)
	f, err := os.CreateTemp(t.TempDir(), "legacy")
	if err != nil {
		t.Fatal(err)
	}
	x, size, sum, err := legacyWriteCanonical(context.Background(), db, 64, r, f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	want, _ := os.ReadFile(f.Name())
	var got bytes.Buffer
	gx, gsize, gsum, err := writeCanonical(context.Background(), db, 64, r, &got)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Bytes(), want) || gsize != size || gsum != sum || !reflect.DeepEqual(gx, x) {
		t.Fatalf("differs from the writer before: %d bytes vs %d", got.Len(), len(want))
	}
}
