package checkpoint

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"cairn/state"
)

var rewrite = flag.Bool("rewrite", false, "write the format fixtures of testdata/format-* that do not exist yet (existing ones are never overwritten)")

// Format fixtures: bytes written once by the encoder of their format
// version, committed under testdata/format-<version>/, and decoded by
// TestFixtures forever. The expected values are written out below, not
// derived from the encoder, so a renamed JSON tag, a changed field order or
// a changed varint fails here.
//
// RULE: a format change must be a new version (FormatVersion), with a new
// fixture directory next to the old one, and the old fixture still read.
// Never edit or regenerate a committed fixture to make this test pass.
// "go test ./checkpoint -run TestFixtures -rewrite" writes only fixtures
// that are missing (the ones of a new version).

const (
	fixtureDir      = "testdata/format-1"
	fixtureManifest = fixtureDir + "/manifest-incremental.json" // manifest v1, every field set
	fixtureFull     = fixtureDir + "/full"                      // a store holding one full (canonical) checkpoint
	fixtureFullJob  = "fixture"
	fixtureFullID   = 9

	// fixtureManifestV2 is a manifest of format 2: a savepoint a state
	// tool wrote, with state versions and its origin.
	fixtureManifestV2 = "testdata/format-2/manifest-savepoint.json"
)

// fixtureSavepointV2 is the manifest in fixtureManifestV2. Its checksum is
// filled in when the fixture is written.
func fixtureSavepointV2() *Manifest {
	m := fixtureFullManifest()
	m.FormatVersion = FormatVersion2
	m.Checksum = ""
	m.StateVersions = map[string]int{"count": 2, "enrich": 7}
	m.Origin = &Origin{Tool: "migrate", From: "savepoint:before", FromID: 9, Steps: []string{"migrate stage count with m.wasm (sha256 0123456789ab) to state version 2", "rename stage x to enrich"}}
	for i := range m.Objects {
		m.Objects[i].Path = strings.Replace(m.Objects[i].Path, "chk-00000000000000000009", "savepoints/after", 1)
	}
	return m
}

func sum64(s string) string { return strings.Repeat(s, 32) }

// fixtureIncremental is the manifest in fixtureManifest.
func fixtureIncremental() *Manifest {
	return &Manifest{
		FormatVersion: 1,
		Job:           "fixture",
		ID:            7,
		Mode:          "incremental",
		Time:          time.Date(2026, 1, 2, 3, 4, 5, 123456789, time.UTC),
		KeyGroups:     128,
		Slots: []SlotInfo{
			{Slot: 0, Range: state.KeyGroupRange{First: 0, Last: 63}},
			{Slot: 1, Range: state.KeyGroupRange{First: 64, Last: 127}},
		},
		SourceStream: "orders",
		SourceSeq:    4242,
		Parent:       6,
		ChainLength:  2,
		Modules:      map[string]string{"count": sum64("c0"), "enrich": sum64("e1")},
		ABIVersion:   1,
		Objects: []Object{
			{Path: "fixture/shared/ab/" + sum64("ab") + ".sst", File: "000005.sst", Size: 1234, SHA256: sum64("ab"), Kind: "sst", Slot: 0},
			{Path: "fixture/chk-00000000000000000007/slot-0/MANIFEST-000001", File: "MANIFEST-000001", Size: 56, SHA256: sum64("01"), Kind: "meta", Slot: 0},
			{Path: "fixture/shared/cd/" + sum64("cd") + ".sst", File: "000007.sst", Size: 5678, SHA256: sum64("cd"), Kind: "sst", Slot: 1},
			{Path: "fixture/chk-00000000000000000007/slot-1/OPTIONS-000003", File: "OPTIONS-000003", Size: 78, SHA256: sum64("02"), Kind: "meta", Slot: 1},
		},
		Figures: Figures{
			SyncMax:          3 * time.Millisecond,
			SyncPerSlot:      []time.Duration{2 * time.Millisecond, 3 * time.Millisecond},
			Async:            1500 * time.Millisecond,
			BytesUploaded:    1290,
			FilesUploaded:    2,
			FilesReused:      2,
			BytesReused:      5756,
			FullStateSize:    7046,
			StoreBandwidth:   100 << 20,
			PredictedRestore: 67 * time.Microsecond,
		},
		Checksum: "f3062e76e36af2109ae12bc827e00a39241ac6d0dff631a8313817e69e7b8801",
	}
}

// fixtureRecord is one key-value pair of the full checkpoint fixture: a raw
// Pebble key (2-byte big-endian key group first) and a stored value.
type fixtureRecord struct{ key, value string }

