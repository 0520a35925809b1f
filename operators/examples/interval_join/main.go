//go:build wasip1

// Command interval_join is a keyed operator joining two inputs by key and
// event time, as Flink's interval join does. It runs in a stage with two
// inputs (`from: [left, right]`): a left record L (input 0) and a right
// record R (input 1) of the same key join when
//
//	L.time + lower_ms <= R.time <= L.time + upper_ms
//
// and every such pair is emitted once, as (key, "<L value><separator><R
// value>", max(L.time, R.time)), when the second of the two arrives. Config:
// {"lower_ms": 0, "upper_ms": 600000, "separator": "|"} (the defaults);
// lower_ms must not be greater than upper_ms (both may be negative).
//
// State: every record is buffered in sub-key side + time + seq: side one
// byte ('L' or 'R'), time 8 bytes big-endian with the sign bit flipped (so
// sub-keys sort by time), seq 8 bytes big-endian, the key's next sequence
// number, kept in sub-key "n" (so records of equal times stay distinct);
// the value is the record's value. A record scans the other side's buffer
// in sub-key order (time, then arrival), so the outputs of one record come
// in that order, and depend only on the input and the state: a replay after
// a restore reproduces them.
//
// Expiry by the watermark: a left record can match no right record later
// than L.time+upper_ms, a right record no left record later than
// R.time-lower_ms. Records behind the watermark never reach the operator
// (the engine dead-letters them; under the job's watermark.allowed_lateness
// a late record joins what is still buffered and is buffered like any
// other, and if its bound is behind the watermark already its timer, fired
// right after it, removes it), so once the watermark passes that bound
// the record is of no use: it registers an event-time timer one after it,
// and a timer at t deletes every buffered record of its key (both sides)
// whose bound is before t, and sub-key "n" with the last of them. A key's
// state is thus bounded by the records of the last upper_ms (left) and
// -lower_ms (right) plus the disorder the watermark allows. Times are
// clamped at the ends of int64 instead of overflowing.
package main

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"math"
	"strconv"

	"cairn/operators/sdk"
)

func main() {}

var (
	lower int64 = 0
	upper int64 = 600000
	sep         = []byte("|")
)

const (
	seqSub = "n"       // the key's next sequence number, 8 bytes big-endian
	subLen = 1 + 8 + 8 // side, time, seq
)

