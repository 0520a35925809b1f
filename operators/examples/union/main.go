//go:build wasip1

// Command union is a stateless operator that emits every record unchanged
// (same key, value and event time), whichever input it came from: in a
// stage with two inputs (`from: [a, b]`) it merges them into one stream.
// Config: none; a config with any field is refused (reading it also makes
// the module import the SDK's host module, so it speaks ABI v2 like every
// operator that may sit in a two-input stage).
package main

import (
	"encoding/json"
	"sort"

	"cairn/operators/sdk"
)

func main() {}

// init panics on a config: the instance fails to start, with the message,
// before the job reads any input.
func init() {
	if cfg := sdk.Config(); len(cfg) > 0 {
		var c map[string]json.RawMessage
		if err := json.Unmarshal(cfg, &c); err != nil {
			panic("union: bad config: " + err.Error())
		}
		if len(c) > 0 {
			names := make([]string, 0, len(c))
			for k := range c {
				names = append(names, k)
			}
			sort.Strings(names)
			panic(`union: takes no config; got field "` + names[0] + `"`)
		}
	}
	sdk.Register(sdk.Operator{
		OnRecord: func(c *sdk.Context, r sdk.Record) error {
			c.Emit(r.Key, r.Value, r.Time)
			return nil
		},
	})
}
