package engine

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
)

// memCursor remembers what a trace printed already.
type memCursor struct {
	outputs map[int]int
	dead    int
}

// newSince prints the outputs and dead letters appended since the cursor,
// outputs by (key group, index), dead letters by input sequence.
func newSince(b *MemLog, c *memCursor) string {
	outputs, all := b.Outputs(), b.DeadLetters()
	if c.outputs == nil {
		c.outputs = map[int]int{}
	}
	var sb strings.Builder
	kgs := make([]int, 0, len(outputs))
	for kg := range outputs {
		kgs = append(kgs, kg)
	}
	sort.Ints(kgs)
	for _, kg := range kgs {
		outs := outputs[kg]
		for _, o := range outs[c.outputs[kg]:] {
			if o.Marker {
				fmt.Fprintf(&sb, "marker kg=%d idx=%d wm=%d\n", kg, o.Index, o.Wm)
				continue
			}
			fmt.Fprintf(&sb, "out kg=%d idx=%d key=%s value=%s time=%d", kg, o.Index, o.Key, o.Value, o.Time)
			if o.Wm != math.MinInt64 && o.Wm != 0 {
				fmt.Fprintf(&sb, " wm=%d", o.Wm)
			}
			if o.Fenced {
				sb.WriteString(" fenced")
			}
			sb.WriteByte('\n')
		}
		c.outputs[kg] = len(outs)
	}
	dead := all[c.dead:]
	c.dead = len(all)
	seq := func(m *nats.Msg) uint64 { n, _ := strconv.ParseUint(m.Header.Get(HeaderSeq), 10, 64); return n }
	sort.SliceStable(dead, func(i, j int) bool { return seq(dead[i]) < seq(dead[j]) })
	for _, m := range dead {
		fmt.Fprintf(&sb, "dead seq=%s stage=%s key=%.20s", m.Header.Get(HeaderSeq), m.Header.Get(HeaderStage), m.Header.Get(HeaderKey))
		var extra []string
		for k, v := range m.Header {
			if strings.HasPrefix(k, HeaderOrigPrefix) || k == HeaderTruncated {
				extra = append(extra, k+":"+strings.Join(v, ","))
			}
		}
		sort.Strings(extra)
		for _, x := range extra {
			sb.WriteString(" " + x)
		}
		fmt.Fprintf(&sb, " error=%s\n", m.Header.Get(HeaderError))
	}
	return sb.String()
}

// check reports a key group whose outputs are not exactly 1, 2, 3, ...
func checkIndexes(b *MemLog) error {
	for kg, outs := range b.Outputs() {
		n := 0
		for _, o := range outs {
			if o.Marker {
				if o.Index != uint64(n) {
					return fmt.Errorf("key group %d: a marker after output %d says %d", kg, n, o.Index)
				}
				continue
			}
			n++
			if o.Index != uint64(n) {
				return fmt.Errorf("key group %d: output %d has index %d", kg, n, o.Index)
			}
		}
	}
	return nil
}
