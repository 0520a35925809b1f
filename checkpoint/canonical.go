package checkpoint

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"sync"
	"sync/atomic"

	"github.com/klauspost/compress/zstd"

	"cairn/internal/base/procs"
	"cairn/state"
)

// The canonical (full) format of one slot, docs/DESIGN.md, "Checkpoints":
//
//	data.zst    for each key group of the slot's range that holds entries, in
//	            key-group order, one independent zstd frame (content checksum
//	            on) of records; a record is uvarint(len(key)) key
//	            uvarint(len(value)) value, keys being the raw Pebble keys
//	            (2-byte big-endian key group first) in key order and values
//	            the stored encoding (state.DB.ScanRaw).
//	index.json  SegmentIndex: every key group of the range with the offset and
//	            length of its frame in data.zst (length 0: no entries).
//
// INVARIANT: part of the on-store format (FormatVersion).
const (
	dataFile  = "data.zst"
	indexFile = "index.json"
)

// Segment locates one key group's frame in a slot's data.zst.
type Segment struct {
	KeyGroup int   `json:"kg"`
	Offset   int64 `json:"offset"`
	Length   int64 `json:"length"`
	// Count is the number of records, RawBytes their uncompressed size.
	Count    int64 `json:"count"`
	RawBytes int64 `json:"raw_bytes"`
}

// SegmentIndex is a slot's index.json.
type SegmentIndex struct {
	FormatVersion int                 `json:"format_version"`
	KeyGroups     int                 `json:"key_groups"`
	Range         state.KeyGroupRange `json:"range"`
	Segments      []Segment           `json:"segments"`
}

// Segment returns key group kg's entry.
func (x *SegmentIndex) Segment(kg int) (Segment, bool) {
	i := kg - x.Range.First
	if i < 0 || i >= len(x.Segments) || x.Segments[i].KeyGroup != kg {
		return Segment{}, false
	}
	return x.Segments[i], true
}

func decodeIndex(name string, data []byte) (*SegmentIndex, error) {
	var x SegmentIndex
	if err := json.Unmarshal(data, &x); err != nil {
		return nil, &CorruptionError{Object: name, Reason: err.Error()}
	}
	if x.FormatVersion != FormatVersion {
		return nil, fmt.Errorf("%w %d in %s", ErrUnsupportedVersion, x.FormatVersion, name)
	}
	if x.Range.Len() != len(x.Segments) {
		return nil, &CorruptionError{Object: name, Reason: fmt.Sprintf("%d segments for range %v", len(x.Segments), x.Range)}
	}
	var end int64
	for i, s := range x.Segments {
		if s.KeyGroup != x.Range.First+i || s.Offset < 0 || s.Length < 0 || (s.Length > 0 && s.Offset != end) {
			return nil, &CorruptionError{Object: name, Reason: fmt.Sprintf("bad segment %+v", s)}
		}
		end += s.Length
	}
	return &x, nil
}

// slotScanner is what the canonical writer needs from a slot's DB. ScanRaw
// may be called concurrently (one call per key group).
type slotScanner interface {
	ScanRaw(r state.KeyGroupRange, fn func(k, v []byte) error) error
}

// writeCanonical writes the slot's data to out and returns the index, the
// data's size and hex SHA-256.
func writeCanonical(ctx context.Context, db slotScanner, keyGroups int, r state.KeyGroupRange, out io.Writer) (*SegmentIndex, int64, string, error) {
	s := &canonicalSlot{db: db, r: r, out: out}
	if err := writeCanonicalSlots(ctx, keyGroups, []*canonicalSlot{s}, procs.CPUs()); err != nil {
		return nil, 0, "", err
	}
	return s.index, s.size, s.sum, nil
}

// canonicalSlot is one slot's canonical data to write: its DB, range and
// output, then (set by writeCanonicalSlots) its index, size and hex SHA-256.
type canonicalSlot struct {
	db  slotScanner
	r   state.KeyGroupRange
	out io.Writer
	// done, if set, runs (on a goroutine of its own) once the slot's last
	// frame is written, while the other slots' key groups may still encode:
	// the place to close the DB and commit the output. Its error fails the
	// write.
	done func() error

	index *SegmentIndex
	size  int64
	sum   string

	// The output in progress. Frames reach out in key-group order: the
	// frame of key group r.First+next is the head, whose encoder writes
	// straight to out (and the hash); the frames after it that are being
	// encoded meanwhile are buffered (up to limit bytes each) and
	// written when their turn comes.
	keyGroups int
	limit     int
	doneWG    *sync.WaitGroup
	doneErr   error
	h         hash.Hash
	n         int64
	segs      []Segment
	next      atomic.Int64
	mu        sync.Mutex
	cond      sync.Cond
	ready     map[int]*frame // complete buffered frames past the head
}

