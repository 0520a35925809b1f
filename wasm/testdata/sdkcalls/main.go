//go:build wasip1

// Command sdkcalls is an operator for the wasm package's tests of the SDK
// calls EmitStart/EmitEnd and GetMany, built by the tests with the Go
// toolchain. A record's value is a command:
//
//	emit <n>          emits n bytes ("0123456789" repeated) written in place
//	pre <s1> <s2> ... GetMany of the sub-keys (checked against a Get of
//	                  each after it), emitted as "s1=v1 s2=- ..." (- for absent)
//	put <s> <v>       Put of sub-key s
//	log-in-emit       a Log between EmitStart and EmitEnd (fails the call)
//	open-emit         EmitStart without EmitEnd (fails the call)
package main

import (
	"bytes"
	"errors"
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
		vals := make([][]byte, len(subs))
		found := make([]bool, len(subs))
		c.GetMany(subs, vals, found)
		var out []byte
		for i, s := range subs {
			v, ok := vals[i], found[i]
			if again, okAgain := c.Get(s); okAgain != ok || string(again) != string(v) {
				return errors.New("Get after GetMany: another answer")
			}
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
