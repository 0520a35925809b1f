//go:build wasip1

// Command nexmark holds the operators of the Nexmark queries
// (examples/nexmark): one module, whose config {"op": NAME, ...} picks the
// operator a stage runs, so a job of several stages compiles one module.
// Every operator reads the JSON events of the nexmark package (a generated
// input, or `cairn nexmark gen`'s stream) or the values of the stage before
// it, and writes JSON objects. Windows are event-time windows that fire when
// the watermark passes their end, as Flink's do.
//
// Stateless operators (a stage without keyed: true):
//
//	q0         every bid, unchanged (a pass-through)
//	q1         every bid with its price in euros: price × 908 / 1000, in cents
//	q2         the bids on auctions whose id is a multiple of 123: auction, price
//	q3_route   persons of OR, ID and CA keyed by id; auctions of category 10 keyed by seller
//	window_route  bids under one key ("all"): q5 and q7 look at every bid of a window
//	q8_route   persons keyed by id, auctions keyed by seller
//	q11_route  bids keyed by bidder
//	q14        bids priced between 1,000,000 and 50,000,000 euro cents: the euro price, the time of day, the count of 'c' in extra
//	q21        bids from a hot channel or with a channel_id in their URL: the channel's id
//	q22        every bid with its URL's first three directories
//	q10        every bid with its partition (dt/hm, a file sink's directories) as key
//	q13        every bid with the value of its auction mod side_rows in a bounded side table
//	q15_route  bids keyed by UTC day
//	q16_route  bids keyed by channel and UTC day
//	q18_route  bids keyed by bidder and auction
//
// Keyed operators:
//
//	q3_join    persons ⋈ auctions on id = seller (no window: both sides kept)
//	q5         the auctions with the most bids per sliding window (size_ms, slide_ms)
//	q7         the bids with the highest price per tumbling window (size_ms)
//	q8         persons who put up an auction in the tumbling window (size_ms) they registered in
//	q9         per auction (the input's key), its highest bid between its start and its expiry, at its expiry
//	q11        per bidder, its session windows (gap_ms): bids, start, end
//	q17        per auction and day, bid statistics, updated on every bid
//	q19        per auction, its ten highest bids, on every bid that enters them
//	q20        bids ⋈ auctions of category 10 on auction = id (no window)
//	q4_max     per auction, its highest bid at its expiry, keyed by category
//	q4         per category, the average closing price, on every closing
//	q6_max     per auction, its highest bid at its expiry, keyed by seller
//	q6         per seller, the average of its last ten closing prices, on every closing
//	q12        per bidder, its bids per tumbling window (size_ms) of processing time
//	q15        per day, bid, bidder and auction counts (distinct) per price rank
//	q16        per channel and day, the same and the latest minute
//	q18        per bidder and auction, its last bid
package main

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"math"
	"math/bits"
	"slices"
	"sort"
	"strconv"
	"strings"

	"cairn/nexmark"
	"cairn/operators/sdk"
	"cairn/operators/sdk/upgrade"
)

func main() {}

var (
	size  int64 = 10_000
	slide int64 = 2_000
	gap   int64 = 10_000
	v     nexmark.View
	buf   []byte
	key   []byte
)

func init() {
	var c struct {
		Op      string `json:"op"`
		SizeMS  int64  `json:"size_ms"`
		SlideMS int64  `json:"slide_ms"`
		GapMS   int64  `json:"gap_ms"`
		// SideRows is the size of q13's side table (default 10,000).
		SideRows int `json:"side_rows"`
	}
	if cfg := sdk.Config(); len(cfg) > 0 {
		if err := json.Unmarshal(cfg, &c); err != nil {
			panic("nexmark: bad config: " + err.Error())
		}
	}
	if c.SizeMS < 0 || c.SlideMS < 0 {
		panic("nexmark: size_ms and slide_ms must be positive")
	}
	if c.SizeMS > 0 {
		size = c.SizeMS
	}
	if c.SlideMS > 0 {
		slide = c.SlideMS
	}
	if c.GapMS < 0 {
		panic("nexmark: gap_ms must be positive")
	}
	if c.GapMS > 0 {
		gap = c.GapMS
	}
	if size%slide != 0 {
		panic("nexmark: slide_ms must divide size_ms")
	}
	if c.SideRows < 0 {
		panic("nexmark: side_rows must be positive")
	}
	if c.Op == "q13" {
		rows := c.SideRows
		if rows == 0 {
			rows = 10_000
		}
		side = make([][]byte, rows)
		for k := range side {
			side[k] = strconv.AppendInt(nil, int64(k), 10)
		}
	}
	ops := map[string]sdk.Operator{
		"q0":           {OnRecord: q0},
		"q1":           {OnRecord: q1},
		"q2":           {OnRecord: q2},
		"q3_route":     {OnRecord: q3Route},
		"q3_join":      {OnRecord: q3Join},
		"window_route": {OnRecord: windowRoute},
		"q5":           {OnRecord: q5Record, OnTimer: q5Timer},
		"q7":           {OnRecord: q7Record, OnTimer: q7Timer},
		"q8_route":     {OnRecord: q8Route},
		"q8":           {OnRecord: q8Record, OnTimer: q8Timer},
		"q9":           {OnRecord: q9Record, OnTimer: q9Timer},
		"q11_route":    {OnRecord: q11Route},
		"q11":          {OnRecord: q11Record, OnTimer: q11Timer},
		"q14":          {OnRecord: q14},
		"q17":          {OnRecord: q17},
		"q19":          {OnRecord: q19},
		"q20":          {OnRecord: q20},
		"q21":          {OnRecord: q21},
		"q22":          {OnRecord: q22},
		"q4_max":       {OnRecord: auctionMax(byCategory), OnTimer: auctionMaxTimer},
		"q4":           {OnRecord: orderedRecord, OnTimer: q4Timer},
		"q6_max":       {OnRecord: auctionMax(bySeller), OnTimer: auctionMaxTimer},
		"q6":           {OnRecord: orderedRecord, OnTimer: q6Timer},
		"q10":          {OnRecord: q10},
		"q12":          {OnRecord: q12Record, OnTimer: q12Timer},
		"q13":          {OnRecord: q13},
		"q15_route":    {OnRecord: dayRoute(false)},
		"q15":          {OnRecord: dayStats(false)},
		"q16_route":    {OnRecord: dayRoute(true)},
		"q16":          {OnRecord: dayStats(true)},
		"q18_route":    {OnRecord: q18Route},
		"q18":          {OnRecord: q18},
	}
	op, ok := ops[c.Op]
	if !ok {
		names := make([]string, 0, len(ops))
		for n := range ops {
			names = append(names, n)
		}
		sort.Strings(names)
		panic("nexmark: config \"op\" is " + strconv.Quote(c.Op) + ", want one of " + strconv.Quote(names[0]) + " ... " + strconv.Quote(names[len(names)-1]))
	}
	// State version 1: q4's, q6's and q15-q19's state holds integers as 8
	// bytes and their rows in the key's own value, where version 0 (the
	// operators before, declaring nothing) held decimal text under
	// sub-keys. A job refuses to restore version 0's state with this
	// module rather than misread it. Version 2, declared by the q15 and q16
	// stages only: their distinct bidders and auctions in sets of 64 ids
	// per sub-key (more.go's setMask), where version 1 had one sub-key per
	// id (q16 moved to it later than q15). A version is checked per stage,
	// so the other queries' checkpoints of version 1 still restore with
	// this module; only q15's and q16's are refused.
	version := 1
	if c.Op == "q15" || c.Op == "q16" {
		version = 2
	}
	upgrade.StateVersion(version)
	sdk.Register(op)
}

