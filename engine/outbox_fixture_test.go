package engine

import (
	"bytes"
	"errors"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"cairn/state"
)

// Outbox entry fixtures: entries written once by encodeOutboxEntry (outbox
// format 1, part of state format 1: the entries live in the slot's Pebble
// DB and so in checkpoints and savepoints) and decoded by TestFixtures
// forever, compared with the values written out below.
//
// RULE: a format change must be a new version, with the old fixture still
// read. The entry has no version byte (docs/RATIONALE.md, "The outbox entry
// format is versioned by its key"): a new format is stored under a new user
// key beside outboxKey, and the decoder of these entries stays. Never edit
// or regenerate a committed fixture to make this test pass.
// "go test ./engine -run TestFixtures -rewrite" writes only missing fixtures.
const outboxFixtureDir = "testdata/format-1/outbox"

type outboxFixture struct {
	name       string
	key, value string
	time       int64
}

var outboxFixtures = []outboxFixture{
	{name: "basic", key: "user-42", value: `{"n":3}`, time: 1767323045123},
	{name: "empty", key: "", value: "", time: 0},
	{name: "negative-time", key: "k", value: "\x00\xff", time: -1},
	{name: "long-key", key: strings.Repeat("k", 200), value: "v", time: math.MaxInt64},       // 2-byte uvarint length
	{name: "min-time", key: "\x00", value: strings.Repeat("\xfe", 300), time: math.MinInt64}, // 10-byte varint time
}

// TestFixtures decodes the committed outbox entries and pins the outbox's
// key. See the RULE above.
func TestFixtures(t *testing.T) {
	if *rewrite {
		for _, f := range outboxFixtures {
			path := filepath.Join(outboxFixtureDir, f.name+".bin")
			if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
				t.Logf("kept %s", path)
				continue
			}
			if err := os.MkdirAll(outboxFixtureDir, 0o755); err != nil {
				t.Fatal(err)
			}
			b := encodeOutboxEntry(&pending{key: []byte(f.key), value: []byte(f.value), time: f.time})
			if err := os.WriteFile(path, b, 0o644); err != nil {
				t.Fatal(err)
			}
			t.Logf("wrote %s (%d bytes)", path, len(b))
		}
	}
	for _, f := range outboxFixtures {
		t.Run("outbox-v1/"+f.name, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join(outboxFixtureDir, f.name+".bin"))
			if err != nil {
				t.Fatal(err)
			}
			key, value, tm, err := decodeOutboxEntry(data)
			if err != nil {
				t.Fatalf("the committed v1 entry no longer decodes: %v", err)
			}
			if string(key) != f.key {
				t.Errorf("key %q, want %q", key, f.key)
			}
			if tm != f.time {
				t.Errorf("time %d, want %d", tm, f.time)
			}
			if string(value) != f.value {
				t.Errorf("value %q, want %q", value, f.value)
			}
			// The encoder still writes format 1: a change is a new format.
			if enc := encodeOutboxEntry(&pending{key: []byte(f.key), value: []byte(f.value), time: f.time}); !bytes.Equal(enc, data) {
				t.Errorf("encodeOutboxEntry no longer writes format 1:\n got %x\nwant %x", enc, data)
			}
		})
	}
	// Where an entry lives is part of the format too: the system stage's
	// user key "outbox", the output index as 8 bytes big-endian.
	t.Run("outbox-v1/key", func(t *testing.T) {
		got := state.ValueKey(5, state.SystemStage, outboxKey, outboxSub(7))
		want := []byte{0x00, 0x05, 0x00, 0x01, 0x06, 'o', 'u', 't', 'b', 'o', 'x', 0, 0, 0, 0, 0, 0, 0, 7}
		if !bytes.Equal(got, want) {
			t.Errorf("outbox entry key %x, want %x", got, want)
		}
	})
}
