package checkpoint

import (
	"bytes"
	"io"
	"testing"

	"github.com/klauspost/compress/zstd"
)

// TestSegmentDecoderAfterCorruption: a decoder given back to the pool in
// the middle of a corrupt segment decodes the next segment exactly, and
// so does one given back before its segment's end (a scan stopped early).
func TestSegmentDecoderAfterCorruption(t *testing.T) {
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest))
	if err != nil {
		t.Fatal(err)
	}
	frame := func(seed byte) ([]byte, []byte) {
		plain := bytes.Repeat([]byte{seed, seed + 1, seed + 2, 'k', 'v'}, 200_000) // 1 MB: several blocks
		return plain, enc.EncodeAll(plain, nil)
	}
	_, good1 := frame(1)
	corrupt := append([]byte(nil), good1...)
	for i := len(corrupt) / 2; i < len(corrupt)/2+64; i++ {
		corrupt[i] ^= 0xff
	}
	for _, tc := range []struct {
		name  string
		first []byte
		read  int64 // bytes read from the first before it is given back (-1: all)
	}{
		{"corrupt", corrupt, -1},
		{"stopped early", good1, 1000},
	} {
		d, err := segmentDecoder(bytes.NewReader(tc.first))
		if err != nil {
			t.Fatal(err)
		}
		if tc.read < 0 {
			if _, err := io.Copy(io.Discard, d); err == nil {
				t.Fatalf("%s: the corrupt frame decoded without an error", tc.name)
			}
		} else if _, err := io.CopyN(io.Discard, d, tc.read); err != nil {
			t.Fatal(err)
		}
		putSegmentDecoder(d)
		plain2, good2 := frame(7)
		d2, err := segmentDecoder(bytes.NewReader(good2))
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(d2)
		putSegmentDecoder(d2)
		if err != nil || !bytes.Equal(got, plain2) {
			t.Fatalf("%s: the next segment decoded to %d bytes (err %v), want %d exact", tc.name, len(got), err, len(plain2))
		}
	}
}
