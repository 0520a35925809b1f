//go:build wasip1

// Command sdkcalls is an operator for the wasm package's tests of the SDK
// calls EmitStart/EmitEnd and Prefetch, built by the tests with the Go
// toolchain. A record's value is a command:
//
//	emit <n>          emits n bytes ("0123456789" repeated) written in place
//	pre <s1> <s2> ... Prefetch of the sub-keys, then Get of each, emitted
//	                  as "s1=v1 s2=- ..." (- for absent)
//	put <s> <v>       Put of sub-key s
//	log-in-emit       a Log between EmitStart and EmitEnd (fails the call)
//	open-emit         EmitStart without EmitEnd (fails the call)
package main

import (
	"bytes"
	"strconv"

	"cairn/operators/sdk"
)

func main() {}

func init() {
	sdk.Register(sdk.Operator{OnRecord: onRecord})
}

func onRecord(c *sdk.Context, r sdk.Record) error {
	f := bytes.Fields(r.Value)
	switch string(f[0]) {
	case "emit":
		n, err := strconv.Atoi(string(f[1]))
		if err != nil {
			return err
		}
		b := c.EmitStart(r.Key, r.Time)
		for i := range n {
			b = append(b, byte('0'+i%10))
		}
		c.EmitEnd(b)
	case "pre":
		subs := make([]string, 0, len(f)-1)
		for _, s := range f[1:] {
			subs = append(subs, string(s))
		}
		c.Prefetch(subs...)
		var out []byte
		for _, s := range subs {
			v, ok := c.Get(s)
			if !ok {
				v = []byte("-")
			}
			out = append(append(append(append(out, s...), '='), v...), ' ')
		}
		c.Emit(r.Key, bytes.TrimSpace(out), r.Time)
	case "put":
		c.Put(string(f[1]), f[2])
	case "log-in-emit":
		b := c.EmitStart(r.Key, r.Time)
		c.Log(sdk.LevelInfo, "between")
		c.EmitEnd(append(b, 'x'))
	case "open-emit":
		c.EmitStart(r.Key, r.Time)
	}
	return nil
}