// decode decodes a record's event; a record that is not one is the
// record's failure (a dead letter naming the reason).
func decode(r sdk.Record) error { return v.Decode(r.Value) }

// bid decodes r's event when it is a bid, the way of AppendJSON's layout
// first (without the kind test and the zeroing of Decode): false and nil
// for a person or an auction, left undecoded; an error for a record that
// is not an event (a dead letter naming the reason).
func bid(r sdk.Record) (bool, error) {
	if v.DecodeBid(r.Value) {
		return true, nil
	}
	k, err := kind(r)
	if k != nexmark.KindBid {
		return false, err
	}
	return true, decode(r)
}

// kind is the kind of a record's event; a record that is not an event
// fails (a dead letter naming the reason).
func kind(r sdk.Record) (nexmark.Kind, error) {
	k, ok := nexmark.KindOfRecord(r.Value)
	if !ok {
		// Not in AppendJSON's layout: decode it (the error says what is
		// wrong with it).
		if err := v.Decode(r.Value); err != nil {
			return 0, err
		}
		return v.Kind, nil
	}
	return k, nil
}

func q0(c *sdk.Context, r sdk.Record) error {
	if k, err := kind(r); k != nexmark.KindBid {
		return err
	}
	c.Emit(r.Key, r.Value, r.Time)
	return nil
}

func q1(c *sdk.Context, r sdk.Record) error {
	if ok, err := bid(r); !ok {
		return err
	}
	b := appendInt(append(buf[:0], '{'), `"auction":`, v.Auction)
	b = appendInt(b, `,"bidder":`, v.Bidder)
	b = appendInt(b, `,"price":`, v.Price*908/1000)
	b = appendInt(b, `,"date_time":`, v.DateTime)
	b = appendStr(b, `,"extra":`, v.Extra)
	buf = append(b, '}')
	c.Emit(r.Key, buf, r.Time)
	return nil
}

func q2(c *sdk.Context, r sdk.Record) error {
	if ok, err := bid(r); !ok {
		return err
	}
	if v.Auction%123 != 0 {
		return nil
	}
	b := appendInt(append(buf[:0], '{'), `"auction":`, v.Auction)
	b = appendInt(b, `,"price":`, v.Price)
	buf = append(b, '}')
	c.Emit(r.Key, buf, r.Time)
	return nil
}

// q3Route keys the persons of three states by id and the auctions of
// category 10 by seller. Values: "P" name \0 city \0 state, or "A" id.
func q3Route(c *sdk.Context, r sdk.Record) error {
	k, err := kind(r)
	if err != nil || k == nexmark.KindBid {
		return err
	}
	if err := decode(r); err != nil {
		return err
	}
	switch k {
	case nexmark.KindPerson:
		if s := string(v.State); s != "OR" && s != "ID" && s != "CA" {
			return nil
		}
		b := append(append(buf[:0], 'P'), v.Name...)
		b = append(append(b, 0), v.City...)
		buf = append(append(b, 0), v.State...)
		c.Emit(strconv.AppendInt(key[:0], v.ID, 10), buf, r.Time)
	case nexmark.KindAuction:
		if v.Category != 10 {
			return nil
		}
		buf = strconv.AppendInt(append(buf[:0], 'A'), v.ID, 10)
		c.Emit(strconv.AppendInt(key[:0], v.Seller, 10), buf, r.Time)
	}
	return nil
}

