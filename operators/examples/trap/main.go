//go:build wasip1

// Command trap is a test operator: a stateless pass-through that panics on
// the value "TRAP", returns an error on "ERR", loops forever on "LOOP" and
// allocates without bound on "OOM".
package main

import (
	"errors"

	"cairn/operators/sdk"
)

func main() {}

var hoard [][]byte

func init() {
	sdk.Register(sdk.Operator{
		OnRecord: func(c *sdk.Context, r sdk.Record) error {
			switch string(r.Value) {
			case "TRAP":
				panic("trap: asked to trap")
			case "ERR":
				return errors.New("trap: asked to fail")
			case "LOOP":
				for i := 0; ; i++ {
					if i < 0 {
						break
					}
				}
			case "OOM":
				for {
					b := make([]byte, 1<<20)
					b[0] = 1
					hoard = append(hoard, b)
				}
			}
			c.Emit(r.Key, r.Value, r.Time)
			return nil
		},
	})
}
