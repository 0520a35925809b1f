//go:build wasip1

// Command sliding_count is a keyed operator counting records per key in
// sliding (hopping) windows. Config: {"size_ms": N, "slide_ms": S,
// "time": "event"|"processing", "allowed_lateness_ms": L} (defaults 60000,
// 10000, "event" and 0); S must divide N, and N/S (the windows a record
// belongs to) is at most 1000.
//
// The windows are [start, start+size) for every start that is a multiple of
// slide, so a record belongs to size/slide of them. Event-time windows
// assign a record by its event time and close when the watermark passes
// their end; processing-time windows assign it by the stage's processing
// clock (ingestion time unless the job grants the wall clock) and close when
// that clock passes their end. Records behind the watermark reach the
// operator only under the job's watermark.allowed_lateness (see below);
// otherwise the engine dead-letters them, as for window_count.
//
// State is kept per slide, not per window: sub-key b (decimal) counts the
// key's records in the bucket [b, b+slide), so a key holds at most
// size/slide buckets plus those of the disorder the watermark allows. When
// a bucket is created it registers a timer (of the windows' domain) at the
// end - 1 of every window containing it: b+slide-1, b+2*slide-1, ...,
// b+size-1 (timers are a set: overlapping buckets share them). The timer at
// t emits (key, "start,count", t) for the window starting at
// start = t-size+1, the sum of its buckets, and deletes the buckets no later
// window contains (those at or before start): a key's state is gone when its
// last window closes.
//
// Allowed lateness (event time only; Flink's): with L > 0 a window is kept
// after it fires until the watermark passes its end - 1 + L, so a bucket
// lives until the last window holding it is dropped: a new bucket b also
// registers a cleanup timer at b+size-1+L, and a timer at t deletes the
// buckets with b+size-1+L <= t (it emits a window only when t is a window's
// end - 1). A late record (at or before the watermark, which the job admits
// with watermark.allowed_lateness) is counted in its bucket and every window
// holding it that has fired but is still kept emits its updated sum right
// away, oldest first, in the same format (late firings: a consumer keeps
// the latest per window); windows not fired yet count it when they fire,
// dropped ones ignore it (a record all of whose windows are dropped is
// ignored). The engine hands a late record to the operator in a call of its
// own, at the watermark it was routed at, so c.Watermark() decides this the
// same way after a replay.
package main

import (
	"encoding/json"
	"errors"
	"math"
	"strconv"

	"cairn/operators/sdk"
)

func main() {}

// maxWindows bounds size/slide: every new bucket registers that many timers.
const maxWindows = 1000

var (
	size       int64 = 60000
	slide      int64 = 10000
	processing bool  // windows by processing time
	lateness   int64 // allowed_lateness_ms
)

// init panics on a bad config: the instance fails to start, with the
// message, before the job reads any input.
func init() {
	if err := configure(sdk.Config()); err != nil {
		panic("sliding_count: " + err.Error())
	}
	var buf []byte
	sdk.Register(sdk.Operator{
		OnRecord: func(c *sdk.Context, r sdk.Record) error {
			t := r.Time
			if processing {
				t = c.ProcTime()
			}
			b := floorDiv(t, slide) * slide
			wm := c.Watermark()
			if lateness > 0 && dropped(b+size-1, wm) {
				return nil // every window holding the bucket is gone
			}
			sub := strconv.FormatInt(b, 10)
			var n uint64
			if v, ok := c.Get(sub); ok {
				n, _ = strconv.ParseUint(string(v), 10, 64)
			} else {
				// A new bucket: a timer at the end - 1 of each window
				// containing it, oldest first (with allowed lateness only
				// of the windows that have not fired yet, and the
				// bucket's cleanup).
				for end := b + slide; end <= b+size; end += slide {
					if processing {
						c.RegisterProcessingTimer(end - 1)
					} else if lateness == 0 || end-1 > wm {
						c.RegisterEventTimer(end - 1)
					}
				}
				if lateness > 0 {
					c.RegisterEventTimer(cleanup(b + size - 1))
				}
			}
			buf = strconv.AppendUint(buf[:0], n+1, 10)
			c.Put(sub, buf)
			if lateness > 0 && b+slide-1 <= wm {
				buf = lateFirings(c, b, wm, buf)
			}
			return nil
		},
		OnTimer: func(c *sdk.Context, t sdk.Timer) error {
			if t.Processing != processing {
				return errors.New("sliding_count: a timer of the other time domain")
			}
			start := t.Time - size + 1
			var sum uint64
			var dead []string // buckets no later window contains
			c.Scan("", func(sub string, v []byte) bool {
				b, err := strconv.ParseInt(sub, 10, 64)
				if err != nil {
					return true
				}
				if b >= start && b < start+size {
					n, _ := strconv.ParseUint(string(v), 10, 64)
					sum += n
				}
				// Without allowed lateness: b <= start.
				if dropped(b+size-1, t.Time) {
					dead = append(dead, sub)
				}
				return true
			})
			for _, sub := range dead {
				c.Delete(sub)
			}
			// With allowed lateness a timer may be a cleanup only: it emits
			// when it is a window's end - 1 (every timer is, without).
			if sum == 0 || t.Time == math.MaxInt64 || floorDiv(t.Time+1, slide)*slide != t.Time+1 {
				return nil
			}
			buf = strconv.AppendInt(buf[:0], start, 10)
			buf = append(buf, ',')
			buf = strconv.AppendUint(buf, sum, 10)
			c.Emit(c.Key(), buf, t.Time)
			return nil
		},
	})
}

