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
	"os"

	"github.com/klauspost/compress/zstd"

	"cairn/state"
)

// The canonical (full) format of one slot, DESIGN.md "Checkpoints":
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

// countingWriter hashes and counts what passes to w.
type countingWriter struct {
	w io.Writer
	h hash.Hash
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.h.Write(p[:n])
	c.n += int64(n)
	return n, err
}

// slotScanner is what the canonical writer needs from a slot's DB.
type slotScanner interface {
	ScanRaw(r state.KeyGroupRange, fn func(k, v []byte) error) error
}

// writeCanonical writes the slot's data to f (truncated) and returns the
// index, the data's size and hex SHA-256.
func writeCanonical(ctx context.Context, db slotScanner, keyGroups int, r state.KeyGroupRange, f *os.File) (*SegmentIndex, int64, string, error) {
	cw := &countingWriter{w: f, h: sha256.New()}
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(1), zstd.WithEncoderCRC(true))
	if err != nil {
		return nil, 0, "", err
	}
	defer enc.Close()
	x := &SegmentIndex{FormatVersion: FormatVersion, KeyGroups: keyGroups, Range: r}
	var rec []byte
	for kg := r.First; kg <= r.Last; kg++ {
		if err := ctx.Err(); err != nil {
			return nil, 0, "", err
		}
		seg := Segment{KeyGroup: kg, Offset: cw.n}
		started := false
		err := db.ScanRaw(state.KeyGroupRange{First: kg, Last: kg}, func(k, v []byte) error {
			if !started {
				enc.Reset(cw)
				started = true
			}
			rec = binary.AppendUvarint(rec[:0], uint64(len(k)))
			rec = append(rec, k...)
			rec = binary.AppendUvarint(rec, uint64(len(v)))
			rec = append(rec, v...)
			seg.Count++
			seg.RawBytes += int64(len(rec))
			_, err := enc.Write(rec)
			return err
		})
		if err != nil {
			return nil, 0, "", fmt.Errorf("key group %d: %w", kg, err)
		}
		if started {
			if err := enc.Close(); err != nil {
				return nil, 0, "", fmt.Errorf("key group %d: %w", kg, err)
			}
			seg.Length = cw.n - seg.Offset
		} else {
			seg.Offset = 0
		}
		x.Segments = append(x.Segments, seg)
	}
	return x, cw.n, hex.EncodeToString(cw.h.Sum(nil)), nil
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
	dec, err := zstd.NewReader(io.LimitReader(rc, seg.Length), zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(1<<34))
	if err != nil {
		return err
	}
	defer dec.Close()
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
	return nil
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
