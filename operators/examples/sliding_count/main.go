//go:build wasip1

// Command sliding_count is a keyed operator counting records per key in
// sliding (hopping) windows. Config: {"size_ms": N, "slide_ms": S,
// "time": "event"|"processing"} (defaults 60000, 10000 and "event"); S must
// divide N, and N/S (the windows a record belongs to) is at most 1000.
//
// The windows are [start, start+size) for every start that is a multiple of
// slide, so a record belongs to size/slide of them. Event-time windows
// assign a record by its event time and close when the watermark passes
// their end; processing-time windows assign it by the stage's processing
// clock (ingestion time unless the job grants the wall clock) and close when
// that clock passes their end. Records behind the watermark never reach the
// operator: the engine dead-letters them, as for window_count.
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
package main

import (
	"encoding/json"
	"errors"
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
			sub := strconv.FormatInt(b, 10)
			var n uint64
			if v, ok := c.Get(sub); ok {
				n, _ = strconv.ParseUint(string(v), 10, 64)
			} else {
				// A new bucket: a timer at the end - 1 of each window
				// containing it, oldest first.
				for end := b + slide; end <= b+size; end += slide {
					if processing {
						c.RegisterProcessingTimer(end - 1)
					} else {
						c.RegisterEventTimer(end - 1)
					}
				}
			}
			buf = strconv.AppendUint(buf[:0], n+1, 10)
			c.Put(sub, buf)
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
				if b <= start {
					dead = append(dead, sub)
				}
				return true
			})
			for _, sub := range dead {
				c.Delete(sub)
			}
			if sum == 0 {
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

// configure reads the config: absent fields keep their defaults, present
// ones must be usable.
func configure(cfg []byte) error {
	if len(cfg) == 0 {
		return nil
	}
	var c struct {
		SizeMS  *int64 `json:"size_ms"`
		SlideMS *int64 `json:"slide_ms"`
		Time    string `json:"time"`
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
	return nil
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}
