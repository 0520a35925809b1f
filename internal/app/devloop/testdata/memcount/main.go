//go:build wasip1

// Command memcount is a keyed count that keeps its counts in the module's
// own memory instead of the host's state: correct until the instance is
// replaced (a restore, a rescale, a trap), then it counts from zero. It is
// the bug `cairn test --restore-every` exists to catch.
package main

import (
	"strconv"

	"cairn/operators/sdk"
)

func main() {}

var counts = map[string]int{}

func init() {
	sdk.Register(sdk.Operator{OnRecord: func(c *sdk.Context, r sdk.Record) error {
		counts[string(c.Key())]++
		c.Emit(c.Key(), []byte(strconv.Itoa(counts[string(c.Key())])), r.Time)
		return nil
	}})
}
