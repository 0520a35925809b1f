//go:build wasip1

package main

import (
	"encoding/binary"
	"errors"
	"strconv"
	"unsafe"

	"cairn/nexmark"
	"cairn/operators/sdk"
)

// The operators of q4, q6, q10, q12, q13, q15, q16 and q18 (see main.go's
// list).

// closingKey is what q4_max and q6_max key a closed auction by: its
// category (q4) or its seller (q6).
type closingKey func(*nexmark.View) int64

func byCategory(v *nexmark.View) int64 { return v.Category }
func bySeller(v *nexmark.View) int64   { return v.Seller }

// auctionMax is q4's and q6's first stage, per auction (the input's key):
// the auction under "a" as "<date_time>,<expires>,<group>", the highest
// price of its bids between its start and its expiry under "b". At the
// expiry, an auction with such a bid emits "<id> <final price>" keyed by
// its group (category or seller), at its expiry; an auction without one
// emits nothing (an inner join).
func auctionMax(group closingKey) func(*sdk.Context, sdk.Record) error {
	return func(c *sdk.Context, r sdk.Record) error {
		k, err := kind(r)
		if err != nil || k == nexmark.KindPerson {
			return err
		}
		if err := decode(r); err != nil {
			return err
		}
		if k == nexmark.KindAuction {
			b := append(strconv.AppendInt(buf[:0], v.DateTime, 10), ',')
			b = append(strconv.AppendInt(b, v.Expires, 10), ',')
			buf = strconv.AppendInt(b, group(&v), 10)
			c.Put("a", buf)
			c.RegisterEventTimer(v.Expires)
			return nil
		}
		a, ok := c.Get("a")
		if !ok {
			return nil
		}
		start, expires, _ := threeInts(a)
		if v.DateTime < start || v.DateTime > expires {
			return nil
		}
		if old, ok := c.Get("b"); ok {
			if p, _ := parseInt(old); p >= v.Price {
				return nil
			}
		}
		c.Put("b", strconv.AppendInt(buf[:0], v.Price, 10))
		return nil
	}
}

func auctionMaxTimer(c *sdk.Context, t sdk.Timer) error {
	a, okA := c.Get("a")
	p, okB := c.Get("b")
	if okA && okB {
		_, _, group := threeInts(a)
		b := append(append(append(buf[:0], c.Key()...), ' '), p...)
		buf = b
		c.Emit(strconv.AppendInt(key[:0], group, 10), buf, t.Time)
	}
	c.Delete("a")
	c.Delete("b")
	return nil
}

// ordered holds a keyed stage's inputs until the watermark passes their
// time, then hands them over in (time, id) order: the order the inputs
// from several upstream slots arrive in is not fixed, so an operator whose
// every output depends on the ones before (a running average) reads them
// in an order that is. The inputs of one time wait under the sub-key
// "<time, 16 digits>", in id order, each as id (8 bytes, little-endian),
// value length (4 bytes) and value, with an event-time timer at the time;
// the timer hands over that sub-key's inputs. A key's timers fire in time
// order, so the inputs come out in (time, id) order, and a timer reads one
// sub-key: a scan of every waiting input at every timer made a key with
// many waiting inputs quadratic.
func orderedAdd(c *sdk.Context, t, id int64, val []byte) {
	var sb [16]byte
	sub := pad16(sb[:0], t)
	old, _ := c.Get(string(sub))
	at := len(old) // the first entry with a larger id
	for i := 0; i+12 <= len(old); {
		if getInt(old[i:], 0) > id {
			at = i
			break
		}
		i += 12 + int(binary.LittleEndian.Uint32(old[i+8:]))
	}
	b := append(buf[:0], old[:at]...)
	b = binary.LittleEndian.AppendUint32(appendInt64(b, id), uint32(len(val)))
	b = append(append(b, val...), old[at:]...)
	c.Put(string(sub), b)
	buf = b
	c.RegisterEventTimer(t)
}

