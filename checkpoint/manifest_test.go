package checkpoint

import (
	"bytes"
	"encoding/json"
	"errors"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"cairn/state"
)

func sampleManifest() *Manifest {
	return &Manifest{
		FormatVersion: FormatVersion, Job: "job1", ID: 7, Mode: ModeIncremental,
		Time: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), KeyGroups: 128,
		Slots:        []SlotInfo{{0, state.SlotRange(0, 2, 128)}, {1, state.SlotRange(1, 2, 128)}},
		SourceStream: "in", SourceSeq: 42, Parent: 6, ChainLength: 2,
		Modules: map[string]string{"count": "abcd"}, ABIVersion: 1,
		Objects: []Object{
			{Path: SharedPath("job1", strings.Repeat("ab", 32)), File: "000005.sst", Size: 10, SHA256: strings.Repeat("ab", 32), Kind: KindSST, Slot: 0},
			{Path: SlotDir("job1", 7, 1) + "/MANIFEST-000001", File: "MANIFEST-000001", Size: 3, SHA256: strings.Repeat("01", 32), Kind: KindMeta, Slot: 1},
		},
		Figures: Figures{SyncMax: time.Millisecond, SyncPerSlot: []time.Duration{time.Millisecond, 0}, Async: time.Second, BytesUploaded: 13, FilesUploaded: 2, FullStateSize: 13},
	}
}

// TestManifestRoundTrip checks the JSON names Encode writes against names
// spelled out here, and that Decode gives back every field: a renamed JSON
// tag fails (re-encoding a decoded manifest and comparing it with itself
// would not). TestFixtures checks the same against committed bytes.
func TestManifestRoundTrip(t *testing.T) {
	m := sampleManifest()
	m.Figures.StoreBandwidth, m.Figures.PredictedRestore = 1<<20, time.Second // every omitempty field set
	b, err := m.Encode()
	if err != nil {
		t.Fatal(err)
	}
	keys := func(raw json.RawMessage) string {
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(raw, &obj); err != nil {
			t.Fatal(err)
		}
		return strings.Join(slices.Sorted(maps.Keys(obj)), " ")
	}
	var top struct {
		Slots   []json.RawMessage `json:"slots"`
		Objects []json.RawMessage `json:"objects"`
		Figures json.RawMessage   `json:"figures"`
	}
	if err := json.Unmarshal(b, &top); err != nil {
		t.Fatal(err)
	}
	var slot struct {
		Range json.RawMessage `json:"range"`
	}
	if err := json.Unmarshal(top.Slots[0], &slot); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ what, got, want string }{
		{"manifest", keys(b), "abi_version chain_length checksum figures format_version id job key_groups mode modules objects parent slots source_seq source_stream time"},
		{"slot", keys(top.Slots[0]), "range slot"},
		{"range", keys(slot.Range), "first last"},
		{"object", keys(top.Objects[0]), "file kind path sha256 size slot"},
		{"figures", keys(top.Figures), "async_ns bytes_reused bytes_uploaded files_reused files_uploaded full_state_size predicted_restore_ns store_bandwidth_bytes_per_s sync_max_ns sync_per_slot_ns"},
	} {
		if c.got != c.want {
			t.Errorf("%s JSON names changed (a format change: new FormatVersion):\n got %s\nwant %s", c.what, c.got, c.want)
		}
	}
	got, err := Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, m) {
		t.Fatalf("decoded manifest differs:\n got %+v\nwant %+v", got, m)
	}
	if ManifestPath("job1", 7) != "job1/chk-00000000000000000007/MANIFEST.json" {
		t.Fatal(ManifestPath("job1", 7))
	}
	if p := SharedPath("j", strings.Repeat("ab", 32)); p != "j/shared/ab/"+strings.Repeat("ab", 32)+".sst" {
		t.Fatal(p)
	}
}

func TestManifestUnknownVersion(t *testing.T) {
	_, err := Decode([]byte(`{"format_version": 99, "job": "x"}`))
	if !errors.Is(err, ErrUnsupportedVersion) || !strings.Contains(err.Error(), "99") {
		t.Fatalf("got %v", err)
	}
}

func TestManifestRejectsInvalid(t *testing.T) {
	for name, mutate := range map[string]func(*Manifest){
		"slot range":  func(m *Manifest) { m.Slots[1].Range.First++ },
		"bad sha":     func(m *Manifest) { m.Objects[0].SHA256 = "zz" },
		"foreign obj": func(m *Manifest) { m.Objects[0].Path = "other/x" },
		"mode":        func(m *Manifest) { m.Mode = "weird" },
		"slot":        func(m *Manifest) { m.Objects[0].Slot = 5 },
		"id":          func(m *Manifest) { m.ID = 0 },
	} {
		m := sampleManifest()
		mutate(m)
		if _, err := m.Encode(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func FuzzDecodeManifest(f *testing.F) {
	b, _ := sampleManifest().Encode()
	f.Add(b)
	f.Add([]byte(`{"format_version":1}`))
	f.Add([]byte(`{"format_version":2}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := Decode(data)
		if err != nil {
			return
		}
		out, err := m.Encode()
		if err != nil {
			t.Fatalf("decoded manifest does not encode: %v", err)
		}
		if _, err := Decode(out); err != nil {
			t.Fatalf("re-decode: %v", err)
		}
	})
}

// TestManifestEveryBitFlipDetected flips every bit of an encoded manifest
// in turn: none may decode. (JSON alone forgives some: keys match
// case-insensitively, so the checksum covers the stored bytes.)
func TestManifestEveryBitFlipDetected(t *testing.T) {
	data, err := sampleManifest().Encode()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Decode(data); err != nil {
		t.Fatalf("intact manifest: %v", err)
	}
	for i := range data {
		for b := range 8 {
			bad := bytes.Clone(data)
			bad[i] ^= 1 << b
			if _, err := Decode(bad); err == nil {
				t.Fatalf("a flip of bit %d of byte %d (%q -> %q) decodes", b, i, data[i], bad[i])
			}
		}
	}
}
