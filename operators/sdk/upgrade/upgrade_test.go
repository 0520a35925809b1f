package upgrade

import (
	"errors"
	"strings"
	"testing"

	"cairn/operators/abi"
)

// call runs one cairn_migrate call over entries and decodes its output.
func call(t *testing.T, entries ...abi.Entry) (map[int32][]abi.Entry, *abi.MigrateError) {
	t.Helper()
	in := abi.AppendMigrateInput(nil, len(entries))
	for i := range entries {
		in = abi.AppendEntry(in, &entries[i])
	}
	got := map[int32][]abi.Entry{}
	failed, err := abi.DecodeMigrateOutput(migrate(in), len(entries), func(src int32, e *abi.Entry) error {
		c := *e
		c.Key, c.Sub, c.Value = append([]byte(nil), e.Key...), append([]byte(nil), e.Sub...), append([]byte(nil), e.Value...)
		got[src] = append(got[src], c)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return got, failed
}

func TestMigrate(t *testing.T) {
	RegisterMigration(Migration{ToVersion: 4, Migrate: func(m *Migrator, e Entry) error {
		switch {
		case string(e.Key) == "bad":
			return errors.New("no")
		case string(e.Key) == "boom":
			panic("bug")
		case e.Timer:
			e.Time += 10
			m.Put(e)
		case len(e.Sub) > 0:
			// dropped
		default:
			e.Value = append([]byte("v2:"), e.Value...)
			e.Expiry++
			m.Put(e)
			e.Sub = []byte("copy")
			e.HasExpiry = false
			m.Put(e)
		}
		return nil
	}})
	if v := stateVersion(); v != 4 {
		t.Fatalf("declared %d, want the migration's 4", v)
	}
	got, failed := call(t,
		abi.Entry{Kind: abi.EntryValue, Flags: abi.FlagExpiry, Key: []byte("a"), When: 100, Value: []byte("1")},
		abi.Entry{Kind: abi.EntryValue, Key: []byte("a"), Sub: []byte("s"), Value: []byte("x")},
		abi.Entry{Kind: abi.EntryTimer, Flags: abi.FlagProcessing, Key: []byte("a"), When: 5},
	)
	if failed != nil {
		t.Fatal(failed.Message)
	}
	v := got[0]
	if len(v) != 2 || string(v[0].Value) != "v2:1" || v[0].Flags != abi.FlagExpiry || v[0].When != 101 ||
		string(v[1].Sub) != "copy" || v[1].Flags != 0 || len(got[1]) != 0 ||
		len(got[2]) != 1 || got[2][0].Kind != abi.EntryTimer || got[2][0].When != 15 || got[2][0].Flags != abi.FlagProcessing {
		t.Fatalf("outputs %+v", got)
	}
	if _, failed := call(t, abi.Entry{Kind: abi.EntryValue, Key: []byte("a")}, abi.Entry{Kind: abi.EntryValue, Key: []byte("bad")}); failed == nil || failed.Source != 1 || failed.Message != "no" {
		t.Fatalf("error: %+v", failed)
	}
	if _, failed := call(t, abi.Entry{Kind: abi.EntryValue, Key: []byte("boom")}); failed == nil || failed.Source != 0 || !strings.Contains(failed.Message, "panic: bug") {
		t.Fatalf("panic: %+v", failed)
	}
	StateVersion(7)
	if v := stateVersion(); v != 7 {
		t.Fatalf("declared %d, want 7", v)
	}
	if _, failed := call(t); failed != nil {
		t.Fatalf("empty call: %+v", failed)
	}
	// A malformed input is an error entry, not a crash.
	if failed, err := abi.DecodeMigrateOutput(migrate([]byte{1, 9, 0, 0, 0}), 0, nil); err != nil || failed == nil || !strings.Contains(failed.Message, "malformed") {
		t.Fatalf("malformed input: %+v %v", failed, err)
	}
}
