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
		out.Emits = append(out.Emits, wasm.Emit{Key: r.Key, Value: strconv.AppendUint(nil, n, 10), Time: r.Time, Input: i})
	}
	for k, n := range c.cache {
		out.State = append(out.State, wasm.StateOp{Key: []byte(k), Value: strconv.AppendUint(nil, n, 10)})
	}
	return out, nil
}

// Close releases nothing.
func (c *NativeCount) Close(context.Context) error { return nil }