// fixtureFullData is the state of the full checkpoint fixture, by key
// group: 4 key groups on 2 slots. Key group 1 is empty (a zero-length
// segment); key group 3 has a value longer than 127 bytes (a 2-byte
// uvarint length).
var fixtureFullData = map[int][]fixtureRecord{
	0: {{"\x00\x00\x01\x01\x01a", "\x00one"}, {"\x00\x00\x01\x01\x01b", "\x00two"}},
	2: {{"\x00\x02\x01\x01\x01c", ""}},
	3: {{"\x00\x03\x00\x03\x01", "\x00\x00\x00\x00\x00\x00\x00\x2a"}, {"\x00\x03\x01\x01\x01d", "\x00" + strings.Repeat("v", 200)}, {"\x00\x03\x01\x01\x01e", "\x01\x00\x00\x01\x9b\x00\x00\x00\x00late"}},
}

// fixtureFullManifest is the MANIFEST.json of the full checkpoint fixture.
func fixtureFullManifest() *Manifest {
	dir := "fixture/chk-00000000000000000009/"
	return &Manifest{
		FormatVersion: 1,
		Job:           fixtureFullJob,
		ID:            fixtureFullID,
		Mode:          "full",
		Time:          time.Date(2026, 2, 3, 4, 5, 6, 0, time.UTC),
		KeyGroups:     4,
		Slots: []SlotInfo{
			{Slot: 0, Range: state.KeyGroupRange{First: 0, Last: 1}},
			{Slot: 1, Range: state.KeyGroupRange{First: 2, Last: 3}},
		},
		SourceStream: "orders",
		SourceSeq:    99,
		ChainLength:  1,
		ABIVersion:   1,
		Objects: []Object{
			{Path: dir + "slot-0/data.zst", File: "data.zst", Size: 37, SHA256: "c2595504a6205465f8202e7ebde9451eed44380d6345ef66dd669548db4550dc", Kind: "segment", Slot: 0},
			{Path: dir + "slot-0/index.json", File: "index.json", Size: 189, SHA256: "3c25d13576e7399c43de88f5809718d070e91fa83f5547b101c7bb9aa7c01dfe", Kind: "index", Slot: 0},
			{Path: dir + "slot-1/data.zst", File: "data.zst", Size: 82, SHA256: "097840cb5ee5a0b7585d898681e1b2038e57cfd35925b128b12066f684f10995", Kind: "segment", Slot: 1},
			{Path: dir + "slot-1/index.json", File: "index.json", Size: 192, SHA256: "81b35a32ac94351a06574cd1106fee4da0f4788b4adb51964004664ce586ae7e", Kind: "index", Slot: 1},
		},
		Figures:  Figures{SyncMax: time.Millisecond, SyncPerSlot: []time.Duration{time.Millisecond, time.Millisecond}, Async: 2 * time.Millisecond, BytesUploaded: 500, FilesUploaded: 4, FullStateSize: 500},
		Checksum: "1a4828236e6aa04e541b123750e8b8cf0d6dcf5df3e04068af6bfc73c1d00045",
	}
}

// fixtureFullIndexes are the index.json of the full checkpoint fixture's
// slots.
func fixtureFullIndexes() []*SegmentIndex {
	return []*SegmentIndex{
		{FormatVersion: 1, KeyGroups: 4, Range: state.KeyGroupRange{First: 0, Last: 1}, Segments: []Segment{
			{KeyGroup: 0, Offset: 0, Length: 37, Count: 2, RawBytes: 24},
			{KeyGroup: 1, Offset: 0, Length: 0, Count: 0, RawBytes: 0},
		}},
		{FormatVersion: 1, KeyGroups: 4, Range: state.KeyGroupRange{First: 2, Last: 3}, Segments: []Segment{
			{KeyGroup: 2, Offset: 0, Length: 21, Count: 1, RawBytes: 8},
			{KeyGroup: 3, Offset: 21, Length: 61, Count: 3, RawBytes: 246},
		}},
	}
}