// q3Join is a regular (unwindowed) join: the person under sub-key "p",
// the auctions that came before their seller under "a" (ids, comma
// separated) until it comes. Each match emits name, city, state and the
// auction's id when its second side arrives.
func q3Join(c *sdk.Context, r sdk.Record) error {
	if len(r.Value) == 0 {
		return errors.New("nexmark: q3_join: empty value")
	}
	switch r.Value[0] {
	case 'P':
		person := r.Value[1:]
		c.Put("p", person)
		if ids, ok := c.Get("a"); ok {
			for _, id := range splitComma(ids) {
				n, _ := parseInt(id)
				q3Emit(c, person, n, r.Time)
			}
			c.Delete("a")
		}
	case 'A':
		id, err := parseInt(r.Value[1:])
		if err != nil {
			return errors.New("nexmark: q3_join: bad auction id")
		}
		if person, ok := c.Get("p"); ok {
			q3Emit(c, person, id, r.Time)
			return nil
		}
		ids, _ := c.Get("a")
		b := append(buf[:0], ids...)
		if len(b) > 0 {
			b = append(b, ',')
		}
		buf = strconv.AppendInt(b, id, 10)
		c.Put("a", buf)
	default:
		return errors.New("nexmark: q3_join: a value that q3_route did not write")
	}
	return nil
}

func q3Emit(c *sdk.Context, person []byte, id int64, t int64) {
	f := splitZero(person)
	if len(f) != 3 {
		return
	}
	b := appendStr(append(buf[:0], '{'), `"name":`, f[0])
	b = appendStr(b, `,"city":`, f[1])
	b = appendStr(b, `,"state":`, f[2])
	b = appendInt(b, `,"id":`, id)
	out := append(b, '}')
	c.Emit(c.Key(), out, t)
}

// windowRoute puts every bid under one key: q5's and q7's windows are
// over all bids. The value is "<price>|<auction>|<record>".
func windowRoute(c *sdk.Context, r sdk.Record) error {
	if ok, err := bid(r); !ok {
		return err
	}
	b := append(strconv.AppendInt(buf[:0], v.Price, 10), '|')
	b = append(strconv.AppendInt(b, v.Auction, 10), '|')
	buf = append(b, r.Value...)
	c.Emit(allKey, buf, r.Time)
	return nil
}

var allKey = []byte("all")

// q5: the count of bids per auction and slide under sub-key
// "<slide start, 16 digits>/<auction>", and under "f" the start of the last
// window fired. A record whose (slide, auction) is new registers the timer
// of the first window that holds its slide. A timer fires every window that
// holds data and whose end the watermark passed (timers the handler
// registers fire only with a later watermark, so it does not leave them to
// fire), oldest first: each emits its auctions with the most bids, then the
// slides no later window holds are dropped and the next window's timer set.
func q5Record(c *sdk.Context, r sdk.Record) error {
	_, auction, _, err := splitRoute(r.Value)
	if err != nil {
		return err
	}
	s := floorDiv(r.Time, slide) * slide
	sub := string(append(append(pad16(buf[:0], s), '/'), auction...))
	var n uint64
	old, ok := c.Get(sub)
	if ok {
		n, _ = parseUint(old)
	} else {
		c.RegisterEventTimer(s + slide - 1)
	}
	c.Put(sub, strconv.AppendUint(buf[:0], n+1, 10))
	return nil
}

type slideCounts struct {
	start  int64
	counts map[string]uint64
	subs   []string
}

func q5Timer(c *sdk.Context, t sdk.Timer) error {
	wm := max(t.Time, c.Watermark())
	fired := int64(math.MinInt64)
	if f, ok := c.Get("f"); ok {
		fired, _ = parseInt(f)
	}
	var slides []*slideCounts // ascending: Scan is in sub-key order
	c.Scan("", func(sub string, val []byte) bool {
		if len(sub) < 18 || sub[16] != '/' {
			return true
		}
		st, err := strconv.ParseInt(sub[:16], 10, 64)
		if err != nil {
			return true
		}
		if len(slides) == 0 || slides[len(slides)-1].start != st {
			slides = append(slides, &slideCounts{start: st, counts: map[string]uint64{}})
		}
		n, _ := parseUint(val)
		sc := slides[len(slides)-1]
		sc.counts[sub[17:]] += n
		sc.subs = append(sc.subs, sub)
		return true
	})
	for len(slides) > 0 {
		w := slides[0].start - size + slide // the first window holding data
		if fired != math.MinInt64 {
			w = max(w, fired+slide)
		}
		if w+size-1 > wm {
			c.RegisterEventTimer(w + size - 1)
			break
		}
		counts := map[string]uint64{}
		var best uint64
		for _, sc := range slides {
			if sc.start >= w+size {
				break
			}
			for a, n := range sc.counts {
				counts[a] += n
				best = max(best, counts[a])
			}
		}
		var top []string
		for a, n := range counts {
			if n == best {
				top = append(top, a)
			}
		}
		sort.Strings(top)
		for _, a := range top {
			b := append(append(append(buf[:0], `{"auction":`...), a...), `,"num":`...)
			b = strconv.AppendUint(b, best, 10)
			b = appendInt(b, `,"window_start":`, w)
			b = appendInt(b, `,"window_end":`, w+size)
			buf = append(b, '}')
			c.Emit([]byte(a), buf, w+size-1)
		}
		fired = w
		for len(slides) > 0 && slides[0].start < w+slide {
			for _, sub := range slides[0].subs {
				c.Delete(sub)
			}
			slides = slides[1:]
		}
	}
	c.Put("f", strconv.AppendInt(buf[:0], fired, 10))
	return nil
}