// frameBufferBudget bounds the compressed bytes the frames that are not
// the head buffer, in total: each of the workers' frames buffers up to
// frameBufferBudget/workers, and its encoder waits
// for its turn beyond that. Key groups whose frames fit (up to 32 MiB of
// compressed data on 2 cores: about 64 MiB of raw data) encode on every
// core; larger ones partly one after another.
var frameBufferBudget = 64 << 20 // a var for tests

// errCanonicalAborted stops the encoders of a canonical write that failed
// elsewhere.
var errCanonicalAborted = errors.New("checkpoint: canonical write aborted")

// frameChunk is the unit of a buffered frame's memory.
const frameChunk = 1 << 20

var chunkPool = sync.Pool{New: func() any { b := make([]byte, 0, frameChunk); return &b }}

// writeCanonicalSlots writes the canonical data of every slot, encoding
// key groups on up to workers goroutines (the format is CPU-bound: scan,
// zstd, SHA-256): every key group is an independent frame, so they encode
// in parallel, and each slot's frames are written in key-group order, the
// head one streamed, the ones after it buffered.
func writeCanonicalSlots(ctx context.Context, keyGroups int, slots []*canonicalSlot, workers int) error {
	type item struct {
		s *canonicalSlot
		i int
	}
	var items []item
	for _, s := range slots {
		items = append(items, make([]item, s.r.Len())...)
	}
	workers = max(1, min(workers, len(items)))
	items = items[:0]
	var doneWG sync.WaitGroup
	for _, s := range slots {
		s.keyGroups, s.doneWG, s.doneErr = keyGroups, &doneWG, nil
		s.index = nil
		s.limit = max(frameBufferBudget/workers, 1)
		s.h = sha256.New()
		s.n = 0
		s.segs = make([]Segment, s.r.Len())
		s.next.Store(0)
		s.cond.L = &s.mu
		s.ready = map[int]*frame{}
		for i := range s.segs {
			items = append(items, item{s, i})
		}
	}
	var (
		failed  atomic.Bool
		errOnce sync.Once
		first   error
		pos     atomic.Int64
	)
	fail := func(err error) {
		errOnce.Do(func() { first = err })
		failed.Store(true)
		for _, s := range slots {
			s.mu.Lock()
			s.cond.Broadcast()
			s.mu.Unlock()
		}
	}
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(1), zstd.WithEncoderCRC(true))
			if err != nil {
				fail(err)
				return
			}
			defer enc.Close()
			rec := make([]byte, 0, 64<<10)
			for {
				k := int(pos.Add(1)) - 1
				if k >= len(items) || failed.Load() {
					return
				}
				if err := ctx.Err(); err != nil {
					fail(err)
					return
				}
				it := items[k]
				if err := it.s.encodeFrame(enc, it.i, &rec, &failed); err != nil {
					fail(fmt.Errorf("key group %d: %w", it.s.r.First+it.i, err))
					return
				}
			}
		})
	}
	wg.Wait()
	doneWG.Wait()
	if failed.Load() {
		return first
	}
	for _, s := range slots {
		if s.index == nil {
			return fmt.Errorf("checkpoint: canonical writer: %d of %d frames written", s.next.Load(), len(s.segs))
		}
		if s.doneErr != nil {
			return s.doneErr
		}
	}
	return nil
}

