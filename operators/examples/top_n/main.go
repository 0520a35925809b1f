//go:build wasip1

// Command top_n is a keyed operator that emits, per key and tumbling
// event-time window, the n entries with the largest counts. Input values
// are "<entry>=<count>" (as builtin:rekey writes a count's outputs); a later
// value for an entry in the same window replaces the earlier one (counts
// are running totals). Config: {"n": 10, "size_ms": 60000}.
//
// State: sub-key "<window start>/<entry>" holds the entry's latest count in
// that window; an event-time timer at the window's end - 1 emits
// (key, "<start>:<entry>=<count>,...", end - 1), largest first (ties by
// entry), and deletes the window's state: state is bounded by the distinct
// entries of the open windows.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"sort"
	"strconv"

	"cairn/operators/sdk"
)

func main() {}

var (
	n          = 10
	size int64 = 60000
)

func init() {
	if cfg := sdk.Config(); len(cfg) > 0 {
		var c struct {
			N      int   `json:"n"`
			SizeMS int64 `json:"size_ms"`
		}
		if err := json.Unmarshal(cfg, &c); err != nil {
			panic("top_n: bad config: " + err.Error())
		}
		if c.N > 0 {
			n = c.N
		}
		if c.SizeMS > 0 {
			size = c.SizeMS
		}
	}
	var buf []byte
	sdk.Register(sdk.Operator{
		OnRecord: func(c *sdk.Context, r sdk.Record) error {
			i := bytes.LastIndexByte(r.Value, '=')
			if i <= 0 {
				return errors.New(`top_n: value is not "<entry>=<count>"`)
			}
			if _, err := strconv.ParseUint(string(r.Value[i+1:]), 10, 64); err != nil {
				return errors.New("top_n: count is not a number: " + string(r.Value[i+1:]))
			}
			start := floorDiv(r.Time, size) * size
			c.Put(strconv.FormatInt(start, 10)+"/"+string(r.Value[:i]), r.Value[i+1:])
			c.RegisterEventTimer(start + size - 1)
			return nil
		},
		OnTimer: func(c *sdk.Context, t sdk.Timer) error {
			start := t.Time - size + 1
			prefix := strconv.FormatInt(start, 10) + "/"
			type entry struct {
				name  string
				count uint64
			}
			var all []entry
			c.Scan(prefix, func(sub string, v []byte) bool {
				k, _ := strconv.ParseUint(string(v), 10, 64)
				all = append(all, entry{sub[len(prefix):], k})
				return true
			})
			for _, e := range all {
				c.Delete(prefix + e.name)
			}
			if len(all) == 0 {
				return nil
			}
			sort.Slice(all, func(i, j int) bool {
				if all[i].count != all[j].count {
					return all[i].count > all[j].count
				}
				return all[i].name < all[j].name
			})
			buf = strconv.AppendInt(buf[:0], start, 10)
			buf = append(buf, ':')
			for i, e := range all[:min(n, len(all))] {
				if i > 0 {
					buf = append(buf, ',')
				}
				buf = append(buf, e.name...)
				buf = append(buf, '=')
				buf = strconv.AppendUint(buf, e.count, 10)
			}
			c.Emit(c.Key(), buf, t.Time)
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