// orderedDrain hands over (and drops) the inputs waiting at time t, in
// id order.
func orderedDrain(c *sdk.Context, t int64, fn func(t, id int64, val []byte)) {
	var sb [16]byte
	sub := pad16(sb[:0], t)
	waiting, ok := c.Get(string(sub))
	if !ok {
		return
	}
	for i := 0; i+12 <= len(waiting); {
		n := int(binary.LittleEndian.Uint32(waiting[i+8:]))
		fn(t, getInt(waiting[i:], 0), waiting[i+12:i+12+n])
		i += 12 + n
	}
	c.Delete(string(sub))
}

// closing parses auctionMax's value "<id> <final>".
func closing(val []byte) (id, final int64, err error) {
	i := indexByte(val, ' ')
	if i < 0 {
		return 0, 0, errors.New("nexmark: a value that q4_max or q6_max did not write")
	}
	id, err1 := parseInt(val[:i])
	final, err2 := parseInt(val[i+1:])
	if err1 != nil || err2 != nil {
		return 0, 0, errors.New("nexmark: a value that q4_max or q6_max did not write")
	}
	return id, final, nil
}

func orderedRecord(c *sdk.Context, r sdk.Record) error {
	id, _, err := closing(r.Value)
	if err != nil {
		return err
	}
	orderedAdd(c, r.Time, id, r.Value)
	return nil
}

// q4Timer: per category (the key), the sum and count of the final prices
// of its closed auctions under "s" as "sum,count"; each closing, in
// (expiry, auction) order, emits category and average (integer division,
// as Flink's AVG of a BIGINT) at the expiry.
func q4Timer(c *sdk.Context, t sdk.Timer) error {
	var sum, n int64
	if s, ok := c.Get("s"); ok {
		f := splitComma(s)
		if len(f) == 2 {
			sum, _ = parseInt(f[0])
			n, _ = parseInt(f[1])
		}
	}
	changed := false
	orderedDrain(c, t.Time, func(at, _ int64, val []byte) {
		_, final, _ := closing(val)
		sum, n, changed = sum+final, n+1, true
		b := append(append(buf[:0], `{"category":`...), c.Key()...)
		b = appendInt(b, `,"avg":`, sum/n)
		buf = append(b, '}')
		c.Emit(c.Key(), buf, at)
	})
	if changed {
		b := append(strconv.AppendInt(buf[:0], sum, 10), ',')
		buf = strconv.AppendInt(b, n, 10)
		c.Put("s", buf)
	}
	return nil
}

// q6Timer: per seller (the key), the final prices of its last ten closed
// auctions under "l" (space separated, oldest first); each closing, in
// (expiry, auction) order, emits seller and the average of those ten (or
// fewer) at the expiry.
func q6Timer(c *sdk.Context, t sdk.Timer) error {
	var last []int64
	if l, ok := c.Get("l"); ok {
		for _, f := range splitByte(l, ' ') {
			p, _ := parseInt(f)
			last = append(last, p)
		}
	}
	changed := false
	orderedDrain(c, t.Time, func(at, _ int64, val []byte) {
		_, final, _ := closing(val)
		if last = append(last, final); len(last) > 10 {
			last = last[len(last)-10:]
		}
		changed = true
		var sum int64
		for _, p := range last {
			sum += p
		}
		b := append(append(buf[:0], `{"seller":`...), c.Key()...)
		b = appendInt(b, `,"avg":`, sum/int64(len(last)))
		buf = append(b, '}')
		c.Emit(c.Key(), buf, at)
	})
	if changed {
		b := buf[:0]
		for i, p := range last {
			if i > 0 {
				b = append(b, ' ')
			}
			b = strconv.AppendInt(b, p, 10)
		}
		buf = b
		c.Put("l", buf)
	}
	return nil
}