// encodeFrame scans key group r.First+i and writes its frame (none when it
// holds no entries).
func (s *canonicalSlot) encodeFrame(enc *zstd.Encoder, i int, recp *[]byte, failed *atomic.Bool) error {
	kg := s.r.First + i
	f := &frame{s: s, i: i, failed: failed}
	f.seg.KeyGroup = kg
	rec := (*recp)[:0]
	started := false
	err := s.db.ScanRaw(state.KeyGroupRange{First: kg, Last: kg}, func(k, v []byte) error {
		if !started {
			enc.Reset(f)
			started = true
		}
		n := len(rec)
		rec = binary.AppendUvarint(rec, uint64(len(k)))
		rec = append(rec, k...)
		rec = binary.AppendUvarint(rec, uint64(len(v)))
		rec = append(rec, v...)
		f.seg.Count++
		f.seg.RawBytes += int64(len(rec) - n)
		if len(rec) >= 60<<10 {
			_, err := enc.Write(rec)
			rec = rec[:0]
			return err
		}
		return nil
	})
	if err == nil && started {
		if len(rec) > 0 {
			_, err = enc.Write(rec)
		}
		if err == nil {
			err = enc.Close()
		}
	}
	if cap(rec) <= 1<<20 {
		*recp = rec[:0]
	}
	if err != nil {
		f.release()
		return err
	}
	return f.finish()
}

// frame is one key group's frame on its way to the slot's output: the
// encoder's io.Writer.
type frame struct {
	s      *canonicalSlot
	i      int
	failed *atomic.Bool
	seg    Segment
	head   bool
	start  int64     // output offset of the frame, once head
	bufs   []*[]byte // buffered output while not the head
	size   int
}

func (f *frame) Write(p []byte) (int, error) {
	n := len(p)
	if !f.head && f.size+len(p) > f.s.limit {
		// Wait for this frame's turn rather than buffer more.
		s := f.s
		s.mu.Lock()
		for int(s.next.Load()) != f.i && !f.failed.Load() {
			s.cond.Wait()
		}
		s.mu.Unlock()
		if f.failed.Load() {
			return 0, errCanonicalAborted
		}
	}
	if !f.head && int(f.s.next.Load()) == f.i {
		if err := f.becomeHead(); err != nil {
			return 0, err
		}
	}
	if f.head {
		if err := f.s.emit(p); err != nil {
			return 0, err
		}
		return len(p), nil
	}
	for len(p) > 0 {
		if len(f.bufs) == 0 || len(*f.bufs[len(f.bufs)-1]) == frameChunk {
			f.bufs = append(f.bufs, chunkPool.Get().(*[]byte))
		}
		b := f.bufs[len(f.bufs)-1]
		c := min(len(p), frameChunk-len(*b))
		*b = append(*b, p[:c]...)
		f.size += c
		p = p[c:]
	}
	return n, nil
}

// becomeHead writes what the frame buffered; its encoder then writes
// straight to the output. Only the head writes to the output: no lock.
func (f *frame) becomeHead() error {
	f.head = true
	f.start = f.s.n
	return f.flush()
}

func (f *frame) flush() error {
	for _, b := range f.bufs {
		if err := f.s.emit(*b); err != nil {
			return err
		}
	}
	f.release()
	return nil
}

func (f *frame) release() {
	for _, b := range f.bufs {
		*b = (*b)[:0]
		chunkPool.Put(b)
	}
	f.bufs, f.size = nil, 0
}

// emit writes to the slot's output and hash.
func (s *canonicalSlot) emit(p []byte) error {
	n, err := s.out.Write(p)
	s.h.Write(p[:n])
	s.n += int64(n)
	if err == nil && n < len(p) {
		err = io.ErrShortWrite
	}
	return err
}

// finish completes the frame: as the head, it records its segment and
// writes the complete frames that follow; otherwise it waits, buffered, for
// the head to reach it.
func (f *frame) finish() error {
	s := f.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if int(s.next.Load()) != f.i {
		s.ready[f.i] = f
		return nil
	}
	for {
		if !f.head {
			f.head = true
			f.start = s.n
			if err := f.flush(); err != nil {
				return err
			}
		}
		f.seg.Offset, f.seg.Length = f.start, s.n-f.start
		if f.seg.Length == 0 {
			f.seg.Offset = 0
		}
		s.segs[f.i] = f.seg
		s.next.Store(int64(f.i + 1))
		next, ok := s.ready[f.i+1]
		if !ok {
			break
		}
		delete(s.ready, f.i+1)
		f = next
	}
	s.cond.Broadcast()
	if int(s.next.Load()) == len(s.segs) {
		s.complete()
	}
	return nil
}

