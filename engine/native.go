package engine

import (
	"context"
	"strconv"

	"cairn/wasm"
)

// NativeCount is the keyed running count as a native Go operator: the same
// logic as the builtin WASM count, on the same engine path. It exists to
// measure what the WASM boundary costs and to test the engine without WASM.
type NativeCount struct {
	cache map[string]uint64
}

// NewNativeCount is an OperatorFactory for NativeCount.
func NewNativeCount(context.Context, int) (Operator, error) {
	return &NativeCount{cache: map[string]uint64{}}, nil
}

// Process counts each record's key and emits the running count.
func (c *NativeCount) Process(_ context.Context, b *wasm.Batch, st wasm.State) (*wasm.Output, error) {
	clear(c.cache)
	out := &wasm.Output{Emits: make([]wasm.Emit, 0, len(b.Records))}
	// The emitted and written counts are slices of one buffer (a count is
	// at most 20 digits): one allocation per call, not two per record.
	buf := make([]byte, 0, 8*len(b.Records))
	num := func(n uint64) []byte {
		from := len(buf)
		buf = strconv.AppendUint(buf, n, 10)
		return buf[from:len(buf):len(buf)]
	}
	for i := range b.Records {
		r := &b.Records[i]
		n, ok := c.cache[string(r.Key)]
		if !ok {
			v, found, err := st.Get(r.Key, nil)
			if err != nil {
				return nil, err
			}
			if found {
				if n, err = strconv.ParseUint(string(v), 10, 64); err != nil {
					return nil, err
				}
			}
		}
		n++
		c.cache[string(r.Key)] = n
		out.Emits = append(out.Emits, wasm.Emit{Key: r.Key, Value: num(n), Time: r.Time, Input: i})
	}
	out.State = make([]wasm.StateOp, 0, len(c.cache))
	for k, n := range c.cache {
		out.State = append(out.State, wasm.StateOp{Key: []byte(k), Value: num(n)})
	}
	return out, nil
}

// Close releases nothing.
func (c *NativeCount) Close(context.Context) error { return nil }