// q10 writes every bid with its partition (Flink's file sink directories
// dt=yyyy-MM-dd/hm=HH:mm) as the output's key and in the value.
func q10(c *sdk.Context, r sdk.Record) error {
	if ok, err := bid(r); !ok {
		return err
	}
	part := appendHM(append(appendDay(key[:0], v.DateTime), '/'), v.DateTime)
	b := appendInt(append(buf[:0], '{'), `"auction":`, v.Auction)
	b = appendInt(b, `,"bidder":`, v.Bidder)
	b = appendInt(b, `,"price":`, v.Price)
	b = appendInt(b, `,"date_time":`, v.DateTime)
	b = appendStr(b, `,"extra":`, v.Extra)
	b = appendStr(b, `,"dt":`, part[:10])
	b = appendStr(b, `,"hm":`, part[11:])
	buf = append(b, '}')
	key = part // keep the grown buffer
	c.Emit(part, buf, r.Time)
	return nil
}

// appendHM appends the UTC time of day of Unix ms t as HH:mm.
func appendHM(b []byte, t int64) []byte {
	m := floorDiv(t, 60_000) % (24 * 60)
	if m < 0 {
		m += 24 * 60
	}
	h, mm := m/60, m%60
	return append(b, byte('0'+h/10), byte('0'+h%10), ':', byte('0'+mm/10), byte('0'+mm%10))
}

// q12: per bidder (the key), the bids of each tumbling window (size_ms) of
// processing time: cairn's processing clock, the ingestion time of the
// record (its JetStream timestamp; a generated event's time) in 10 ms
// steps, the same at every replay. The count of a window is under sub-key
// "<window start, 16 digits>"; a processing-time timer at the window's
// end emits bidder, bid_count, starttime, endtime at end - 1.
func q12Record(c *sdk.Context, _ sdk.Record) error {
	s := floorDiv(c.ProcTime(), size) * size
	sub := string(pad16(key[:0], s))
	var n int64
	if old, ok := c.Get(sub); ok {
		n, _ = parseInt(old)
	} else {
		c.RegisterProcessingTimer(s + size - 1)
	}
	c.Put(sub, strconv.AppendInt(buf[:0], n+1, 10))
	return nil
}

func q12Timer(c *sdk.Context, t sdk.Timer) error {
	s := t.Time + 1 - size
	sub := string(pad16(key[:0], s))
	old, ok := c.Get(sub)
	if !ok {
		return nil
	}
	b := append(append(buf[:0], `{"bidder":`...), c.Key()...)
	b = append(append(b, `,"bid_count":`...), old...)
	b = appendInt(b, `,"starttime":`, s)
	b = appendInt(b, `,"endtime":`, s+size)
	buf = append(b, '}')
	c.Emit(c.Key(), buf, t.Time)
	c.Delete(sub)
	return nil
}

// side is q13's bounded side table: key k of [0, side_rows) has the value
// k as text, as RisingWave's Nexmark benchmark fills its side_input table.
var side [][]byte

func q13(c *sdk.Context, r sdk.Record) error {
	if ok, err := bid(r); !ok {
		return err
	}
	val := side[v.Auction%int64(len(side))]
	b := appendInt(append(buf[:0], '{'), `"auction":`, v.Auction)
	b = appendInt(b, `,"bidder":`, v.Bidder)
	b = appendInt(b, `,"price":`, v.Price)
	b = appendInt(b, `,"date_time":`, v.DateTime)
	b = appendStr(b, `,"value":`, val)
	buf = append(b, '}')
	c.Emit(r.Key, buf, r.Time)
	return nil
}

// dayRoute keys bids by UTC day (q15) or by channel and day (q16:
// "<channel>,<day>"); the value is price, bidder, auction (getInt's
// layout: the keyed stage after it is its only reader).
func dayRoute(byChannel bool) func(*sdk.Context, sdk.Record) error {
	return func(c *sdk.Context, r sdk.Record) error {
		if ok, err := bid(r); !ok {
			return err
		}
		k := key[:0]
		if byChannel {
			k = append(append(k, v.Channel...), ',')
		}
		key = appendDay(k, v.DateTime)
		buf = appendInt64(appendInt64(appendInt64(buf[:0], v.Price), v.Bidder), v.Auction)
		c.Emit(key, buf, r.Time)
		return nil
	}
}

