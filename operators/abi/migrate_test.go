package abi

import "testing"

// FuzzDecodeMigrateOutput: the host decodes a migration module's output,
// untrusted bytes; it never panics and never hands out a source outside
// the input.
func FuzzDecodeMigrateOutput(f *testing.F) {
	e := Entry{Kind: EntryValue, Flags: FlagExpiry, Key: []byte("k"), Sub: []byte("s"), When: 7, Value: []byte("v")}
	ok := AppendMigrateEntry([]byte{MigrateVersion}, 0, &e)
	f.Add(ok, 1)
	f.Add(AppendMigrateError(append([]byte(nil), ok...), 0, "no"), 1)
	f.Add([]byte{MigrateVersion, MigrateTagEntry, 5, 0, 0, 0}, 2)
	f.Fuzz(func(t *testing.T, b []byte, n int) {
		n = max(0, min(n, 1<<16))
		_, _ = DecodeMigrateOutput(b, n, func(src int32, e *Entry) error {
			if src < 0 || int(src) >= n {
				t.Fatalf("source %d of %d", src, n)
			}
			if e.Kind != EntryValue && e.Kind != EntryTimer {
				t.Fatalf("kind %d", e.Kind)
			}
			return nil
		})
		_ = DecodeMigrateInput(b, func(int, *Entry) {})
	})
}
