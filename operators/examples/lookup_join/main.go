//go:build wasip1

// Command lookup_join is a keyed operator that enriches a stream with a
// table: it runs in a stage with two inputs, `from: [stream, table]`, the
// second a table input (a NATS KV bucket, docs/JOBS.md). A table record
// (input 1) sets the key's current row (a delete removes it); a stream
// record (input 0) is emitted as (key, "<stream value><separator><row>",
// its event time) when its key has a row. Config:
// {"separator": "|", "missing": "drop"} (the defaults); "missing": "emit"
// emits a record without a row as "<stream value><separator>" instead of
// dropping it.
//
// State: the key's row, in sub-key "" (prefetched with the batch: a lookup
// costs no host call). The join sees the table as of the record's place in
// the repartition stream that carries both inputs, so a replay after a
// restore joins every record with the same row as the first run did.
package main

import (
	"encoding/json"
	"errors"
	"strconv"

	"cairn/operators/sdk"
)

func main() {}

var (
	sep       = []byte("|")
	emitEmpty = false
)

// init panics on a bad config: the instance fails to start, with the
// message, before the job reads any input.
func init() {
	if cfg := sdk.Config(); len(cfg) > 0 && string(cfg) != "null" {
		var c struct {
			Separator *string `json:"separator"`
			Missing   *string `json:"missing"`
		}
		if err := json.Unmarshal(cfg, &c); err != nil {
			panic("lookup_join: bad config: " + err.Error())
		}
		if c.Separator != nil {
			sep = []byte(*c.Separator)
		}
		if c.Missing != nil {
			switch *c.Missing {
			case "drop":
			case "emit":
				emitEmpty = true
			default:
				panic(`lookup_join: config "missing" is ` + strconv.Quote(*c.Missing) + `: want "drop" or "emit"`)
			}
		}
	}
	var buf []byte
	sdk.Register(sdk.Operator{
		OnRecord: func(c *sdk.Context, r sdk.Record) error {
			switch r.Side {
			case 1: // the table
				if r.Delete {
					c.Delete("")
				} else {
					c.Put("", r.Value)
				}
				return nil
			case 0:
			default:
				return errors.New("lookup_join: a record from input " + strconv.Itoa(r.Side) + ": the stage must have two inputs, from: [stream, table]")
			}
			row, ok := c.Get("")
			if !ok && !emitEmpty {
				return nil
			}
			buf = append(append(append(buf[:0], r.Value...), sep...), row...)
			c.Emit(r.Key, buf, r.Time)
			return nil
		},
	})
}