// dayStats is q15 (per day) and q16 (per channel and day): bid counts in
// all and per price rank (below 10,000; below 1,000,000; the rest), and
// the distinct bidders and auctions in all and per rank. The twelve
// counters are the key's value (getInt's layout), and for q16 the latest
// minute (HH:mm) of the key's bids after them; each bidder and auction
// seen has a one-byte mask of the ranks it was seen in, in sets of 64 ids
// under "B<id>>6>" and "A<id>>6>" (setMask). q16 keeps a key's first ids
// in the key's value instead, after the minute (inlineIDs), and moves them
// to the sets when there are more. Every bid emits the updated row
// (Flink's upserts, without the retractions).
func dayStats(byChannel bool) func(*sdk.Context, sdk.Record) error {
	return func(c *sdk.Context, r sdk.Record) error {
		if len(r.Value) != 24 {
			return errors.New("nexmark: a value that q15_route or q16_route did not write")
		}
		price := getInt(r.Value, 0)
		var n [12]int64 // bids, r1, r2, r3; bidders, r1..r3; auctions, r1..r3
		var minute, inline []byte
		spilled := !byChannel // q15's ids are always in sets
		if old, ok := c.Get(""); ok && len(old) >= 8*len(n) {
			copy(int64Bytes(n[:]), old)
			if byChannel && len(old) >= 8*len(n)+5 {
				minute = old[8*len(n) : 8*len(n)+5]
				inline = old[8*len(n)+5:]
				spilled = len(inline) == 1 // spillMark
			}
		}
		rank := 3
		switch {
		case price < 10_000:
			rank = 1
		case price < 1_000_000:
			rank = 2
		}
		n[0]++
		n[rank]++
		ids := inlineBuf[:0]
		if !spilled {
			ids = append(ids, inline...)
			if len(ids)/inlineEntry+2 > inlineIDs {
				spill(c, ids)
				spilled, ids = true, ids[:0]
			}
		}
		for i := range 2 {
			base := 4 * (i + 1)
			id := getInt(r.Value, 1+i)
			if !spilled {
				var mask byte
				ids, mask = inlineMark(ids, i, id, 1<<rank)
				if mask == 0 {
					n[base]++
				}
				if mask&(1<<rank) == 0 {
					n[base+rank]++
				}
				continue
			}
			mask, sub, old := setMask(c, i, id)
			if mask == 0 {
				n[base]++
			}
			if mask&(1<<rank) == 0 {
				n[base+rank]++
				setPut(c, sub, old, id, mask|1<<rank)
			}
		}
		inlineBuf = ids
		k := c.Key()
		if byChannel {
			var hmBuf [8]byte
			if hm := appendHM(hmBuf[:0], r.Time); string(hm) > string(minute) {
				minute = hm
			}
		}
		b := buf[:0]
		if byChannel {
			b = append(append(b, int64Bytes(n[:])...), minute...)
			if spilled {
				b = append(b, spillMark)
			} else {
				b = append(b, ids...)
			}
			c.Put("", b)
		} else {
			c.Put("", int64Bytes(n[:])) // Put keeps a copy
		}
		b = append(b[:0], '{')
		if byChannel {
			i := indexByte(k, ',')
			b = appendStr(b, `"channel":`, k[:i])
			b = appendStr(b, `,"day":`, k[i+1:])
			b = appendStr(b, `,"minute":`, minute)
		} else {
			b = appendStr(b, `"day":`, k)
		}
		b = appendStats(b, &n)
		buf = append(b, '}')
		c.Emit(k, buf, r.Time)
		return nil
	}
}

