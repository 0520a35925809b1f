//go:build wasip1

// Command threshold is a keyed operator with two output ports: it keeps a
// running count per key, emits every count to port 0 and, each time a
// key's count reaches a multiple of `every`, an alert to port 1. The
// stage declares them: `ports: [counts, alerts]` (any names, in that
// order). Config: {"every": 100} (the default; must be positive).
//
// Port 0 gets (key, "<count>", time) for every record; port 1 gets (key,
// "<key> reached <count>", time).
package main

import (
	"encoding/json"
	"strconv"

	"cairn/operators/sdk"
)

func main() {}

var every uint64 = 100

func init() {
	if cfg := sdk.Config(); len(cfg) > 0 && string(cfg) != "null" {
		var c struct {
			Every *int64 `json:"every"`
		}
		if err := json.Unmarshal(cfg, &c); err != nil {
			panic("threshold: bad config: " + err.Error())
		}
		if c.Every != nil {
			if *c.Every <= 0 {
				panic("threshold: config \"every\" is " + strconv.FormatInt(*c.Every, 10) + ": must be positive")
			}
			every = uint64(*c.Every)
		}
	}
	var buf []byte
	sdk.Register(sdk.Operator{
		OnRecord: func(c *sdk.Context, r sdk.Record) error {
			var n uint64
			if v, ok := c.Get(""); ok {
				for _, d := range v {
					n = n*10 + uint64(d-'0')
				}
			}
			n++
			buf = strconv.AppendUint(buf[:0], n, 10)
			c.Put("", buf)
			c.Emit(r.Key, buf, r.Time)
			if n%every == 0 {
				buf = strconv.AppendUint(append(append(buf[:0], r.Key...), " reached "...), n, 10)
				c.EmitTo(1, r.Key, buf, r.Time)
			}
			return nil
		},
	})
}
