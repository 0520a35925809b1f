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
				var valid bool
				if n, valid = parseCount(v); !valid {
					return fmt.Errorf("count: corrupt state %q", v)
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

// parseCount parses the decimal ASCII of a count. It runs once per record,
// so it avoids strconv.ParseUint's generality (and the string conversion):
// in a Go wasm guest every branch counts.
func parseCount(b []byte) (uint64, bool) {
	if len(b) == 0 || len(b) > 19 { // 19 digits cannot overflow
		return 0, false
	}
	var n uint64
	for _, c := range b {
		d := c - '0'
		if d > 9 {
			return 0, false
		}
		n = n*10 + uint64(d)
	}
	return n, true
}