// inlineIDs is how many bidders and auctions (together) a q16 key keeps in
// its own value, after the minute, each as inlineEntry bytes: the id (8
// bytes, little-endian) and its mask, with bit 7 set for an auction. The
// key's value comes with its input (the host reads it for every key of a
// batch), so these ids cost no read of their own; half of q16's bids are
// on the 10,000 cold channels' keys, which see few bids each, and there a
// set per id was two reads per bid of sub-keys that were not there yet,
// each a probe of every file's bloom filter (docs/bench/nexmark-speed.md).
// A key with more ids moves them to the sets (spill) and keeps spillMark
// after the minute instead: the hot channels' keys, whose bids share sets.
// 128 holds a cold key's ids for up to 64 bids (about 1.4 million events of
// one day); with 64 they spilled after about 30, and q16 at a million
// events measured 5.6x slower.
const (
	inlineIDs   = 128
	inlineEntry = 9
	spillMark   = '!'
)

// inlineBuf holds the ids dayStats reads from a key's value and writes
// back: it is copied into the value before the next bid.
var inlineBuf []byte

// inlineMark finds id of kind i (0 bidder, 1 auction) in the inline ids
// and returns them with m added to its mask, the entry appended if new, and
// the mask it had (0: not seen).
func inlineMark(ids []byte, i int, id int64, m byte) ([]byte, byte) {
	kind := byte(i) << 7
	for j := 0; j+inlineEntry <= len(ids); j += inlineEntry {
		if ids[j+8]&0x80 == kind && getInt(ids[j:], 0) == id {
			old := ids[j+8] &^ 0x80
			ids[j+8] |= m
			return ids, old
		}
	}
	return append(appendInt64(ids, id), kind|m), 0
}

// spill writes a key's inline ids into their sets. A key spills once, and
// before it no set of it was written, so the sets are new: built here
// without a read.
func spill(c *sdk.Context, ids []byte) {
	type set struct {
		i    int
		n    int64 // id >> 6
		mask [setSize]byte
	}
	var sets []set
	for j := 0; j+inlineEntry <= len(ids); j += inlineEntry {
		i, id := int(ids[j+8]>>7), getInt(ids[j:], 0)
		k := len(sets)
		for x := range sets {
			if sets[x].i == i && sets[x].n == id>>6 {
				k = x
				break
			}
		}
		if k == len(sets) {
			sets = append(sets, set{i: i, n: id >> 6})
		}
		sets[k].mask[id&(setSize-1)] = ids[j+8] &^ 0x80
	}
	for x := range sets {
		var name [24]byte
		sub := appendDec(append(name[:0], "BA"[sets[x].i]), sets[x].n)
		c.Put(string(sub), sets[x].mask[:])
	}
}

// setSize is how many ids of q15's and q16's distinct bidders (i 0) or
// auctions (i 1) share a sub-key: "B<id>>6>" or "A<id>>6>" holds one byte
// per id of the 64 ids id&^63 .. id|63, the mask of the ranks the id was seen in (0:
// not seen; a seen id has a rank). The generator's bids go to recent
// bidders and auctions, so one batch of bids reads a few such sub-keys
// where one per id was a host call (and a state read) for most of its
// distinct ids. q16's keys use them once their ids outgrow the key's value
// (inlineIDs).
const setSize = 64

// setBuf holds the names setMask returns, one per set: a name is read by
// the SDK's Get and Put only during the call (Put keeps a copy), so the
// next bid may write over it.
var setBuf [2][24]byte

// setMask reads the mask of id in set i: the mask, the set's sub-key and its
// value (nil when absent).
func setMask(c *sdk.Context, i int, id int64) (byte, string, []byte) {
	b := appendDec(append(setBuf[i][:0], "BA"[i]), id>>6)
	sub := unsafe.String(unsafe.SliceData(b), len(b))
	old, ok := c.Get(sub)
	if !ok || len(old) != setSize {
		return 0, sub, nil
	}
	return old[id&(setSize-1)], sub, old
}

// setPut writes the set old (nil: a new one) with id's mask m.
func setPut(c *sdk.Context, sub string, old []byte, id int64, m byte) {
	var s [setSize]byte
	copy(s[:], old)
	s[id&(setSize-1)] = m
	c.Put(sub, s[:])
}