// init panics on a bad config: the instance fails to start, with the
// message, before the job reads any input.
func init() {
	if err := configure(sdk.Config()); err != nil {
		panic("interval_join: " + err.Error())
	}
	var (
		sub  [subLen]byte
		seqb [8]byte
		buf  []byte
		dead []string
	)
	sdk.Register(sdk.Operator{
		OnRecord: func(c *sdk.Context, r sdk.Record) error {
			var own, other byte
			switch r.Side {
			case 0:
				own, other = 'L', 'R'
			case 1:
				own, other = 'R', 'L'
			default:
				return errors.New("interval_join: a record from input " + strconv.Itoa(r.Side) +
					": the stage must have two inputs, from: [left, right]")
			}
			var seq uint64
			if v, ok := c.Get(seqSub); ok {
				if len(v) != 8 {
					return errors.New(`interval_join: the key's state sub-key "n" is not an 8-byte sequence number`)
				}
				seq = binary.BigEndian.Uint64(v)
			}
			binary.BigEndian.PutUint64(seqb[:], seq+1)
			c.Put(seqSub, seqb[:])
			sub[0] = own
			binary.BigEndian.PutUint64(sub[1:], uint64(r.Time)^(1<<63))
			binary.BigEndian.PutUint64(sub[9:], seq)
			c.Put(string(sub[:]), r.Value)
			if own == 'L' {
				c.RegisterEventTimer(satAdd(satAdd(r.Time, upper), 1))
			} else {
				c.RegisterEventTimer(satAdd(satSub(r.Time, lower), 1))
			}

			// The other side's records in time order: for a left record the
			// distance R.time-L.time grows along the scan, for a right one it
			// shrinks, so the scan stops past the last match.
			var err error
			c.Scan(string(other), func(s string, v []byte) bool {
				t, ok := subTime(s)
				if !ok {
					err = errors.New("interval_join: the key's state has a sub-key that is not side+time+seq")
					return false
				}
				if own == 'L' {
					switch within(r.Time, t) {
					case 1:
						return false
					case 0:
						buf = append(append(append(buf[:0], r.Value...), sep...), v...)
						c.Emit(c.Key(), buf, max(r.Time, t))
					}
					return true
				}
				switch within(t, r.Time) {
				case -1:
					return false
				case 0:
					buf = append(append(append(buf[:0], v...), sep...), r.Value...)
					c.Emit(c.Key(), buf, max(r.Time, t))
				}
				return true
			})
			return err
		},
		OnTimer: func(c *sdk.Context, t sdk.Timer) error {
			if t.Processing {
				return errors.New("interval_join: a processing-time timer")
			}
			// Each side's bound grows with the time, so the scans stop at
			// the first record still of use.
			dead = dead[:0]
			remaining := false
			var err error
			for _, side := range []string{"L", "R"} {
				c.Scan(side, func(s string, _ []byte) bool {
					rt, ok := subTime(s)
					if !ok {
						err = errors.New("interval_join: the key's state has a sub-key that is not side+time+seq")
						return false
					}
					bound := satAdd(rt, upper)
					if side == "R" {
						bound = satSub(rt, lower)
					}
					if bound >= t.Time {
						remaining = true
						return false
					}
					dead = append(dead, s)
					return true
				})
				if err != nil {
					return err
				}
			}
			for _, s := range dead {
				c.Delete(s)
			}
			if !remaining {
				c.Delete(seqSub)
			}
			return nil
		},
	})
}

// subTime returns the time of a record's sub-key.
func subTime(s string) (int64, bool) {
	if len(s) != subLen {
		return 0, false
	}
	return int64(binary.BigEndian.Uint64([]byte(s[1:9])) ^ (1 << 63)), true
}

// within compares the distance r-l of a left record at l and a right one at
// r with the bounds, exactly: -1 below lower, 0 within, 1 above upper.
func within(l, r int64) int {
	d := r - l
	if (r^l)&(r^d) < 0 { // overflow: the distance is beyond int64
		if r > l {
			return 1
		}
		return -1
	}
	switch {
	case d < lower:
		return -1
	case d > upper:
		return 1
	}
	return 0
}

// satAdd is a+b clamped to int64.
func satAdd(a, b int64) int64 {
	s := a + b
	switch {
	case b > 0 && s < a:
		return math.MaxInt64
	case b < 0 && s > a:
		return math.MinInt64
	}
	return s
}

// satSub is a-b clamped to int64.
func satSub(a, b int64) int64 {
	s := a - b
	switch {
	case b > 0 && s > a:
		return math.MinInt64
	case b < 0 && s < a:
		return math.MaxInt64
	}
	return s
}

// configure reads the config: absent fields keep their defaults, present
// ones must be usable.
func configure(cfg []byte) error {
	if len(cfg) == 0 {
		return nil
	}
	var c struct {
		LowerMS   *int64  `json:"lower_ms"`
		UpperMS   *int64  `json:"upper_ms"`
		Separator *string `json:"separator"`
	}
	if err := json.Unmarshal(cfg, &c); err != nil {
		return errors.New("bad config: " + err.Error())
	}
	lowerDefault, upperDefault := " (the default)", " (the default)"
	if c.LowerMS != nil {
		lower, lowerDefault = *c.LowerMS, ""
	}
	if c.UpperMS != nil {
		upper, upperDefault = *c.UpperMS, ""
	}
	if lower > upper {
		return errors.New(`config "lower_ms" ` + strconv.FormatInt(lower, 10) + lowerDefault +
			` is greater than "upper_ms" ` + strconv.FormatInt(upper, 10) + upperDefault +
			": no pair could join")
	}
	if c.Separator != nil {
		sep = []byte(*c.Separator)
	}
	return nil
}