// TestFixtures decodes the committed format fixtures and compares every
// field with the values written above. See the RULE above.
func TestFixtures(t *testing.T) {
	if *rewrite {
		writeFixtures(t)
	}
	t.Run("manifest-v1", func(t *testing.T) {
		data, err := os.ReadFile(fixtureManifest)
		if err != nil {
			t.Fatal(err)
		}
		got, err := Decode(data)
		if err != nil {
			t.Fatalf("the committed v1 manifest no longer decodes: %v", err)
		}
		compareManifest(t, got, fixtureIncremental())
	})
	t.Run("manifest-v2", func(t *testing.T) {
		data, err := os.ReadFile(fixtureManifestV2)
		if err != nil {
			t.Fatal(err)
		}
		got, err := Decode(data)
		if err != nil {
			t.Fatalf("the committed v2 manifest no longer decodes: %v", err)
		}
		want := fixtureSavepointV2()
		want.Checksum = got.Checksum
		compareManifest(t, got, want)
		if !reflect.DeepEqual(got.StateVersions, want.StateVersions) || !reflect.DeepEqual(got.Origin, want.Origin) {
			t.Errorf("state versions %v origin %+v, want %v %+v", got.StateVersions, got.Origin, want.StateVersions, want.Origin)
		}
		// The encoder writes the same bytes, and the version follows the
		// fields: without them a manifest is still written as version 1.
		if enc, err := fixtureSavepointV2().Encode(); err != nil || !bytes.Equal(enc, data) {
			t.Errorf("Manifest.Encode no longer writes %s (err %v):\n got %s\nwant %s", fixtureManifestV2, err, enc, data)
		}
		plain := fixtureSavepointV2()
		plain.FormatVersion, plain.StateVersions, plain.Origin = FormatVersion, nil, nil
		if enc, err := plain.Encode(); err != nil || !bytes.Contains(enc, []byte(`"format_version": 1,`)) {
			t.Errorf("a manifest without format 2 fields is not written as format 1: %v\n%s", err, enc)
		}
		// A format-1 manifest carrying format-2 fields is refused.
		bad := fixtureSavepointV2()
		bad.FormatVersion = FormatVersion
		if err := bad.Validate(); err == nil {
			t.Error("a format-1 manifest with state_versions validated")
		}
	})
	t.Run("full-checkpoint-v1", func(t *testing.T) {
		ctx := context.Background()
		s := loadFixtureStore(t, fixtureFull)
		name := ManifestPath(fixtureFullJob, fixtureFullID)
		b, err := readAll(ctx, s, name)
		if err != nil {
			t.Fatal(err)
		}
		m, err := DecodeObject(name, b)
		if err != nil {
			t.Fatalf("the committed full-checkpoint manifest no longer decodes: %v", err)
		}
		compareManifest(t, m, fixtureFullManifest())
		for slot, want := range fixtureFullIndexes() {
			x, err := ReadIndex(ctx, s, m, slot)
			if err != nil {
				t.Fatalf("slot %d: index: %v", slot, err)
			}
			compareIndex(t, slot, x, want)
			for kg := want.Range.First; kg <= want.Range.Last; kg++ {
				var got []fixtureRecord
				err := ReadSegment(ctx, s, m, slot, x, kg, func(k, v []byte) error {
					got = append(got, fixtureRecord{string(k), string(v)})
					return nil
				})
				if err != nil {
					t.Fatalf("slot %d key group %d: %v", slot, kg, err)
				}
				if w := fixtureFullData[kg]; !reflect.DeepEqual(got, w) && len(got)+len(w) > 0 {
					t.Errorf("slot %d key group %d: records\n got %q\nwant %q", slot, kg, got, w)
				}
			}
		}
	})
	// The encoders of the current version still write the committed bytes:
	// an added field, a renamed tag or a reordered struct is a format change
	// even when the old bytes still decode. (The zstd bytes are not compared:
	// a compression library upgrade may change them without a format change.)
	t.Run("encoders-unchanged", func(t *testing.T) {
		if FormatVersion != 1 {
			t.Skip("the current format is not 1: compare with its own fixture")
		}
		data, err := os.ReadFile(fixtureManifest)
		if err != nil {
			t.Fatal(err)
		}
		if enc, err := fixtureIncremental().Encode(); err != nil || !bytes.Equal(enc, data) {
			t.Errorf("Manifest.Encode no longer writes %s (err %v):\n got %s\nwant %s\na format change needs a new FormatVersion and a new fixture", fixtureManifest, err, enc, data)
		}
		for slot, want := range fixtureFullIndexes() {
			path := filepath.Join(fixtureFull, filepath.FromSlash(SlotDir(fixtureFullJob, fixtureFullID, slot)), indexFile)
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			// INVARIANT: the writer encodes index.json with json.Marshal (writer.go, fullSlot).
			if enc, err := json.Marshal(want); err != nil || !bytes.Equal(enc, data) {
				t.Errorf("the index encoding no longer writes %s (err %v):\n got %s\nwant %s", path, err, enc, data)
			}
			compareCanonicalWrite(t, slot, want)
		}
	})
}

