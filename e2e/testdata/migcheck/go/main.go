//go:build wasip1

// Command migcheck exercises the whole migration API of the Go SDK
// (operators/sdk/upgrade); its Rust, C and AssemblyScript twins (../rust,
// ../c, ../as) must write the same state (e2e/languages_migrate_test.go):
//
//   - a timer: 10 ms later, its domain kept;
//   - a value under a sub-key starting with "drop": dropped;
//   - any other value: "v2:" + value, its expiry (if any) 1000 ms later,
//     plus a copy under sub-key sub+".copy" without an expiry;
//   - key "bad": the error "bad key"; key "boom": a panic "boom".
//
// It declares state version 5 and is only a migration: its operator is
// never run.
package main

import (
	"bytes"
	"errors"

	"cairn/operators/sdk"
	"cairn/operators/sdk/upgrade"
)

func main() {}

func init() {
	sdk.Register(sdk.Operator{OnRecord: func(*sdk.Context, sdk.Record) error { return nil }})
	var val, sub []byte
	upgrade.RegisterMigration(upgrade.Migration{ToVersion: 5, Migrate: func(m *upgrade.Migrator, e upgrade.Entry) error {
		switch {
		case string(e.Key) == "bad":
			return errors.New("bad key")
		case string(e.Key) == "boom":
			panic("boom")
		case e.Timer:
			e.Time += 10
			m.Put(e)
		case bytes.HasPrefix(e.Sub, []byte("drop")):
		default:
			val = append(append(val[:0], "v2:"...), e.Value...)
			e.Value = val
			if e.HasExpiry {
				e.Expiry += 1000
			}
			m.Put(e)
			sub = append(append(sub[:0], e.Sub...), ".copy"...)
			e.Sub, e.HasExpiry, e.Expiry = sub, false, 0
			m.Put(e)
		}
		return nil
	}})
}
