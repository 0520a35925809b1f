//go:build wasip1

// Command window_count is a keyed operator counting records per key in
// tumbling event-time windows. Config: {"size_ms": N} (default 60000).
// The count of the window starting at s lives in state sub-key s (decimal);
// an event timer at the window's end - 1 emits (key, "start,count", end - 1)
// for every window of the key that has ended (found with Scan) and deletes
// their state.
package main

import (
	"encoding/json"
	"errors"
	"sort"
	"strconv"

	"cairn/operators/sdk"
)

func main() {}

var size int64 = 60000

func init() {
	if cfg := sdk.Config(); len(cfg) > 0 {
		var c struct {
			SizeMS int64 `json:"size_ms"`
		}
		if err := json.Unmarshal(cfg, &c); err != nil {
			sdk.Log(sdk.LevelError, "window_count: bad config: "+err.Error())
		} else if c.SizeMS > 0 {
			size = c.SizeMS
		}
	}
	var buf []byte
	sdk.Register(sdk.Operator{
		OnRecord: func(c *sdk.Context, r sdk.Record) error {
			start := floorDiv(r.Time, size) * size
			sub := strconv.FormatInt(start, 10)
			var n uint64
			if v, ok := c.Get(sub); ok {
				n, _ = strconv.ParseUint(string(v), 10, 64)
			}
			n++
			buf = strconv.AppendUint(buf[:0], n, 10)
			c.Put(sub, buf)
			c.RegisterEventTimer(start + size - 1)
			return nil
		},
		OnTimer: func(c *sdk.Context, t sdk.Timer) error {
			if t.Processing {
				return errors.New("window_count: unexpected processing-time timer")
			}
			// Emit every window of the key that has ended by the timer's time
			// (normally just the one whose timer this is), oldest first.
			type window struct {
				start int64
				count []byte
			}
			var due []window
			c.Scan("", func(sub string, v []byte) bool {
				start, err := strconv.ParseInt(sub, 10, 64)
				if err == nil && start+size-1 <= t.Time {
					due = append(due, window{start, v})
				}
				return true
			})
			sort.Slice(due, func(i, j int) bool { return due[i].start < due[j].start })
			for _, w := range due {
				buf = strconv.AppendInt(buf[:0], w.start, 10)
				buf = append(buf, ',')
				buf = append(buf, w.count...)
				c.Emit(c.Key(), buf, w.start+size-1)
				c.Delete(strconv.FormatInt(w.start, 10))
			}
			return nil
		},
	})
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}
