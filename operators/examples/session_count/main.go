//go:build wasip1

// Command session_count is a keyed operator counting records per key in
// sessions: runs of records each less than gap after the one before it.
// Config: {"gap_ms": G, "time": "event"|"processing",
// "allowed_lateness_ms": L} (defaults 30000, "event" and 0). A record's time
// is its event time, or with "processing" the stage's processing clock
// (ingestion time unless the job grants the wall clock).
//
// A session [first, last] is open until its timer at last+gap-1 (of the
// config's time domain) fires, when the watermark or the processing clock
// reaches it: no record can then join it any more. The timer emits
// (key, "first,last,count", last+gap-1) and deletes the session.
//
// A record at t joins every open session it is less than gap from
// (first-gap < t < last+gap). With records out of order (within the
// watermark's bound) that may be two sessions, which it bridges: they merge
// into one, with the summed count plus one, and the timers of the sessions
// it replaces are deleted. Without allowed lateness, records behind the
// watermark never reach the operator: the engine dead-letters them, as for
// window_count. A record the engine admits is then after the watermark, so
// it is never within gap of a session that has already closed.
//
// Allowed lateness (event time only; Flink's merging windows): with L > 0
// a session is kept after it fires, until the watermark passes
// last+gap-1+L (a cleanup timer there deletes it). A late record (at or
// before the watermark, which the job admits with
// watermark.allowed_lateness) joins, extends or bridges sessions exactly as
// above, kept ones included. If the merged session's end (last+gap-1) is at
// or before the watermark, it has fired, and its updated result is emitted
// right away, in the same format (a late firing: a consumer keeps the latest
// per session; a merge replaces the sessions it covers); otherwise it fires
// on time at its end. A record whose session would already be dropped is
// ignored. A timer at t emits the session ending at t and deletes the ones
// whose cleanup time is t or before; a timer the merges no longer need is
// deleted unless another session's end or cleanup falls on it. The engine
// hands a late record to the operator in a call of its own, at the
// watermark it was routed at, so c.Watermark() decides this the same way
// after a replay.
//
// State: the key's sessions, in order, in its sub-key "" (prefetched
// with the batch, so a record costs no host call), as decimal
// "first,last,count" entries separated by ";". Sessions are at least
// gap apart and end after the watermark less the allowed lateness, so a key
// has at most (max_out_of_orderness+allowed lateness)/gap + 2 of them by
// event time and one by processing time. The value is deleted when the
// key's last session is dropped.
package main

import (
	"encoding/json"
	"errors"
	"math"
	"strconv"

	"cairn/operators/sdk"
)

func main() {}

var (
	gap        int64 = 30000
	processing bool  // sessions by processing time
	lateness   int64 // allowed_lateness_ms
)

type session struct{ first, last, count int64 }

// init panics on a bad config: the instance fails to start, with the
// message, before the job reads any input.
func init() {
	if err := configure(sdk.Config()); err != nil {
		panic("session_count: " + err.Error())
	}
	var (
		open, next []session
		buf        []byte
	)
	sdk.Register(sdk.Operator{
		OnRecord: func(c *sdk.Context, r sdk.Record) error {
			t := r.Time
			if processing {
				t = c.ProcTime()
			}
			var err error
			if open, err = load(c, open[:0]); err != nil {
				return err
			}
			// The sessions t joins are contiguous: [i, j).
			i := 0
			for i < len(open) && open[i].last+gap <= t {
				i++
			}
			j := i
			for j < len(open) && open[j].first-gap < t {
				j++
			}
			m := session{first: t, last: t, count: 1}
			for _, s := range open[i:j] {
				m.first, m.last, m.count = min(m.first, s.first), max(m.last, s.last), m.count+s.count
			}
			if lateness > 0 {
				next, buf = withLateness(c, open, i, j, m, next, buf)
				return nil
			}
			for _, s := range open[i:j] {
				if s.last != m.last {
					deleteTimer(c, s.last+gap-1)
				}
			}
			if j == i || open[j-1].last != m.last {
				registerTimer(c, m.last+gap-1)
			}
			next = append(append(append(next[:0], open[:i]...), m), open[j:]...)
			buf = store(c, next, buf)
			return nil
		},
		OnTimer: func(c *sdk.Context, t sdk.Timer) error {
			if t.Processing != processing {
				return errors.New("session_count: a timer of the other time domain")
			}
			var err error
			if open, err = load(c, open[:0]); err != nil {
				return err
			}
			// Emit every session of the key closed by the timer's time
			// (normally just the one whose timer this is), oldest first.
			next = next[:0]
			for _, s := range open {
				end := s.last + gap - 1
				if lateness > 0 {
					// It fires at its end (this timer, once) and is dropped
					// at its cleanup time; one timer may be both one
					// session's end and another's cleanup.
					if end == t.Time {
						buf = emit(c, s, buf)
					}
					if !dropped(end, t.Time) {
						next = append(next, s)
					}
					continue
				}
				if end > t.Time {
					next = append(next, s)
					continue
				}
				buf = emit(c, s, buf)
			}
			if len(next) != len(open) {
				buf = store(c, next, buf)
			}
			return nil
		},
	})
}

