//go:build wasip1

// Command window_count is a keyed operator counting records per key in
// tumbling windows. Config: {"size_ms": N, "time": "event"|"processing"}
// (defaults 60000 and "event"). Event-time windows assign a record by its
// event time and close when the watermark passes their end; processing-time
// windows assign it by the stage's processing clock (ingestion time unless
// the job grants the wall clock) and close when that clock passes their end.
// The count of the window starting at s lives in state sub-key s (decimal);
// a timer of the window's domain at its end - 1 emits
// (key, "start,count", end - 1) for every window of the key that has ended
// (found with Scan) and deletes their state.
package main

import (
	"encoding/json"
	"errors"
	"sort"
	"strconv"

	"cairn/operators/sdk"
)

func main() {}

var (
	size       int64 = 60000
	processing bool  // windows by processing time
)

// init panics on a bad config: the instance fails to start, with the
// message, before the job reads any input.
func init() {
	if cfg := sdk.Config(); len(cfg) > 0 {
		var c struct {
			SizeMS int64  `json:"size_ms"`
			Time   string `json:"time"`
		}
		if err := json.Unmarshal(cfg, &c); err != nil {
			panic("window_count: bad config: " + err.Error())
		} else {
			if c.SizeMS > 0 {
				size = c.SizeMS
			}
			switch c.Time {
			case "", "event":
			case "processing":
				processing = true
			default:
				panic(`window_count: config "time" is "` + c.Time + `", want "event" or "processing"`)
			}
		}
	}
	var buf []byte
	sdk.Register(sdk.Operator{
		OnRecord: func(c *sdk.Context, r sdk.Record) error {
			if processing {
				start := floorDiv(c.ProcTime(), size) * size
				count(c, start, &buf)
				c.RegisterProcessingTimer(start + size - 1)
				return nil
			}
			start := floorDiv(r.Time, size) * size
			count(c, start, &buf)
			c.RegisterEventTimer(start + size - 1)
			return nil
		},
		OnTimer: func(c *sdk.Context, t sdk.Timer) error {
			if t.Processing != processing {
				return errors.New("window_count: a timer of the other time domain")
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

// count adds one to the window starting at start.
func count(c *sdk.Context, start int64, buf *[]byte) {
	sub := strconv.FormatInt(start, 10)
	var n uint64
	if v, ok := c.Get(sub); ok {
		n, _ = strconv.ParseUint(string(v), 10, 64)
	}
	*buf = strconv.AppendUint((*buf)[:0], n+1, 10)
	c.Put(sub, *buf)
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}
