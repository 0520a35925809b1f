//go:build wasip1

// Command trap is a test operator: a stateless pass-through that panics on
// the value "TRAP", returns an error on "ERR", loops forever on "LOOP",
// allocates without bound on "OOM", recurses without bound on "DEEP", and on
// "FS" tries to read a host file (which must fail: no filesystem is granted).
package main

import (
	"errors"
	"fmt"
	"os"

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
			case "DEEP":
				c.Emit(r.Key, []byte(fmt.Sprint(deep(1))), r.Time)
				return nil
			case "FS":
				if b, err := os.ReadFile("/etc/hostname"); err != nil {
					return fmt.Errorf("trap: read a host file: %w", err)
				} else {
					c.Emit(r.Key, append([]byte("FS-GRANTED:"), b...), r.Time)
					return nil
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

// deep recurses without bound; the guest's stack limit stops it.
func deep(n int) int {
	var pad [64]byte
	pad[n%64] = byte(n)
	return deep(n+1) + int(pad[0])
}