// q7: per window, under sub-key "<window start, 16 digits>", the highest
// price so far and the bids at that price: "<price>\n<bid>\n<bid>...".
// The window's timer emits its bids (auction, price, bidder, date_time,
// extra) and drops the window.
func q7Record(c *sdk.Context, r sdk.Record) error {
	price, _, rec, err := splitRoute(r.Value)
	if err != nil {
		return err
	}
	s := floorDiv(r.Time, size) * size
	sub := string(pad16(key[:0], s))
	old, ok := c.Get(sub)
	var best int64 = -1
	if ok {
		nl := indexByte(old, '\n')
		best, _ = parseInt(old[:nl])
	} else {
		c.RegisterEventTimer(s + size - 1)
	}
	if price < best {
		return nil
	}
	if err := v.Decode(rec); err != nil {
		return err
	}
	var b []byte
	if price > best || !ok {
		b = strconv.AppendInt(buf[:0], price, 10)
	} else {
		b = append(buf[:0], old...)
	}
	b = append(b, '\n')
	b = appendInt(append(b, '{'), `"auction":`, v.Auction)
	b = appendInt(b, `,"price":`, v.Price)
	b = appendInt(b, `,"bidder":`, v.Bidder)
	b = appendInt(b, `,"date_time":`, v.DateTime)
	b = appendStr(b, `,"extra":`, v.Extra)
	buf = append(b, '}')
	c.Put(sub, buf)
	return nil
}

func q7Timer(c *sdk.Context, t sdk.Timer) error {
	sub := string(pad16(key[:0], t.Time+1-size))
	val, ok := c.Get(sub)
	if !ok {
		return nil
	}
	lines := splitByte(val, '\n')
	const prefix = `{"auction":`
	for _, l := range lines[1:] {
		// The line is q7Record's: {"auction":N,...}; N is the output's key.
		end := len(prefix)
		for end < len(l) && l[end] >= '0' && l[end] <= '9' {
			end++
		}
		c.Emit(l[len(prefix):end], l, t.Time)
	}
	c.Delete(sub)
	return nil
}

// q8Route keys persons by id ("P" name) and auctions by seller ("A").
func q8Route(c *sdk.Context, r sdk.Record) error {
	k, err := kind(r)
	if err != nil || k == nexmark.KindBid {
		return err
	}
	if err := decode(r); err != nil {
		return err
	}
	if k == nexmark.KindPerson {
		buf = append(append(buf[:0], 'P'), v.Name...)
		c.Emit(strconv.AppendInt(key[:0], v.ID, 10), buf, r.Time)
		return nil
	}
	c.Emit(strconv.AppendInt(key[:0], v.Seller, 10), []byte{'A'}, r.Time)
	return nil
}

// q8: per key (a person id) and window, the person's name under
// "<start>/p" and a mark under "<start>/a" when the person sold in the
// window; the window's timer emits id, name and the window's start when
// both are there, and drops both.
func q8Record(c *sdk.Context, r sdk.Record) error {
	if len(r.Value) == 0 {
		return errors.New("nexmark: q8: empty value")
	}
	s := floorDiv(r.Time, size) * size
	b := append(pad16(buf[:0], s), '/')
	switch r.Value[0] {
	case 'P':
		c.Put(string(append(b, 'p')), r.Value[1:])
		c.RegisterEventTimer(s + size - 1)
	case 'A':
		sub := string(append(b, 'a'))
		if _, ok := c.Get(sub); !ok {
			c.Put(sub, nil)
			c.RegisterEventTimer(s + size - 1)
		}
	default:
		return errors.New("nexmark: q8: a value that q8_route did not write")
	}
	return nil
}

func q8Timer(c *sdk.Context, t sdk.Timer) error {
	s := t.Time + 1 - size
	p := string(append(pad16(buf[:0], s), "/p"...))
	a := string(append(pad16(buf[:0], s), "/a"...))
	name, okP := c.Get(p)
	_, okA := c.Get(a)
	if okP && okA {
		b := append(append(buf[:0], `{"id":`...), c.Key()...)
		b = appendStr(b, `,"name":`, name)
		b = appendInt(b, `,"starttime":`, s)
		buf = append(b, '}')
		c.Emit(c.Key(), buf, t.Time)
	}
	c.Delete(p)
	c.Delete(a)
	return nil
}

// splitRoute splits windowRoute's value into price, auction and record.
func splitRoute(val []byte) (int64, []byte, []byte, error) {
	i := indexByte(val, '|')
	if i < 0 {
		return 0, nil, nil, errors.New("nexmark: a value that window_route did not write")
	}
	j := indexByte(val[i+1:], '|')
	if j < 0 {
		return 0, nil, nil, errors.New("nexmark: a value that window_route did not write")
	}
	price, err := parseInt(val[:i])
	if err != nil {
		return 0, nil, nil, errors.New("nexmark: a value that window_route did not write")
	}
	return price, val[i+1 : i+1+j], val[i+2+j:], nil
}

func appendInt(b []byte, name string, n int64) []byte {
	return appendDec(append(b, name...), n)
}

