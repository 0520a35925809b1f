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
//
// Keyed operators:
//
//	q3_join    persons ⋈ auctions on id = seller (no window: both sides kept)
//	q5         the auctions with the most bids per sliding window (size_ms, slide_ms)
//	q7         the bids with the highest price per tumbling window (size_ms)
//	q8         persons who put up an auction in the tumbling window (size_ms) they registered in
package main

import (
	"encoding/json"
	"errors"
	"math"
	"sort"
	"strconv"

	"cairn/nexmark"
	"cairn/operators/sdk"
)

func main() {}

var (
	size  int64 = 10_000
	slide int64 = 2_000
	v     nexmark.View
	buf   []byte
	key   []byte
)

func init() {
	var c struct {
		Op      string `json:"op"`
		SizeMS  int64  `json:"size_ms"`
		SlideMS int64  `json:"slide_ms"`
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
	if size%slide != 0 {
		panic("nexmark: slide_ms must divide size_ms")
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
	sdk.Register(op)
}

// decode decodes a record's event; a record that is not one is the
// record's failure (a dead letter naming the reason).
func decode(r sdk.Record) error { return v.Decode(r.Value) }

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
	if k, err := kind(r); k != nexmark.KindBid {
		return err
	}
	if err := decode(r); err != nil {
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
	if k, err := kind(r); k != nexmark.KindBid {
		return err
	}
	if err := decode(r); err != nil {
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
				n, _ := strconv.ParseInt(string(id), 10, 64)
				q3Emit(c, person, n, r.Time)
			}
			c.Delete("a")
		}
	case 'A':
		id, err := strconv.ParseInt(string(r.Value[1:]), 10, 64)
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
	if k, err := kind(r); k != nexmark.KindBid {
		return err
	}
	if err := decode(r); err != nil {
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
		n, _ = strconv.ParseUint(string(old), 10, 64)
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
		fired, _ = strconv.ParseInt(string(f), 10, 64)
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
		n, _ := strconv.ParseUint(string(val), 10, 64)
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
		best, _ = strconv.ParseInt(string(old[:nl]), 10, 64)
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
	price, err := strconv.ParseInt(string(val[:i]), 10, 64)
	if err != nil {
		return 0, nil, nil, errors.New("nexmark: a value that window_route did not write")
	}
	return price, val[i+1 : i+1+j], val[i+2+j:], nil
}

func appendInt(b []byte, name string, n int64) []byte {
	return strconv.AppendInt(append(b, name...), n, 10)
}

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
