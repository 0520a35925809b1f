//go:build wasip1

// Command dedupe is a keyed operator that passes a record on only the first
// time its key is seen. How long "seen" lasts is the stage's state TTL,
// configured on the host: the operator only checks and sets a marker.
package main

import "cairn/operators/sdk"

func main() {}

func init() {
	marker := []byte{1}
	sdk.Register(sdk.Operator{
		OnRecord: func(c *sdk.Context, r sdk.Record) error {
			if _, seen := c.Get(""); seen {
				return nil
			}
			c.Put("", marker)
			c.Emit(r.Key, r.Value, r.Time)
			return nil
		},
	})
}