// withLateness handles a record under allowed lateness: m, the session it
// makes, replaces open[i:j]; the call's watermark tells whether m has fired
// (a late firing), and whether it is dropped already (the record is
// ignored). next and buf are scratch space, returned for reuse.
func withLateness(c *sdk.Context, open []session, i, j int, m session, next []session, buf []byte) ([]session, []byte) {
	wm := c.Watermark()
	end := m.last + gap - 1
	if dropped(end, wm) {
		return next, buf
	}
	next = append(append(append(next[:0], open[:i]...), m), open[j:]...)
	// needed reports whether a session left needs a timer at x (its end or
	// its cleanup): timers are a set per key, so a replaced session's timer
	// may be another's.
	needed := func(x int64) bool {
		for _, s := range next {
			if e := s.last + gap - 1; e == x || cleanup(e) == x {
				return true
			}
		}
		return false
	}
	for _, s := range open[i:j] {
		e := s.last + gap - 1
		if e > wm && !needed(e) {
			c.DeleteEventTimer(e)
		}
		if x := cleanup(e); x > wm && x != e && !needed(x) {
			c.DeleteEventTimer(x)
		}
	}
	if j == i || open[j-1].last != m.last { // else the timers are the replaced session's
		if end > wm {
			c.RegisterEventTimer(end) // it fires on time
		}
		c.RegisterEventTimer(cleanup(end))
	}
	buf = store(c, next, buf)
	if end <= wm {
		buf = emit(c, m, buf) // it has fired: a late firing
	}
	return next, buf
}

// emit outputs a session: (key, "first,last,count", last+gap-1). It
// returns buf.
func emit(c *sdk.Context, s session, buf []byte) []byte {
	buf = strconv.AppendInt(buf[:0], s.first, 10)
	buf = append(buf, ',')
	buf = strconv.AppendInt(buf, s.last, 10)
	buf = append(buf, ',')
	buf = strconv.AppendInt(buf, s.count, 10)
	c.Emit(c.Key(), buf, s.last+gap-1)
	return buf
}

// dropped reports whether a session ending at end (last+gap-1) is gone
// under the watermark wm: wm passed end + allowed lateness (without allowed
// lateness: it closed). The distance is taken unsigned, so no extreme
// overflows.
func dropped(end, wm int64) bool {
	return end <= wm && uint64(wm)-uint64(end) >= uint64(lateness)
}

// cleanup is the time of the timer that drops the session ending at end:
// end + allowed lateness (at most math.MaxInt64).
func cleanup(end int64) int64 {
	if end > math.MaxInt64-lateness {
		return math.MaxInt64
	}
	return end + lateness
}

func registerTimer(c *sdk.Context, t int64) {
	if processing {
		c.RegisterProcessingTimer(t)
	} else {
		c.RegisterEventTimer(t)
	}
}

func deleteTimer(c *sdk.Context, t int64) {
	if processing {
		c.DeleteProcessingTimer(t)
	} else {
		c.DeleteEventTimer(t)
	}
}

// load appends the key's open sessions to dst.
func load(c *sdk.Context, dst []session) ([]session, error) {
	v, ok := c.Get("")
	if !ok {
		return dst, nil
	}
	for len(v) > 0 {
		var s session
		var ok1, ok2, ok3 bool
		s.first, v, ok1 = parseInt(v, ',')
		s.last, v, ok2 = parseInt(v, ',')
		s.count, v, ok3 = parseInt(v, ';')
		if !ok1 || !ok2 || !ok3 {
			return dst, errors.New(`session_count: the key's state is not "first,last,count" entries separated by ";"`)
		}
		dst = append(dst, s)
	}
	return dst, nil
}

// store writes the sessions (deleting the key's state when there are none),
// encoding them in buf, which it returns.
func store(c *sdk.Context, ss []session, buf []byte) []byte {
	if len(ss) == 0 {
		c.Delete("")
		return buf
	}
	buf = buf[:0]
	for k, s := range ss {
		if k > 0 {
			buf = append(buf, ';')
		}
		buf = strconv.AppendInt(buf, s.first, 10)
		buf = append(buf, ',')
		buf = strconv.AppendInt(buf, s.last, 10)
		buf = append(buf, ',')
		buf = strconv.AppendInt(buf, s.count, 10)
	}
	c.Put("", buf)
	return buf
}

// parseInt reads a signed decimal up to sep or the end of b and returns the
// rest after sep; a hand-written loop (see docs/ABI.md, "Performance notes").
func parseInt(b []byte, sep byte) (n int64, rest []byte, ok bool) {
	neg := len(b) > 0 && b[0] == '-'
	if neg {
		b = b[1:]
	}
	i := 0
	for ; i < len(b) && b[i] != sep; i++ {
		d := b[i] - '0'
		if d > 9 || n > (1<<63-1-int64(d))/10 {
			return 0, nil, false
		}
		n = n*10 + int64(d)
	}
	if i == 0 {
		return 0, nil, false
	}
	if neg {
		n = -n
	}
	if i < len(b) {
		i++ // the separator
	}
	return n, b[i:], true
}

// configure reads the config: absent fields keep their defaults, present
// ones must be usable.
func configure(cfg []byte) error {
	if len(cfg) == 0 {
		return nil
	}
	var c struct {
		GapMS             *int64 `json:"gap_ms"`
		Time              string `json:"time"`
		AllowedLatenessMS int64  `json:"allowed_lateness_ms"`
	}
	if err := json.Unmarshal(cfg, &c); err != nil {
		return errors.New("bad config: " + err.Error())
	}
	if c.GapMS != nil {
		if *c.GapMS <= 0 {
			return errors.New(`config "gap_ms" is ` + strconv.FormatInt(*c.GapMS, 10) + ", want a positive number of milliseconds")
		}
		gap = *c.GapMS
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
		return errors.New(`config "allowed_lateness_ms" applies to event-time sessions: a processing-time session is never late`)
	}
	lateness = c.AllowedLatenessMS
	return nil
}