// appendDec appends n in decimal, as strconv.AppendInt does, in one
// function: the outputs write several integers per event, and in this guest
// strconv's chain of three calls per integer costs more than the digits.
// The digits are written in place, from the last: a copy from a scratch
// array is a call of the runtime's memmove in this guest.
func appendDec(b []byte, n int64) []byte {
	u := uint64(n)
	if n < 0 {
		b = append(b, '-')
		u = -u
	}
	if u < 10 {
		return append(b, byte('0'+u))
	}
	// The digit count: log10 from the bit length, corrected by one
	// comparison (1233/4096 is just above log10(2)).
	t := bits.Len64(u) * 1233 >> 12
	if u >= pow10[t] {
		t++
	}
	if cap(b)-len(b) < t {
		b = slices.Grow(b, t)
	}
	i := len(b) + t
	b = b[:i]
	// Divisions of 32 bits: WebAssembly has no 64-bit multiply-high, so
	// a 64-bit division by a constant is a real division (or four
	// multiplications), where a 32-bit one is one multiplication and a
	// shift. A number of more than 32 bits (a time in milliseconds) gives
	// up its last eight digits to one 64-bit division per eight.
	for u >= 1<<32 {
		q := u / 100_000_000
		r := uint32(u - q*100_000_000)
		for range 4 {
			q2 := r / 100
			p := 2 * (r - q2*100)
			i -= 2
			b[i], b[i+1] = digitPairs[p], digitPairs[p+1]
			r = q2
		}
		u = q
	}
	w := uint32(u)
	for w >= 100 {
		q := w / 100
		p := 2 * (w - q*100)
		i -= 2
		b[i], b[i+1] = digitPairs[p], digitPairs[p+1]
		w = q
	}
	if w >= 10 {
		b[i-2], b[i-1] = digitPairs[2*w], digitPairs[2*w+1]
	} else {
		b[i-1] = byte('0' + w)
	}
	return b
}

// pow10[k] is 10^k: appendDec's digit count.
var pow10 = [20]uint64{1, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10,
	1e11, 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19}

const digitPairs = "00010203040506070809" +
	"10111213141516171819" +
	"20212223242526272829" +
	"30313233343536373839" +
	"40414243444546474849" +
	"50515253545556575859" +
	"60616263646566676869" +
	"70717273747576777879" +
	"80818283848586878889" +
	"90919293949596979899"

// State values of the keyed operators below hold integers as 8 bytes,
// little-endian: a read and a write are then a copy, where decimal text
// was a parse and a format of every field on every event.

func getInt(b []byte, i int) int64 { return int64(binary.LittleEndian.Uint64(b[8*i:])) }

func appendInt64(b []byte, n int64) []byte { return binary.LittleEndian.AppendUint64(b, uint64(n)) }

// appendStr appends a JSON string; the events' strings have nothing to
// escape (the decoder refuses escapes).
func appendStr(b []byte, name string, s []byte) []byte {
	b = append(append(b, name...), '"')
	return append(append(b, s...), '"')
}

