//go:build wasip1

// Command testmig is a migration module for the statetool tests. Per
// entry of the stage's state:
//
//   - a value of sub-key "": "N" becomes "N,<config first_seen>"; an
//     expiry moves later by config extend_ms;
//   - a value of another sub-key: dropped;
//   - an event-time timer: one millisecond later; a processing-time timer:
//     kept;
//   - key config.fail: an error; key config.rekey: written under key
//     "<key>-moved" (another key group, which the host refuses).
package main

import (
	"encoding/json"
	"errors"
	"fmt"

	"cairn/operators/sdk"
	"cairn/operators/sdk/upgrade"
)

func main() {}

var cfg struct {
	FirstSeen int64  `json:"first_seen"`
	ExtendMs  int64  `json:"extend_ms"`
	Fail      string `json:"fail"`
	Rekey     string `json:"rekey"`
	Panic     string `json:"panic"`
}

func init() {
	upgrade.RegisterMigration(upgrade.Migration{ToVersion: 3, Migrate: migrate})
	if c := sdk.Config(); len(c) > 0 {
		if err := json.Unmarshal(c, &cfg); err != nil {
			panic(err)
		}
	}
}

func migrate(m *upgrade.Migrator, e upgrade.Entry) error {
	switch string(e.Key) {
	case cfg.Fail:
		return errors.New("refusing this key")
	case cfg.Panic:
		panic("a bug in the migration")
	case cfg.Rekey:
		e.Key = append(append([]byte(nil), e.Key...), "-moved"...)
	}
	if e.Timer {
		if !e.Processing {
			e.Time++
		}
		m.Put(e)
		return nil
	}
	if len(e.Sub) > 0 {
		return nil
	}
	e.Value = fmt.Appendf(nil, "%s,%d", e.Value, cfg.FirstSeen)
	if e.HasExpiry {
		e.Expiry += cfg.ExtendMs
	}
	m.Put(e)
	return nil
}