// compareManifest compares field by field, with a message naming the field.
func compareManifest(t *testing.T, got, want *Manifest) {
	t.Helper()
	fields := []struct {
		name      string
		got, want any
	}{
		{"format_version", got.FormatVersion, want.FormatVersion},
		{"job", got.Job, want.Job},
		{"id", got.ID, want.ID},
		{"mode", got.Mode, want.Mode},
		{"time", got.Time.UTC().Format(time.RFC3339Nano), want.Time.UTC().Format(time.RFC3339Nano)},
		{"key_groups", got.KeyGroups, want.KeyGroups},
		{"slots", got.Slots, want.Slots},
		{"source_stream", got.SourceStream, want.SourceStream},
		{"source_seq", got.SourceSeq, want.SourceSeq},
		{"parent", got.Parent, want.Parent},
		{"chain_length", got.ChainLength, want.ChainLength},
		{"modules", got.Modules, want.Modules},
		{"abi_version", got.ABIVersion, want.ABIVersion},
		{"objects", got.Objects, want.Objects},
		{"figures.sync_max_ns", got.Figures.SyncMax, want.Figures.SyncMax},
		{"figures.sync_per_slot_ns", got.Figures.SyncPerSlot, want.Figures.SyncPerSlot},
		{"figures.async_ns", got.Figures.Async, want.Figures.Async},
		{"figures.bytes_uploaded", got.Figures.BytesUploaded, want.Figures.BytesUploaded},
		{"figures.files_uploaded", got.Figures.FilesUploaded, want.Figures.FilesUploaded},
		{"figures.files_reused", got.Figures.FilesReused, want.Figures.FilesReused},
		{"figures.bytes_reused", got.Figures.BytesReused, want.Figures.BytesReused},
		{"figures.full_state_size", got.Figures.FullStateSize, want.Figures.FullStateSize},
		{"figures.store_bandwidth_bytes_per_s", got.Figures.StoreBandwidth, want.Figures.StoreBandwidth},
		{"figures.predicted_restore_ns", got.Figures.PredictedRestore, want.Figures.PredictedRestore},
		{"checksum", got.Checksum, want.Checksum},
	}
	for _, f := range fields {
		if !reflect.DeepEqual(f.got, f.want) {
			t.Errorf("%s: got %+v, want %+v", f.name, f.got, f.want)
		}
	}
	// Catches a field added to Manifest and not listed above.
	g, w := *got, *want
	g.Time, w.Time = time.Time{}, time.Time{}
	if !t.Failed() && !reflect.DeepEqual(g, w) {
		t.Errorf("manifest differs in a field not compared above:\n got %+v\nwant %+v", g, w)
	}
}

func compareIndex(t *testing.T, slot int, got, want *SegmentIndex) {
	t.Helper()
	if got.FormatVersion != want.FormatVersion || got.KeyGroups != want.KeyGroups || got.Range != want.Range {
		t.Errorf("slot %d index: format_version %d key_groups %d range %v, want %d %d %v", slot,
			got.FormatVersion, got.KeyGroups, got.Range, want.FormatVersion, want.KeyGroups, want.Range)
	}
	if !reflect.DeepEqual(got.Segments, want.Segments) {
		t.Errorf("slot %d index segments:\n got %+v\nwant %+v", slot, got.Segments, want.Segments)
	}
}

// compareCanonicalWrite writes the fixture's data of one slot with
// writeCanonical and compares each key group's decompressed frame with the
// committed one: the record encoding inside the frames must not change.
func compareCanonicalWrite(t *testing.T, slot int, want *SegmentIndex) {
	t.Helper()
	f, err := os.CreateTemp(t.TempDir(), "data")
	if err != nil {
		t.Fatal(err)
	}
	x, _, _, err := writeCanonical(context.Background(), fixtureScanner{}, want.KeyGroups, want.Range, f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	fresh, err := os.ReadFile(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	committed, err := os.ReadFile(filepath.Join(fixtureFull, filepath.FromSlash(SlotDir(fixtureFullJob, fixtureFullID, slot)), dataFile))
	if err != nil {
		t.Fatal(err)
	}
	frame := func(data []byte, s Segment) []byte {
		if s.Length == 0 {
			return nil
		}
		dec, err := zstd.NewReader(nil)
		if err != nil {
			t.Fatal(err)
		}
		defer dec.Close()
		out, err := dec.DecodeAll(data[s.Offset:s.Offset+s.Length], nil)
		if err != nil {
			t.Fatalf("slot %d key group %d: %v", slot, s.KeyGroup, err)
		}
		return out
	}
	for i, w := range want.Segments {
		g := x.Segments[i]
		if g.KeyGroup != w.KeyGroup || g.Count != w.Count || g.RawBytes != w.RawBytes || (g.Length == 0) != (w.Length == 0) {
			t.Errorf("slot %d: writeCanonical's segment %+v, committed %+v", slot, g, w)
			continue
		}
		if a, b := frame(fresh, g), frame(committed, w); !bytes.Equal(a, b) {
			t.Errorf("slot %d key group %d: writeCanonical's records changed:\n got %x\nwant %x", slot, w.KeyGroup, a, b)
		}
	}
}

// loadFixtureStore copies a fixture store folder into a memStore.
func loadFixtureStore(t *testing.T, root string) *memStore {
	t.Helper()
	s := newMemStore(time.Now)
	n := 0
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		n++
		return s.Put(context.Background(), filepath.ToSlash(rel), bytes.NewReader(b))
	})
	if err != nil || n == 0 {
		t.Fatalf("load fixture store %s: %d files, %v", root, n, err)
	}
	return s
}

