//go:build wasip1

// Command sdkcheck exercises the whole Go SDK from commands in the record
// values (one per record, words separated by spaces); its Rust and C twins
// (../rust, ../c) must produce the same outputs (e2e/languages_test.go):
//
//	put SUB N     put N bytes ('a' + i%26) under sub-key SUB ("-" is "")
//	get SUB       emit "SUB=len:sum" or "SUB=absent"
//	del SUB       delete SUB
//	scan PREFIX   emit "sub=len:sum,..." in sub-key order ("-" is "")
//	etimer T      register an event-time timer at T (edel T deletes it)
//	ptimer T      register a processing-time timer at T (pdel T deletes it)
//	info          emit "pt=P cfg=CONFIG key=KEY" (not the watermark: it
//	              depends on how records are grouped into calls)
//	log           log a line
//	rekey K       emit value "moved" under key K
//	fail          return an error "failed on purpose"
//	crash         panic
//
// A fired timer emits "timer e|p T".
package main

import (
	"errors"
	"strconv"
	"strings"

	"cairn/operators/sdk"
)

func main() {}

func sub(s string) string {
	if s == "-" {
		return ""
	}
	return s
}

func sum(v []byte) string {
	n := 0
	for _, b := range v {
		n += int(b)
	}
	return strconv.Itoa(len(v)) + ":" + strconv.Itoa(n)
}

func init() {
	sdk.Register(sdk.Operator{
		OnRecord: func(c *sdk.Context, r sdk.Record) error {
			f := strings.Fields(string(r.Value))
			arg := func(i int) string {
				if i < len(f) {
					return f[i]
				}
				return ""
			}
			num := func(i int) int64 { n, _ := strconv.ParseInt(arg(i), 10, 64); return n }
			emit := func(s string) { c.Emit(r.Key, []byte(s), r.Time) }
			switch arg(0) {
			case "put":
				v := make([]byte, num(2))
				for i := range v {
					v[i] = byte('a' + i%26)
				}
				c.Put(sub(arg(1)), v)
			case "get":
				if v, ok := c.Get(sub(arg(1))); ok {
					emit(arg(1) + "=" + sum(v))
				} else {
					emit(arg(1) + "=absent")
				}
			case "del":
				c.Delete(sub(arg(1)))
			case "scan":
				var parts []string
				c.Scan(sub(arg(1)), func(s string, v []byte) bool {
					parts = append(parts, s+"="+sum(v))
					return true
				})
				emit(strings.Join(parts, ","))
			case "etimer":
				c.RegisterEventTimer(num(1))
			case "edel":
				c.DeleteEventTimer(num(1))
			case "ptimer":
				c.RegisterProcessingTimer(num(1))
			case "pdel":
				c.DeleteProcessingTimer(num(1))
			case "info":
				emit("pt=" + strconv.FormatInt(c.ProcTime(), 10) + " cfg=" + string(c.Config()) + " key=" + string(c.Key()))
			case "log":
				c.Log(sdk.LevelInfo, "sdkcheck logs")
			case "rekey":
				c.Emit([]byte(arg(1)), []byte("moved"), r.Time)
			case "fail":
				return errors.New("failed on purpose")
			case "crash":
				panic("crashed on purpose")
			}
			return nil
		},
		OnTimer: func(c *sdk.Context, t sdk.Timer) error {
			d := "e"
			if t.Processing {
				d = "p"
			}
			c.Emit(t.Key, []byte("timer "+d+" "+strconv.FormatInt(t.Time, 10)), t.Time)
			return nil
		},
	})
}