func pad16(b []byte, n int64) []byte {
	var d [16]byte
	for i := 15; i >= 0; i-- {
		d[i] = byte('0' + n%10)
		n /= 10
	}
	return append(b, d[:]...)
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

func indexByte(b []byte, c byte) int {
	for i, x := range b {
		if x == c {
			return i
		}
	}
	return -1
}

func splitByte(b []byte, c byte) [][]byte {
	var out [][]byte
	for {
		i := indexByte(b, c)
		if i < 0 {
			return append(out, b)
		}
		out = append(out, b[:i])
		b = b[i+1:]
	}
}

func splitComma(b []byte) [][]byte { return splitByte(b, ',') }
func splitZero(b []byte) [][]byte  { return splitByte(b, 0) }

// q9: per auction (the key), its fields under "a" as
// "<date_time> <expires>\n<JSON fields>" and its best bid so far under "b"
// as "<price> <date_time>\n<JSON fields>". Only bids between the
// auction's start and expiry count (a bid before its auction is earlier
// than it); the highest price wins, the earlier bid on a tie. The timer at
// the expiry emits the auction with its winning bid, and drops both.
func q9Record(c *sdk.Context, r sdk.Record) error {
	k, err := kind(r)
	if err != nil || k == nexmark.KindPerson {
		return err
	}
	if err := decode(r); err != nil {
		return err
	}
	if k == nexmark.KindAuction {
		b := strconv.AppendInt(buf[:0], v.DateTime, 10)
		b = append(strconv.AppendInt(append(b, ' '), v.Expires, 10), '\n')
		b = appendInt(b, `"id":`, v.ID)
		b = appendStr(b, `,"item_name":`, v.ItemName)
		b = appendInt(b, `,"initial_bid":`, v.InitialBid)
		b = appendInt(b, `,"reserve":`, v.Reserve)
		b = appendInt(b, `,"date_time":`, v.DateTime)
		b = appendInt(b, `,"expires":`, v.Expires)
		b = appendInt(b, `,"seller":`, v.Seller)
		buf = appendInt(b, `,"category":`, v.Category)
		c.Put("a", buf)
		c.RegisterEventTimer(v.Expires)
		return nil
	}
	a, ok := c.Get("a")
	if !ok {
		return nil
	}
	start, expires, _ := twoInts(a)
	if v.DateTime < start || v.DateTime > expires {
		return nil
	}
	if old, ok := c.Get("b"); ok {
		price, dt, _ := twoInts(old)
		if v.Price < price || (v.Price == price && v.DateTime >= dt) {
			return nil
		}
	}
	b := strconv.AppendInt(buf[:0], v.Price, 10)
	b = append(strconv.AppendInt(append(b, ' '), v.DateTime, 10), '\n')
	b = appendInt(b, `,"bidder":`, v.Bidder)
	b = appendInt(b, `,"price":`, v.Price)
	buf = appendInt(b, `,"bid_date_time":`, v.DateTime)
	c.Put("b", buf)
	return nil
}

func q9Timer(c *sdk.Context, t sdk.Timer) error {
	a, okA := c.Get("a")
	bid, okB := c.Get("b")
	if okA && okB {
		b := append(append(buf[:0], '{'), afterLine(a)...)
		b = append(b, afterLine(bid)...)
		buf = append(b, '}')
		c.Emit(c.Key(), buf, t.Time)
	}
	c.Delete("a")
	c.Delete("b")
	return nil
}

// twoInts reads "<a> <b>\n..." (q9's state values).
func twoInts(v []byte) (int64, int64, bool) {
	sp := indexByte(v, ' ')
	nl := indexByte(v, '\n')
	if sp < 0 || nl < sp {
		return 0, 0, false
	}
	a, err1 := parseInt(v[:sp])
	b, err2 := parseInt(v[sp+1 : nl])
	return a, b, err1 == nil && err2 == nil
}

func afterLine(v []byte) []byte {
	if i := indexByte(v, '\n'); i >= 0 {
		return v[i+1:]
	}
	return nil
}

// q11Route keys bids by bidder (the value is empty: a session counts).
func q11Route(c *sdk.Context, r sdk.Record) error {
	if ok, err := bid(r); !ok {
		return err
	}
	c.Emit(strconv.AppendInt(key[:0], v.Bidder, 10), nil, r.Time)
	return nil
}

// q11: per bidder, its open session under "s" as "start,last,count". A
// bid less than gap_ms after the last extends it; a later one first emits
// the session it ends. A new session registers a timer at its end as it
// stands (start + gap - 1); when it fires and the session has grown, the
// handler emits it if the watermark has passed its end by now, else moves
// the timer there: one timer per gap and bidder, not one per bid (each
// timer is a write, and a fired one a tombstone later scans step over). A
// session is emitted as bidder, bid_count, starttime, endtime (last + gap,
// Flink's session end) at endtime - 1.
func q11Record(c *sdk.Context, r sdk.Record) error {
	t := r.Time
	start, last, n := int64(0), int64(0), int64(0)
	if old, ok := c.Get("s"); ok {
		start, last, n = threeInts(old)
		if t >= last+gap {
			q11Emit(c, start, last, n)
			n = 0
		}
	}
	if n == 0 {
		start = t
		c.RegisterEventTimer(t + gap - 1)
	}
	last = max(last, t)
	n++
	b := append(strconv.AppendInt(buf[:0], start, 10), ',')
	b = append(strconv.AppendInt(b, last, 10), ',')
	buf = strconv.AppendInt(b, n, 10)
	c.Put("s", buf)
	return nil
}

func q11Timer(c *sdk.Context, t sdk.Timer) error {
	old, ok := c.Get("s")
	if !ok {
		return nil
	}
	start, last, n := threeInts(old)
	if end := last + gap - 1; end > max(t.Time, c.Watermark()) {
		if end > t.Time {
			c.RegisterEventTimer(end) // the session grew since
		}
		return nil
	}
	q11Emit(c, start, last, n)
	c.Delete("s")
	return nil
}

func q11Emit(c *sdk.Context, start, last, n int64) {
	b := append(append(buf[:0], `{"bidder":`...), c.Key()...)
	b = appendInt(b, `,"bid_count":`, n)
	b = appendInt(b, `,"starttime":`, start)
	b = appendInt(b, `,"endtime":`, last+gap)
	buf = append(b, '}')
	c.Emit(c.Key(), buf, last+gap-1)
}

func threeInts(v []byte) (a, b, c int64) {
	var f [3]int64
	if parseInts(v, ',', f[:]) != 3 {
		return 0, 0, 0
	}
	return f[0], f[1], f[2]
}

// q14 filters on the euro price (price × 0.908, compared exactly in
// thousandths) and adds the time of day (UTC hours) and a count.
func q14(c *sdk.Context, r sdk.Record) error {
	if ok, err := bid(r); !ok {
		return err
	}
	if m := v.Price * 908; m <= 1_000_000_000 || m >= 50_000_000_000 {
		return nil
	}
	h := v.DateTime / 3_600_000 % 24
	typ := "otherTime"
	switch {
	case h >= 8 && h <= 18:
		typ = "dayTime"
	case h <= 6 || h >= 20:
		typ = "nightTime"
	}
	n := int64(0)
	for _, ch := range v.Extra {
		if ch == 'c' {
			n++
		}
	}
	b := appendInt(append(buf[:0], '{'), `"auction":`, v.Auction)
	b = appendInt(b, `,"bidder":`, v.Bidder)
	b = appendInt(b, `,"price":`, v.Price*908/1000)
	b = append(append(append(b, `,"bid_time_type":"`...), typ...), '"')
	b = appendInt(b, `,"date_time":`, v.DateTime)
	b = appendStr(b, `,"extra":`, v.Extra)
	b = appendInt(b, `,"c_counts":`, n)
	buf = append(b, '}')
	c.Emit(r.Key, buf, r.Time)
	return nil
}

// q17: per auction (the key) and UTC day, the row total, rank1, rank2,
// rank3, min, max, sum (getInt's layout); every bid emits the updated row
// (avg_price is sum / total in integer arithmetic, as Flink's AVG of a
// BIGINT). The row of the latest day the auction had a bid on is the key's
// value, followed by that day ("2006-01-02"); the row of an earlier day is
// under the sub-key of its day, where it moves when a later day begins. So
// a bid in the latest day, nearly every bid, reads the key's value, which
// the host hands over with the input: a sub-key per day would be one more
// read per bid.
func q17(c *sdk.Context, r sdk.Record) error {
	if ok, err := bid(r); !ok {
		return err
	}
	const rowLen = 56
	var dayBuf [16]byte
	dayB := appendDay(dayBuf[:0], v.DateTime)
	var f [7]int64
	latest := true // the bid's day is the latest: its row is the key's value
	cur, ok := c.Get("")
	switch {
	case !ok || len(cur) <= rowLen:
	case string(cur[rowLen:]) == string(dayB):
		for i := range f {
			f[i] = getInt(cur, i)
		}
	case string(dayB) > string(cur[rowLen:]):
		// A later day begins: the latest day's row moves under its day.
		c.Put(string(cur[rowLen:]), cur[:rowLen])
	default:
		latest = false
		if old, ok := c.Get(string(dayB)); ok && len(old) == rowLen {
			for i := range f {
				f[i] = getInt(old, i)
			}
		}
	}
	p := v.Price
	if f[0] == 0 {
		f[4], f[5] = p, p
	}
	f[0]++
	switch {
	case p < 10_000:
		f[1]++
	case p < 1_000_000:
		f[2]++
	default:
		f[3]++
	}
	f[4], f[5], f[6] = min(f[4], p), max(f[5], p), f[6]+p
	b := buf[:0]
	for _, x := range f {
		b = appendInt64(b, x)
	}
	if latest {
		c.Put("", append(b, dayB...))
	} else {
		c.Put(string(dayB), b)
	}
	b = appendInt(append(b[:0], '{'), `"auction":`, v.Auction)
	b = append(append(append(b, `,"day":"`...), dayB...), '"')
	b = appendInt(b, `,"total_bids":`, f[0])
	b = appendInt(b, `,"rank1_bids":`, f[1])
	b = appendInt(b, `,"rank2_bids":`, f[2])
	b = appendInt(b, `,"rank3_bids":`, f[3])
	b = appendInt(b, `,"min_price":`, f[4])
	b = appendInt(b, `,"max_price":`, f[5])
	b = appendInt(b, `,"avg_price":`, f[6]/f[0])
	b = appendInt(b, `,"sum_price":`, f[6])
	buf = append(b, '}')
	c.Emit(r.Key, buf, r.Time)
	return nil
}

// q19: per auction (the key), its ten highest bids as the key's value,
// highest first, each as price, date_time, bidder (getInt's layout, 24 bytes a bid;
// an equal price ranks below the bids already there, so a bid equal to the
// tenth does not enter). A bid that enters emits the auction's new top ten.
func q19(c *sdk.Context, r sdk.Record) error {
	if ok, err := bid(r); !ok {
		return err
	}
	const entry = 24
	old, _ := c.Get("")
	n := len(old) / entry
	pos := n
	for i := 0; i < n; i++ {
		if v.Price > getInt(old, 3*i) {
			pos = i
			break
		}
	}
	if pos >= 10 {
		return nil
	}
	b := append(buf[:0], old[:pos*entry]...)
	b = appendInt64(appendInt64(appendInt64(b, v.Price), v.DateTime), v.Bidder)
	b = append(b, old[pos*entry:min(n, 9)*entry]...)
	c.Put("", b)
	top := b
	b = appendInt(append(b[len(b):], '{'), `"auction":`, v.Auction)
	b = append(b, `,"top":[`...)
	for i := 0; i < len(top)/entry; i++ {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendInt(b, `{"price":`, getInt(top, 3*i))
		b = appendInt(b, `,"date_time":`, getInt(top, 3*i+1))
		b = appendInt(b, `,"bidder":`, getInt(top, 3*i+2))
		b = append(b, '}')
	}
	b = append(b, "]}"...)
	c.Emit(r.Key, b, r.Time)
	buf = top[:0]
	return nil
}

// q20: per auction (the key), its fields under "a" when of category 10
// (empty when of another), and the bids that came before it under "p"
// (their fields, one per line). A bid of a known auction of category 10
// emits the pair at once; the auction's arrival emits the bids waiting.
func q20(c *sdk.Context, r sdk.Record) error {
	k, err := kind(r)
	if err != nil || k == nexmark.KindPerson {
		return err
	}
	if err := decode(r); err != nil {
		return err
	}
	if k == nexmark.KindAuction {
		if v.Category != 10 {
			c.Put("a", nil)
			c.Delete("p")
			return nil
		}
		b := appendStr(buf[:0], `,"item_name":`, v.ItemName)
		b = appendStr(b, `,"description":`, v.Description)
		b = appendInt(b, `,"initial_bid":`, v.InitialBid)
		b = appendInt(b, `,"reserve":`, v.Reserve)
		b = appendInt(b, `,"a_date_time":`, v.DateTime)
		b = appendInt(b, `,"expires":`, v.Expires)
		b = appendInt(b, `,"seller":`, v.Seller)
		b = appendInt(b, `,"category":`, v.Category)
		a := appendStr(b, `,"a_extra":`, v.Extra)
		c.Put("a", a)
		if pending, ok := c.Get("p"); ok {
			for _, bid := range splitByte(pending, '\n') {
				out := append(append(append([]byte{'{'}, bid...), a...), '}')
				c.Emit(r.Key, out, r.Time)
			}
			c.Delete("p")
		}
		buf = a
		return nil
	}
	a, known := c.Get("a")
	if known && len(a) == 0 {
		return nil // an auction of another category
	}
	b := appendInt(buf[:0], `"auction":`, v.Auction)
	b = appendInt(b, `,"bidder":`, v.Bidder)
	b = appendInt(b, `,"price":`, v.Price)
	b = appendStr(b, `,"channel":`, v.Channel)
	b = appendStr(b, `,"url":`, v.URL)
	b = appendInt(b, `,"date_time":`, v.DateTime)
	b = appendStr(b, `,"extra":`, v.Extra)
	buf = b
	if known {
		out := append(append(append([]byte{'{'}, b...), a...), '}')
		c.Emit(r.Key, out, r.Time)
		return nil
	}
	pending, _ := c.Get("p")
	p := append([]byte(nil), pending...)
	if len(p) > 0 {
		p = append(p, '\n')
	}
	c.Put("p", append(p, b...))
	return nil
}

// q21 keeps the bids of a hot channel or with a channel_id parameter in
// their URL, with the channel's id: 0 to 3 for the hot channels, else the
// parameter (Flink's REGEXP_EXTRACT(url, '(&|^)channel_id=([^&]*)', 2)).
func q21(c *sdk.Context, r sdk.Record) error {
	if ok, err := bid(r); !ok {
		return err
	}
	var id []byte
	switch strings.ToLower(string(v.Channel)) {
	case "apple":
		id = []byte("0")
	case "google":
		id = []byte("1")
	case "facebook":
		id = []byte("2")
	case "baidu":
		id = []byte("3")
	default:
		var ok bool
		if id, ok = channelID(v.URL); !ok {
			return nil
		}
	}
	b := appendInt(append(buf[:0], '{'), `"auction":`, v.Auction)
	b = appendInt(b, `,"bidder":`, v.Bidder)
	b = appendInt(b, `,"price":`, v.Price)
	b = appendStr(b, `,"channel":`, v.Channel)
	b = appendStr(b, `,"channel_id":`, id)
	buf = append(b, '}')
	c.Emit(r.Key, buf, r.Time)
	return nil
}

// channelID is the value of the first channel_id= at the start of url or
// after a '&', up to the next '&'.
func channelID(url []byte) ([]byte, bool) {
	const p = "channel_id="
	for i := 0; i+len(p) <= len(url); i++ {
		if string(url[i:i+len(p)]) == p && (i == 0 || url[i-1] == '&') {
			rest := url[i+len(p):]
			if j := indexByte(rest, '&'); j >= 0 {
				rest = rest[:j]
			}
			return rest, true
		}
	}
	return nil, false
}

// q22 splits every bid's URL at '/': its parts 3, 4 and 5 (0-based: after
// "https:", "" and the host), empty where the URL has fewer.
func q22(c *sdk.Context, r sdk.Record) error {
	if ok, err := bid(r); !ok {
		return err
	}
	var parts [6][]byte // the first six: the rest is not read
	rest := v.URL
	for i := range parts {
		j := indexByte(rest, '/')
		if j < 0 {
			parts[i] = rest
			break
		}
		parts[i], rest = rest[:j], rest[j+1:]
	}
	part := func(i int) []byte { return parts[i] }
	b := appendInt(append(buf[:0], '{'), `"auction":`, v.Auction)
	b = appendInt(b, `,"bidder":`, v.Bidder)
	b = appendInt(b, `,"price":`, v.Price)
	b = appendStr(b, `,"channel":`, v.Channel)
	b = appendStr(b, `,"dir1":`, part(3))
	b = appendStr(b, `,"dir2":`, part(4))
	b = appendStr(b, `,"dir3":`, part(5))
	buf = append(b, '}')
	c.Emit(r.Key, buf, r.Time)
	return nil
}

// The day appendDay formatted last: its first and past-last Unix ms and
// its text. Bids come in time order, so nearly every bid is in the day
// of the one before, and two comparisons stand for the divisions and the
// formatting.
var (
	dayFrom, dayTo int64 = 1, 0 // empty: no day yet
	dayText        []byte
)

// appendDay appends the UTC day of Unix ms t as yyyy-MM-dd.
func appendDay(b []byte, t int64) []byte {
	if t >= dayFrom && t < dayTo {
		return append(b, dayText...)
	}
	n := len(b)
	b = formatDay(b, t)
	dayFrom = floorDiv(t, 86_400_000) * 86_400_000
	dayTo = dayFrom + 86_400_000
	dayText = append(dayText[:0], b[n:]...)
	return b
}

// formatDay appends the UTC day of Unix ms t as yyyy-MM-dd: the civil date
// from the day number (Hinnant's days_from_civil inverse), where
// time.Format costs microseconds per record in a Go guest.
func formatDay(b []byte, t int64) []byte {
	z := floorDiv(t, 86_400_000) + 719_468
	era := floorDiv(z, 146_097)
	doe := z - era*146_097
	yoe := (doe - doe/1460 + doe/36_524 - doe/146_096) / 365
	y := yoe + era*400
	doy := doe - (365*yoe + yoe/4 - yoe/100)
	mp := (5*doy + 2) / 153
	d := doy - (153*mp+2)/5 + 1
	m := mp + 3
	if m > 12 {
		m -= 12
	}
	if m <= 2 {
		y++
	}
	b = strconv.AppendInt(b, y, 10)
	b = append(b, '-', byte('0'+m/10), byte('0'+m%10), '-', byte('0'+d/10), byte('0'+d%10))
	return b
}