// int64Bytes is n's memory, which is getInt's and appendInt64's layout
// (WebAssembly is little endian): dayStats reads and writes its twelve
// counters with one copy, where a getInt or appendInt64 each is a call each
// in this guest.
func int64Bytes(n []int64) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(n))), 8*len(n))
}

// appendStats appends the twelve counters of dayStats' row, each as
// `,"name":value`. The counters' text is kept from the row it was last
// written in (statRow) and reused while the values stay: of the twelve, a
// bid changes two (the bids in all and of its rank) and seldom a bidder or
// auction count, each by one, and in this guest formatting a number costs
// several times the copy of its text. A counter one more than its text is
// incremented in the text, in place, unless its digits are all nines; any
// other change writes the text anew.
func appendStats(b []byte, n *[12]int64) []byte {
	r := &statRow
	if r.ok {
		for i := range n {
			if r.n[i] == n[i] {
				continue
			}
			if r.n[i] < 0 || n[i] != r.n[i]+1 || !incDec(r.text[r.start[i]:r.end[i]]) {
				r.ok = false
				break
			}
			r.n[i] = n[i]
		}
	}
	if !r.ok {
		t := r.text[:0]
		for i := range n {
			t = append(t, statNames[i]...)
			r.start[i] = len(t)
			t = appendDec(t, n[i])
			r.end[i] = len(t)
		}
		r.text, r.n, r.ok = t, *n, true
	}
	return append(b, r.text...)
}

// incDec adds one to the non-negative decimal d in place, unless its
// digits are all nines (the sum is a digit longer): then it reports false
// and d is left with zeros.
func incDec(d []byte) bool {
	for i := len(d) - 1; i >= 0; i-- {
		if d[i] != '9' {
			d[i]++
			return true
		}
		d[i] = '0'
	}
	return false
}

// statRow is the counters' text appendStats wrote last: their values, and
// where each one's digits are in text.
var statRow struct {
	text       []byte
	n          [12]int64
	start, end [12]int
	ok         bool
}

var statNames = [12]string{
	`,"total_bids":`, `,"rank1_bids":`, `,"rank2_bids":`, `,"rank3_bids":`,
	`,"total_bidders":`, `,"rank1_bidders":`, `,"rank2_bidders":`, `,"rank3_bidders":`,
	`,"total_auctions":`, `,"rank1_auctions":`, `,"rank2_auctions":`, `,"rank3_auctions":`,
}

// q18Route keys every bid by "<bidder>,<auction>" with its output row as
// the value (the keyed stage compares only times).
func q18Route(c *sdk.Context, r sdk.Record) error {
	if ok, err := bid(r); !ok {
		return err
	}
	key = strconv.AppendInt(append(strconv.AppendInt(key[:0], v.Bidder, 10), ','), v.Auction, 10)
	b := appendInt(append(buf[:0], '{'), `"auction":`, v.Auction)
	b = appendInt(b, `,"bidder":`, v.Bidder)
	b = appendInt(b, `,"price":`, v.Price)
	b = appendStr(b, `,"channel":`, v.Channel)
	b = appendStr(b, `,"url":`, v.URL)
	b = appendInt(b, `,"date_time":`, v.DateTime)
	b = appendStr(b, `,"extra":`, v.Extra)
	buf = append(b, '}')
	c.Emit(key, buf, r.Time)
	return nil
}

// q18: per bidder and auction (the key), the time of its last bid as the
// key's value (getInt's layout: the key's own value, which the host hands
// over with the input, where a sub-key would be one more read per bid); a bid at or after it is the new last bid: it is
// emitted and its time kept (Flink's deduplication keeping the last row by
// event time).
func q18(c *sdk.Context, r sdk.Record) error {
	if old, ok := c.Get(""); ok && len(old) == 8 && r.Time < getInt(old, 0) {
		return nil
	}
	var t [8]byte
	c.Put("", appendInt64(t[:0], r.Time))
	c.Emit(c.Key(), r.Value, r.Time)
	return nil
}
