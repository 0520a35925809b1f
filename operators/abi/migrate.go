package abi

import "fmt"

// State migration (docs/ABI.md, "State versions and migrations"): two
// optional exports, on top of either ABI version.
const (
	// ExportStateVersion is `cairn_state_version() -> i32`: the version of
	// the shape of the state the module reads and writes (0: none
	// declared). The host calls it once after _initialize.
	ExportStateVersion = "cairn_state_version"
	// ExportMigrate is `cairn_migrate(len u32) -> u64`: migrate the
	// entries of the migrate input of len bytes at the last allocated
	// buffer; the result is (output pointer << 32) | output length, as
	// cairn_process's.
	ExportMigrate = "cairn_migrate"
)

// MigrateVersion is the version byte of migrate buffers.
const MigrateVersion = 1

// Entry kinds of migrate buffers. INVARIANT: part of the ABI.
const (
	EntryValue = 1 // value state of (key, sub), with an optional expiry
	EntryTimer = 2 // a timer of key
)

// Entry flags.
const (
	// FlagExpiry: a value has an expiry (When is it, Unix ms).
	FlagExpiry = 1
	// FlagProcessing: a timer is a processing-time timer (else event time).
	FlagProcessing = 2
)

// Migrate output tags.
const (
	MigrateTagEntry = 1 // an entry of the new state
	MigrateTagError = 5 // the call failed; as TagError
)

// Entry is one state entry in a migrate buffer. When is a value's expiry
// (with FlagExpiry) or a timer's time.
type Entry struct {
	Kind  uint8
	Flags uint8
	Key   []byte
	Sub   []byte
	When  int64
	Value []byte
}

// AppendEntry appends one entry: u8 kind, u8 flags, bytes key, bytes sub,
// i64 when, bytes value.
func AppendEntry(b []byte, e *Entry) []byte {
	b = append(b, e.Kind, e.Flags)
	b = AppendBytes(b, e.Key)
	b = AppendBytes(b, e.Sub)
	b = appendI64(b, e.When)
	return AppendBytes(b, e.Value)
}

// AppendMigrateInput starts a migrate input of n entries (AppendEntry
// each): u8 version, u32 n.
func AppendMigrateInput(b []byte, n int) []byte {
	return appendU32(append(b, MigrateVersion), uint32(n))
}

// AppendMigrateEntry appends an output entry: tag 1, i32 source (the
// index of the input entry it came from), then the entry.
func AppendMigrateEntry(b []byte, source int32, e *Entry) []byte {
	b = append(b, MigrateTagEntry)
	b = appendU32(b, uint32(source))
	return AppendEntry(b, e)
}

// AppendMigrateError appends the error entry of a failed call.
func AppendMigrateError(b []byte, source int32, msg string) []byte {
	b = append(b, MigrateTagError)
	b = appendU32(b, uint32(source))
	return appendString(b, msg)
}

// entrySize is the smallest encoded entry.
const entrySize = 2 + 4 + 4 + 8 + 4

func (r *reader) entry(e *Entry) {
	e.Kind = r.u8()
	e.Flags = r.u8()
	e.Key = r.bytes()
	e.Sub = r.bytes()
	e.When = r.i64()
	e.Value = r.bytes()
	if r.err == nil && e.Kind != EntryValue && e.Kind != EntryTimer {
		r.fail(fmt.Sprintf("entry kind %d", e.Kind))
	}
}

// DecodeMigrateInput calls fn with each entry of a migrate input; the
// entry's slices alias buf.
func DecodeMigrateInput(buf []byte, fn func(i int, e *Entry)) error {
	r := reader{b: buf}
	if v := r.u8(); r.err == nil && v != MigrateVersion {
		return fmt.Errorf("%w: migrate input version %d, want %d", ErrMalformed, v, MigrateVersion)
	}
	n := r.count(entrySize)
	var e Entry
	for i := 0; i < n && r.err == nil; i++ {
		r.entry(&e)
		if r.err == nil {
			fn(i, &e)
		}
	}
	if r.err == nil && r.left() != 0 {
		r.fail("trailing bytes")
	}
	return r.err
}

// MigrateError is the error entry of a migrate output.
type MigrateError struct {
	Source  int32
	Message string
}

// DecodeMigrateOutput calls fn with each entry of a migrate output (source:
// the input entry's index) and returns the error entry, if any. The
// entry's slices alias buf.
func DecodeMigrateOutput(buf []byte, n int, fn func(source int32, e *Entry) error) (*MigrateError, error) {
	r := reader{b: buf}
	if v := r.u8(); r.err == nil && v != MigrateVersion {
		return nil, fmt.Errorf("%w: migrate output version %d, want %d", ErrMalformed, v, MigrateVersion)
	}
	var e Entry
	var failed *MigrateError
	for r.err == nil && r.left() > 0 {
		switch tag := r.u8(); tag {
		case MigrateTagEntry:
			src := int32(r.u32())
			r.entry(&e)
			if r.err != nil {
				break
			}
			if src < 0 || int(src) >= n {
				r.fail(fmt.Sprintf("entry source %d of %d inputs", src, n))
				break
			}
			if err := fn(src, &e); err != nil {
				return nil, err
			}
		case MigrateTagError:
			src := int32(r.u32())
			msg := r.bytes()
			if failed != nil {
				r.fail("second error entry")
			}
			failed = &MigrateError{Source: src, Message: string(msg)}
		default:
			r.fail(fmt.Sprintf("unknown tag %d", tag))
		}
	}
	return failed, r.err
}