// writeFixtures writes the fixtures that do not exist yet with the current
// encoders. It never overwrites one: a committed fixture is a fact about
// bytes already in users' stores.
func writeFixtures(t *testing.T) {
	if _, err := os.Stat(fixtureManifest); errors.Is(err, fs.ErrNotExist) {
		m := fixtureIncremental()
		m.Checksum = ""
		b, err := m.Encode()
		if err != nil {
			t.Fatal(err)
		}
		writeFixtureFile(t, fixtureManifest, b)
	} else {
		t.Logf("kept %s", fixtureManifest)
	}
	if _, err := os.Stat(fixtureManifestV2); errors.Is(err, fs.ErrNotExist) {
		b, err := fixtureSavepointV2().Encode()
		if err != nil {
			t.Fatal(err)
		}
		writeFixtureFile(t, fixtureManifestV2, b)
	} else {
		t.Logf("kept %s", fixtureManifestV2)
	}
	if _, err := os.Stat(fixtureFull); errors.Is(err, fs.ErrNotExist) {
		writeFullFixture(t)
	} else {
		t.Logf("kept %s", fixtureFull)
	}
}

// fixtureScanner serves fixtureFullData to writeCanonical.
type fixtureScanner struct{}

func (fixtureScanner) ScanRaw(r state.KeyGroupRange, fn func(k, v []byte) error) error {
	for kg := r.First; kg <= r.Last; kg++ {
		for _, rec := range fixtureFullData[kg] {
			if err := fn([]byte(rec.key), []byte(rec.value)); err != nil {
				return err
			}
		}
	}
	return nil
}

func writeFullFixture(t *testing.T) {
	m := fixtureFullManifest()
	m.Objects, m.Checksum = nil, ""
	var total int64
	for _, si := range m.Slots {
		f, err := os.CreateTemp(t.TempDir(), "data")
		if err != nil {
			t.Fatal(err)
		}
		x, size, sum, err := writeCanonical(context.Background(), fixtureScanner{}, m.KeyGroups, si.Range, f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(f.Name())
		if err != nil {
			t.Fatal(err)
		}
		idx, err := json.Marshal(x) // as writer.go's fullSlot
		if err != nil {
			t.Fatal(err)
		}
		isum := sha256.Sum256(idx)
		dir := SlotDir(m.Job, m.ID, si.Slot)
		m.Objects = append(m.Objects,
			Object{Path: dir + "/" + dataFile, File: dataFile, Size: size, SHA256: sum, Kind: KindFullData, Slot: si.Slot},
			Object{Path: dir + "/" + indexFile, File: indexFile, Size: int64(len(idx)), SHA256: hex.EncodeToString(isum[:]), Kind: KindIndex, Slot: si.Slot})
		writeFixtureFile(t, filepath.Join(fixtureFull, filepath.FromSlash(dir), dataFile), data)
		writeFixtureFile(t, filepath.Join(fixtureFull, filepath.FromSlash(dir), indexFile), idx)
		total += size + int64(len(idx))
	}
	m.Figures.BytesUploaded, m.Figures.FullStateSize = total, total
	b, err := m.Encode()
	if err != nil {
		t.Fatal(err)
	}
	writeFixtureFile(t, filepath.Join(fixtureFull, filepath.FromSlash(ManifestPath(m.Job, m.ID))), b)
}

func writeFixtureFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s (%d bytes)", path, len(data))
}