// lateFirings emits, oldest first, every window holding bucket b that has
// fired (its end - 1 at or before the watermark wm) and is still kept (not
// dropped): (key, "start,count", end - 1), the sum of its buckets, this
// call's write included. It returns buf.
func lateFirings(c *sdk.Context, b, wm int64, buf []byte) []byte {
	counts := map[int64]uint64{}
	c.Scan("", func(sub string, v []byte) bool {
		if k, err := strconv.ParseInt(sub, 10, 64); err == nil {
			counts[k], _ = strconv.ParseUint(string(v), 10, 64)
		}
		return true
	})
	// The windows holding b start at b-size+slide, ..., b; each sum is
	// the one before it less the bucket it leaves, plus the one it takes.
	first := b - size + slide
	var sum uint64
	for k := first; k < first+size; k += slide {
		sum += counts[k]
	}
	for start := first; start <= b; start += slide {
		if start > first {
			sum = sum - counts[start-slide] + counts[start+size-slide]
		}
		end := start + size - 1
		if end > wm {
			break // this one and the later ones have not fired
		}
		if dropped(end, wm) {
			continue
		}
		buf = strconv.AppendInt(buf[:0], start, 10)
		buf = append(buf, ',')
		buf = strconv.AppendUint(buf, sum, 10)
		c.Emit(c.Key(), buf, end)
	}
	return buf
}

// dropped reports whether a window whose end - 1 is end is gone under the
// watermark wm: wm passed end + allowed lateness (without allowed lateness:
// it closed). The distance is taken unsigned, so no extreme overflows.
func dropped(end, wm int64) bool {
	return end <= wm && uint64(wm)-uint64(end) >= uint64(lateness)
}

// cleanup is the time of the timer that drops the window whose end - 1 is
// end: end + allowed lateness (at most math.MaxInt64).
func cleanup(end int64) int64 {
	if end > math.MaxInt64-lateness {
		return math.MaxInt64
	}
	return end + lateness
}

// configure reads the config: absent fields keep their defaults, present
// ones must be usable.
func configure(cfg []byte) error {
	if len(cfg) == 0 {
		return nil
	}
	var c struct {
		SizeMS            *int64 `json:"size_ms"`
		SlideMS           *int64 `json:"slide_ms"`
		Time              string `json:"time"`
		AllowedLatenessMS int64  `json:"allowed_lateness_ms"`
	}
	if err := json.Unmarshal(cfg, &c); err != nil {
		return errors.New("bad config: " + err.Error())
	}
	if c.SizeMS != nil {
		if *c.SizeMS <= 0 {
			return errors.New(`config "size_ms" is ` + strconv.FormatInt(*c.SizeMS, 10) + ", want a positive number of milliseconds")
		}
		size = *c.SizeMS
	}
	defaulted := ""
	if c.SlideMS != nil {
		if *c.SlideMS <= 0 {
			return errors.New(`config "slide_ms" is ` + strconv.FormatInt(*c.SlideMS, 10) + ", want a positive number of milliseconds")
		}
		slide = *c.SlideMS
	} else {
		defaulted = " (the default)"
	}
	if size%slide != 0 {
		return errors.New(`config "slide_ms" ` + strconv.FormatInt(slide, 10) + defaulted + ` does not divide "size_ms" ` +
			strconv.FormatInt(size, 10) + ": a window must be a whole number of slides")
	}
	if size/slide > maxWindows {
		return errors.New(`config "size_ms"/"slide_ms" is ` + strconv.FormatInt(size/slide, 10) +
			" windows per record, at most " + strconv.Itoa(maxWindows))
	}
	switch c.Time {
	case "", "event":
	case "processing":
		processing = true
	default:
		return errors.New(`config "time" is "` + c.Time + `", want "event" or "processing"`)
	}
	switch {
	case c.AllowedLatenessMS < 0:
		return errors.New(`config "allowed_lateness_ms" is ` + strconv.FormatInt(c.AllowedLatenessMS, 10) + ", want 0 or a positive number of milliseconds")
	case c.AllowedLatenessMS > 0 && processing:
		return errors.New(`config "allowed_lateness_ms" applies to event-time windows: a processing-time window is never late`)
	}
	lateness = c.AllowedLatenessMS
	return nil
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}
