//go:build wasip1

// Command count is a keyed operator: it keeps a running count per key in
// the key's state and emits (key, count as decimal ASCII, time) per record.
package main

import (
	"fmt"
	"strconv"

	"cairn/operators/sdk"
)

func main() {}

func init() {
	var buf []byte
	sdk.Register(sdk.Operator{
		OnRecord: func(c *sdk.Context, r sdk.Record) error {
			var n uint64
			if v, ok := c.Get(""); ok {
				var err error
				if n, err = strconv.ParseUint(string(v), 10, 64); err != nil {
					return fmt.Errorf("count: corrupt state %q: %v", v, err)
				}
			}
			n++
			buf = strconv.AppendUint(buf[:0], n, 10)
			c.Put("", buf)
			c.Emit(r.Key, buf, r.Time)
			return nil
		},
	})
}
