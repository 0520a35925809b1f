// Package upgrade is the part of the operator SDK for operator upgrades
// that change the shape of state (docs/UPGRADES.md): a module declares the
// version of its state (StateVersion), and a migration module converts a
// stage's state from an older version (RegisterMigration), offline, with
// `cairn state migrate --with MODULE.wasm`.
//
// It is a package of its own so that modules which do not use it export
// nothing more than before: importing it adds the exports
// cairn_state_version and cairn_migrate (docs/ABI.md).
package upgrade

import (
	"runtime"
	"strconv"

	"cairn/operators/abi"
	"cairn/operators/sdk"
)

// Entry is one entry of a stage's state, as a migration sees and writes
// it: a value of (Key, Sub), or a timer of Key.
type Entry struct {
	// Timer: a timer (Time, Processing) rather than a value (Sub, Value,
	// Expiry).
	Timer bool
	Key   []byte
	Sub   []byte
	Value []byte
	// HasExpiry and Expiry (Unix ms): a value's TTL. A value written by a
	// stage with a TTL expires then; a migration keeps, changes or drops it.
	HasExpiry bool
	Expiry    int64
	// Time (Unix ms) and Processing: a timer's.
	Time       int64
	Processing bool
}

// Migration converts a stage's state from one shape to another. Migrate is
// called once per entry of the stage's old state, key group by key group,
// and writes the new state with Migrator.Put: any number of entries (none
// drops the entry). The entries it writes keep the key of the entry they
// came from, or another key of the same key group: moving state between key
// groups (re-keying) goes through `cairn state export` and `import`. Byte
// slices of the Entry are valid only until Migrate returns.
type Migration struct {
	// ToVersion is the state version of what Migrate writes: the
	// StateVersion the new operator declares.
	ToVersion int
	Migrate   func(m *Migrator, e Entry) error
}

// Migrator writes the new state of one call.
type Migrator struct{ src int32 }

var (
	// mig is the Migrator of every entry: one allocation less per entry
	// (the guest's garbage costs a Go wasm module dearly).
	mig       Migrator
	version   int
	declared  bool
	migration Migration
	out       []byte
)

// StateVersion declares the version of the shape of the state the module's
// operator reads and writes (0, the default, is "none declared"). Call it
// from init. A job refuses to restore state of another version until it is
// migrated.
func StateVersion(v int) {
	version, declared = v, true
}

// RegisterMigration installs a migration. Call it once, from init; a module
// may register both an operator (sdk.Register) and a migration: the new
// version of an operator that migrates the old version's state. Unless
// StateVersion was called, the module declares m.ToVersion.
func RegisterMigration(m Migration) {
	migration = m
	sdk.Config() // imports the host module, as sdk.Register does
}

// Put writes an entry of the new state.
func (m *Migrator) Put(e Entry) {
	ae := abi.Entry{Kind: abi.EntryValue, Key: e.Key, Sub: e.Sub, Value: e.Value}
	if e.Timer {
		ae.Kind, ae.Sub, ae.Value, ae.When = abi.EntryTimer, nil, nil, e.Time
		if e.Processing {
			ae.Flags = abi.FlagProcessing
		}
	} else if e.HasExpiry {
		ae.Flags, ae.When = abi.FlagExpiry, e.Expiry
	}
	out = abi.AppendMigrateEntry(out, m.src, &ae)
}

// stateVersion is what cairn_state_version returns.
func stateVersion() int32 {
	if declared {
		return int32(version)
	}
	return int32(migration.ToVersion)
}

// migrate runs one cairn_migrate call over a migrate input and returns the
// output buffer.
func migrate(buf []byte) (res []byte) {
	// As sdk's calls: one yield per call lets the Go runtime collect.
	runtime.Gosched()
	out = append(out[:0], abi.MigrateVersion)
	src := int32(-1)
	defer func() {
		if v := recover(); v != nil {
			out = abi.AppendMigrateError(append(out[:0], abi.MigrateVersion), src, "panic: "+panicText(v))
			res = out
		}
	}()
	if migration.Migrate == nil {
		return abi.AppendMigrateError(out, src, "sdk: no migration registered (call upgrade.RegisterMigration in init)")
	}
	var failed error
	err := abi.DecodeMigrateInput(buf, func(i int, ae *abi.Entry) {
		if failed != nil {
			return
		}
		src = int32(i)
		e := Entry{Key: ae.Key, Sub: ae.Sub, Value: ae.Value}
		if ae.Kind == abi.EntryTimer {
			e.Timer, e.Time, e.Processing, e.Sub, e.Value = true, ae.When, ae.Flags&abi.FlagProcessing != 0, nil, nil
		} else if ae.Flags&abi.FlagExpiry != 0 {
			e.HasExpiry, e.Expiry = true, ae.When
		}
		mig.src = src
		if err := migration.Migrate(&mig, e); err != nil {
			failed = err
		}
	})
	if err != nil {
		return abi.AppendMigrateError(append(out[:0], abi.MigrateVersion), -1, "sdk: malformed migrate input: "+err.Error())
	}
	if failed != nil {
		return abi.AppendMigrateError(append(out[:0], abi.MigrateVersion), src, failed.Error())
	}
	return out
}

func panicText(v any) string {
	switch x := v.(type) {
	case error:
		return x.Error()
	case string:
		return x
	case int:
		return strconv.Itoa(x)
	}
	return "(non-string panic value)"
}
