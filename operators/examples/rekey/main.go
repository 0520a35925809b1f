//go:build wasip1

// Command rekey is a stateless operator that changes a record's key: it
// emits (config key, "<old key>=<value>", time) for every record. Config:
// {"key": "all"} (default "all"). Put before a keyed stage, it sends every
// record to one key (a global aggregate such as the top N); the keyed stage
// after it starts a new sub-topology, fed by a repartition stream.
package main

import (
	"encoding/json"

	"cairn/operators/sdk"
)

func main() {}

func init() {
	key := []byte("all")
	if cfg := sdk.Config(); len(cfg) > 0 {
		var c struct {
			Key string `json:"key"`
		}
		if err := json.Unmarshal(cfg, &c); err != nil {
			panic("rekey: bad config: " + err.Error())
		}
		if c.Key != "" {
			key = []byte(c.Key)
		}
	}
	var buf []byte
	sdk.Register(sdk.Operator{
		OnRecord: func(c *sdk.Context, r sdk.Record) error {
			buf = append(append(append(buf[:0], r.Key...), '='), r.Value...)
			c.Emit(key, buf, r.Time)
			return nil
		},
	})
}