// complete records the slot's index, size and checksum once its last frame
// is written, and starts done.
func (s *canonicalSlot) complete() {
	s.index = &SegmentIndex{FormatVersion: FormatVersion, KeyGroups: s.keyGroups, Range: s.r, Segments: s.segs}
	s.size = s.n
	s.sum = hex.EncodeToString(s.h.Sum(nil))
	s.ready = nil
	if s.done != nil {
		s.doneWG.Go(func() { s.doneErr = s.done() })
	}
}

// findObject returns the slot's object of a kind.
func findObject(m *Manifest, slot int, kind Kind) (Object, error) {
	for _, o := range m.Objects {
		if o.Slot == slot && o.Kind == kind {
			return o, nil
		}
	}
	return Object{}, fmt.Errorf("checkpoint: %s/%d slot %d has no %s object (mode %s)", m.Job, m.ID, slot, kind, m.Mode)
}

// fetchVerified reads a whole object and checks it against the manifest.
func fetchVerified(ctx context.Context, s Store, o Object) ([]byte, error) {
	b, err := readAll(ctx, s, o.Path)
	if err != nil {
		return nil, err
	}
	if int64(len(b)) != o.Size {
		return nil, &CorruptionError{Object: o.Path, Reason: fmt.Sprintf("size %d, manifest says %d", len(b), o.Size)}
	}
	if sum := sha256.Sum256(b); hex.EncodeToString(sum[:]) != o.SHA256 {
		return nil, &CorruptionError{Object: o.Path, Reason: "sha256 mismatch"}
	}
	return b, nil
}

// ReadIndex reads and verifies the canonical index of one slot of a full
// checkpoint.
func ReadIndex(ctx context.Context, s Store, m *Manifest, slot int) (*SegmentIndex, error) {
	o, err := findObject(m, slot, KindIndex)
	if err != nil {
		return nil, err
	}
	b, err := fetchVerified(ctx, s, o)
	if err != nil {
		return nil, err
	}
	x, err := decodeIndex(o.Path, b)
	if err != nil {
		return nil, err
	}
	if x.Range != m.Slots[slot].Range || x.KeyGroups != m.KeyGroups {
		return nil, &CorruptionError{Object: o.Path, Reason: fmt.Sprintf("range %v of %d, manifest says %v of %d", x.Range, x.KeyGroups, m.Slots[slot].Range, m.KeyGroups)}
	}
	return x, nil
}

// ReadKeyGroup calls fn with every key and value of key group kg stored in
// slot of the full checkpoint m, in key order, reading only that key group's
// segment (a ranged read). key and value are valid only until fn returns.
func ReadKeyGroup(ctx context.Context, s Store, m *Manifest, slot, kg int, fn func(key, value []byte) error) error {
	x, err := ReadIndex(ctx, s, m, slot)
	if err != nil {
		return err
	}
	return ReadSegment(ctx, s, m, slot, x, kg, fn)
}

// ReadSegment is ReadKeyGroup with an index already read by ReadIndex.
func ReadSegment(ctx context.Context, s Store, m *Manifest, slot int, x *SegmentIndex, kg int, fn func(key, value []byte) error) error {
	return ReadSegmentTo(ctx, s, m, slot, x, kg, nil, fn)
}

