//go:build wasip1

// Command window_count is a keyed operator counting records per key in
// tumbling windows. Config: {"size_ms": N, "time": "event"|"processing",
// "allowed_lateness_ms": L} (defaults 60000, "event" and 0). Event-time
// windows assign a record by its event time and close when the watermark
// passes their end; processing-time windows assign it by the stage's
// processing clock (ingestion time unless the job grants the wall clock) and
// close when that clock passes their end.
// The count of the window starting at s lives in state sub-key s (decimal);
// a timer of the window's domain at its end - 1 emits
// (key, "start,count", end - 1) for every window of the key that has ended
// (found with Scan) and deletes their state.
//
// Allowed lateness (event time only; Flink's): with L > 0 a window's state
// is kept after it fires until the watermark passes end - 1 + L (a cleanup
// timer there deletes it). A late record (at or before the watermark, which
// the job admits with watermark.allowed_lateness) that falls into a window
// that has fired but is still kept updates its count and emits the window's
// result again right away, in the same format (a late firing: a consumer
// keeps the latest per window). A late record whose window has not fired yet
// is counted like any other; one whose window was dropped is ignored. The
// engine hands a late record to the operator in a call of its own, at the
// watermark it was routed at, so c.Watermark() decides this the same way
// after a replay.
package main

import (
	"encoding/json"
	"errors"
	"math"
	"sort"
	"strconv"

	"cairn/operators/sdk"
)

func main() {}

var (
	size       int64 = 60000
	processing bool  // windows by processing time
	lateness   int64 // allowed_lateness_ms
)

// init panics on a bad config: the instance fails to start, with the
// message, before the job reads any input.
func init() {
	if cfg := sdk.Config(); len(cfg) > 0 {
		var c struct {
			SizeMS            int64  `json:"size_ms"`
			Time              string `json:"time"`
			AllowedLatenessMS int64  `json:"allowed_lateness_ms"`
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
			switch {
			case c.AllowedLatenessMS < 0:
				panic(`window_count: config "allowed_lateness_ms" is ` + strconv.FormatInt(c.AllowedLatenessMS, 10) + ", want 0 or a positive number of milliseconds")
			case c.AllowedLatenessMS > 0 && processing:
				panic(`window_count: config "allowed_lateness_ms" applies to event-time windows: a processing-time window is never late`)
			}
			lateness = c.AllowedLatenessMS
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
			end := start + size - 1
			if lateness == 0 {
				count(c, start, &buf)
				c.RegisterEventTimer(end)
				return nil
			}
			wm := c.Watermark()
			if dropped(end, wm) {
				return nil // its state is gone
			}
			count(c, start, &buf)
			if end > wm {
				c.RegisterEventTimer(end) // it fires on time
			}
			c.RegisterEventTimer(cleanup(end))
			if end <= wm {
				// The window has fired: a late firing, the updated count.
				v, _ := c.Get(strconv.FormatInt(start, 10))
				emit(c, start, v, &buf)
			}
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
			var gone []string // with allowed lateness: windows past their cleanup
			c.Scan("", func(sub string, v []byte) bool {
				start, err := strconv.ParseInt(sub, 10, 64)
				if err != nil {
					return true
				}
				end := start + size - 1
				if lateness == 0 {
					if end <= t.Time {
						due = append(due, window{start, v})
					}
					return true
				}
				// With allowed lateness a window fires at its end (this timer,
				// once) and is dropped at its cleanup time; one timer may be
				// both one window's end and another's cleanup.
				if end == t.Time {
					due = append(due, window{start, v})
				}
				if dropped(end, t.Time) {
					gone = append(gone, sub)
				}
				return true
			})
			sort.Slice(due, func(i, j int) bool { return due[i].start < due[j].start })
			for _, w := range due {
				emit(c, w.start, w.count, &buf)
				if lateness == 0 {
					c.Delete(strconv.FormatInt(w.start, 10))
				}
			}
			for _, sub := range gone {
				c.Delete(sub)
			}
			return nil
		},
	})
}

// emit outputs the window starting at start: (key, "start,count", end - 1).
func emit(c *sdk.Context, start int64, count []byte, buf *[]byte) {
	*buf = strconv.AppendInt((*buf)[:0], start, 10)
	*buf = append(*buf, ',')
	*buf = append(*buf, count...)
	c.Emit(c.Key(), *buf, start+size-1)
}

// dropped reports whether the state of the window whose last millisecond
// is end is gone under the watermark wm: wm passed end + allowed lateness.
// The distance is taken unsigned, so no extreme overflows.
func dropped(end, wm int64) bool {
	return end <= wm && uint64(wm)-uint64(end) >= uint64(lateness)
}

// cleanup is the time of the timer that drops the window whose last
// millisecond is end: end + allowed lateness (at most math.MaxInt64).
func cleanup(end int64) int64 {
	if end > math.MaxInt64-lateness {
		return math.MaxInt64
	}
	return end + lateness
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
