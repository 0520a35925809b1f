//go:build wasip1

// Command count_first_seen is version 2 of the word count's keyed stage
// (builtin:count): it keeps, per word, the count and the event time the
// word was first seen, as "count,first_seen" (decimal ASCII), and emits
// that. Its state has another shape than count's (a bare count), so it
// declares state version 2, and the same module migrates version-0 state:
// `cairn state migrate --stage count --with count_first_seen.wasm`
// (docs/UPGRADES.md). The first time of a word counted before the upgrade
// is unknown: the migration writes the config's "first_seen" (Unix ms) for
// it, 0 by default.
package main

import (
	"encoding/json"
	"fmt"
	"strconv"

	"cairn/operators/sdk"
	"cairn/operators/sdk/upgrade"
)

func main() {}

func init() {
	var buf []byte
	upgrade.StateVersion(2)
	sdk.Register(sdk.Operator{
		OnRecord: func(c *sdk.Context, r sdk.Record) error {
			n, first := uint64(0), r.Time
			if v, ok := c.Get(""); ok {
				var err error
				if n, first, err = parse(v); err != nil {
					return err
				}
			}
			n++
			buf = strconv.AppendUint(buf[:0], n, 10)
			buf = append(buf, ',')
			buf = strconv.AppendInt(buf, first, 10)
			c.Put("", buf)
			c.Emit(r.Key, buf, r.Time)
			return nil
		},
	})
	var cfg struct {
		FirstSeen int64 `json:"first_seen"`
	}
	var mbuf []byte
	upgrade.RegisterMigration(upgrade.Migration{
		ToVersion: 2,
		Migrate: func(m *upgrade.Migrator, e upgrade.Entry) error {
			if e.Timer || len(e.Sub) > 0 {
				m.Put(e) // count keeps nothing else; pass it on unchanged
				return nil
			}
			// A version-0 count is decimal digits only. Like OnRecord, the
			// migration runs once per entry of the state: no fmt, no
			// allocation (Put copies the value).
			if len(e.Value) == 0 || len(e.Value) > 19 {
				return fmt.Errorf("not a version-0 count: %q", e.Value)
			}
			for _, c := range e.Value {
				if c < '0' || c > '9' {
					return fmt.Errorf("not a version-0 count: %q", e.Value)
				}
			}
			mbuf = append(append(mbuf[:0], e.Value...), ',')
			e.Value = strconv.AppendInt(mbuf, cfg.FirstSeen, 10)
			m.Put(e)
			return nil
		},
	})
	if c := sdk.Config(); len(c) > 0 {
		if err := json.Unmarshal(c, &cfg); err != nil {
			panic(fmt.Sprintf("count_first_seen: config: %v", err))
		}
	}
}

// parse reads "count,first_seen".
func parse(v []byte) (n uint64, first int64, err error) {
	for i, c := range v {
		if c != ',' {
			continue
		}
		if n, err = strconv.ParseUint(string(v[:i]), 10, 64); err == nil {
			first, err = strconv.ParseInt(string(v[i+1:]), 10, 64)
		}
		if err == nil {
			return n, first, nil
		}
		break
	}
	return 0, 0, fmt.Errorf("count_first_seen: state %q is not \"count,first_seen\" (state version 2): migrate it first", v)
}