// ReadSegmentTo is ReadSegment that also writes the segment's stored
// (compressed) bytes to stored, every one of them, in order (nil: none). A
// reader of every key group of a slot in order writes the whole data
// object there, and can check it against the manifest's SHA-256 (a
// segment's own checks, zstd's content checksum and the record count,
// catch every change to the records, but not every flipped bit: zstd's
// headers and tables have bits that do not change what they decode to).
func ReadSegmentTo(ctx context.Context, s Store, m *Manifest, slot int, x *SegmentIndex, kg int, stored io.Writer, fn func(key, value []byte) error) error {
	if slot < 0 || slot >= len(m.Slots) {
		return fmt.Errorf("checkpoint: %s/%d has no slot %d", m.Job, m.ID, slot)
	}
	seg, ok := x.Segment(kg)
	if !ok {
		return fmt.Errorf("checkpoint: key group %d is not in slot %d's range %v", kg, slot, x.Range)
	}
	if seg.Length == 0 {
		return nil
	}
	data, err := findObject(m, slot, KindFullData)
	if err != nil {
		return err
	}
	if seg.Offset+seg.Length > data.Size {
		return &CorruptionError{Object: data.Path, Reason: fmt.Sprintf("segment of key group %d ends at %d beyond size %d", kg, seg.Offset+seg.Length, data.Size)}
	}
	rc, err := s.GetRange(ctx, data.Path, seg.Offset, seg.Length)
	if err != nil {
		return err
	}
	defer rc.Close()
	var src io.Reader = io.LimitReader(rc, seg.Length)
	if stored != nil {
		src = io.TeeReader(src, stored)
	}
	dec, err := segmentDecoder(src)
	if err != nil {
		return err
	}
	defer putSegmentDecoder(dec)
	corrupt := func(reason string, args ...any) error {
		return &CorruptionError{Object: data.Path, Reason: fmt.Sprintf("key group %d: ", kg) + fmt.Sprintf(reason, args...)}
	}
	br := &byteReader{r: dec}
	var count int64
	var k, v []byte
	for {
		kl, err := binary.ReadUvarint(br)
		if err == io.EOF {
			break
		}
		if err != nil {
			return corrupt("%v", err)
		}
		if k, err = readN(br, k, kl); err != nil {
			return corrupt("key: %v", err)
		}
		vl, err := binary.ReadUvarint(br)
		if err != nil {
			return corrupt("value length: %v", err)
		}
		if v, err = readN(br, v, vl); err != nil {
			return corrupt("value: %v", err)
		}
		if len(k) < 2 || int(binary.BigEndian.Uint16(k)) != kg {
			return corrupt("key %x outside the key group", k)
		}
		count++
		if err := fn(k, v); err != nil {
			return err
		}
	}
	if count != seg.Count {
		return corrupt("%d records, index says %d", count, seg.Count)
	}
	if stored != nil {
		// The rest of the segment (the decoder may stop short of it).
		if _, err := io.Copy(io.Discard, src); err != nil {
			return fmt.Errorf("checkpoint: read %s: %w", data.Path, err)
		}
	}
	return nil
}

// segmentDecoders are synchronous zstd decoders (no goroutines) kept for
// the next segment: a new decoder allocates and zeroes its history ring,
// the window (the full writer's default, 8 MiB) and two blocks, before
// its first byte, which cost a full restore of 130 segments more CPU
// than decoding them (75% of ReadSegment's time in a profile of the
// drill); Reset keeps the ring.
var segmentDecoders sync.Pool

func segmentDecoder(r io.Reader) (*zstd.Decoder, error) {
	if d, ok := segmentDecoders.Get().(*zstd.Decoder); ok {
		if err := d.Reset(r); err == nil {
			return d, nil
		}
		d.Close()
	}
	return zstd.NewReader(r, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(1<<34))
}

// putSegmentDecoder keeps d for the next segment, holding no reader.
func putSegmentDecoder(d *zstd.Decoder) {
	if d.Reset(nil) != nil {
		d.Close()
		return
	}
	segmentDecoders.Put(d)
}

// byteReader adds io.ByteReader to a reader, buffered.
type byteReader struct {
	r   io.Reader
	buf [32 << 10]byte
	pos int
	end int
	err error
}

func (b *byteReader) fill() {
	if b.pos < b.end || b.err != nil {
		return
	}
	b.pos = 0
	b.end, b.err = b.r.Read(b.buf[:])
	if b.end > 0 && b.err == io.EOF {
		b.err = nil
	}
}

func (b *byteReader) ReadByte() (byte, error) {
	for b.pos >= b.end {
		if b.err != nil {
			return 0, b.err
		}
		b.fill()
	}
	c := b.buf[b.pos]
	b.pos++
	return c, nil
}

func (b *byteReader) Read(p []byte) (int, error) {
	for b.pos >= b.end {
		if b.err != nil {
			return 0, b.err
		}
		b.fill()
	}
	n := copy(p, b.buf[b.pos:b.end])
	b.pos += n
	return n, nil
}

func readN(r io.Reader, buf []byte, n uint64) ([]byte, error) {
	if n > 1<<31 {
		return nil, errors.New("length too large")
	}
	if uint64(cap(buf)) < n {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	if _, err := io.ReadFull(r, buf); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return buf, nil
}
