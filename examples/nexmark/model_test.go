package nexmarkq_test

import (
	"fmt"
	"regexp"
	"sort"
	"strings"
	"time"

	"cairn/nexmark"
)

// A model is a query's output computed by plain Go over the generated
// events: each output as "key|value|time", sorted. The job's watermark
// after the last event is that event's time - 1 (max_out_of_orderness 0):
// a window is fired when its last millisecond is at or before it, as the
// job's timers fire; later windows never are (a bounded input ends without
// a final watermark).
type model func(evs []nexmark.Event, wm int64) []string

var models = map[string]model{
	"q0": modelQ0, "q1": modelQ1, "q2": modelQ2, "q3": modelQ3,
	"q5": modelQ5, "q7": modelQ7, "q8": modelQ8,
}

func line(key int64, value string, t int64) string {
	return fmt.Sprintf("%d|%s|%d", key, value, t)
}

func sorted(s []string) []string {
	sort.Strings(s)
	return s
}

func modelQ0(evs []nexmark.Event, _ int64) []string {
	var out []string
	for i := range evs {
		if e := &evs[i]; e.Kind == nexmark.KindBid {
			out = append(out, line(e.Bid.Auction, string(nexmark.AppendJSON(nil, e)), e.Bid.DateTime))
		}
	}
	return sorted(out)
}

func modelQ1(evs []nexmark.Event, _ int64) []string {
	var out []string
	for _, e := range evs {
		if b := e.Bid; e.Kind == nexmark.KindBid {
			out = append(out, line(b.Auction, fmt.Sprintf(`{"auction":%d,"bidder":%d,"price":%d,"date_time":%d,"extra":"%s"}`,
				b.Auction, b.Bidder, b.Price*908/1000, b.DateTime, b.Extra), b.DateTime))
		}
	}
	return sorted(out)
}

func modelQ2(evs []nexmark.Event, _ int64) []string {
	var out []string
	for _, e := range evs {
		if b := e.Bid; e.Kind == nexmark.KindBid && b.Auction%123 == 0 {
			out = append(out, line(b.Auction, fmt.Sprintf(`{"auction":%d,"price":%d}`, b.Auction, b.Price), b.DateTime))
		}
	}
	return sorted(out)
}

// modelQ3: every (person, auction) pair with auction.seller = person.id,
// person.state in OR, ID, CA and auction.category 10, at the later one's
// time.
func modelQ3(evs []nexmark.Event, _ int64) []string {
	persons := map[int64]nexmark.Person{}
	var auctions []nexmark.Auction
	for _, e := range evs {
		switch {
		case e.Kind == nexmark.KindPerson && (e.Person.State == "OR" || e.Person.State == "ID" || e.Person.State == "CA"):
			persons[e.Person.ID] = e.Person
		case e.Kind == nexmark.KindAuction && e.Auction.Category == 10:
			auctions = append(auctions, e.Auction)
		}
	}
	var out []string
	for _, a := range auctions {
		if p, ok := persons[a.Seller]; ok {
			out = append(out, line(a.Seller, fmt.Sprintf(`{"name":"%s","city":"%s","state":"%s","id":%d}`, p.Name, p.City, p.State, a.ID), max(p.DateTime, a.DateTime)))
		}
	}
	return sorted(out)
}

const (
	size  = 10_000
	slide = 2_000
)

// modelQ5: for every sliding window [s, s+10 s), s a multiple of 2 s,
// holding bids and fired, the auctions with the most bids in it.
func modelQ5(evs []nexmark.Event, wm int64) []string {
	counts := map[int64]map[int64]int{} // window start → auction → bids
	for _, e := range evs {
		if e.Kind != nexmark.KindBid {
			continue
		}
		t := e.Bid.DateTime
		for s := t / slide * slide; s > t-size; s -= slide {
			if counts[s] == nil {
				counts[s] = map[int64]int{}
			}
			counts[s][e.Bid.Auction]++
		}
	}
	var out []string
	for s, c := range counts {
		if s+size-1 > wm {
			continue
		}
		best := 0
		for _, n := range c {
			best = max(best, n)
		}
		for a, n := range c {
			if n == best {
				out = append(out, line(a, fmt.Sprintf(`{"auction":%d,"num":%d,"window_start":%d,"window_end":%d}`, a, n, s, s+size), s+size-1))
			}
		}
	}
	return sorted(out)
}

// modelQ7: for every fired tumbling window of 10 s, its bids at its
// highest price.
func modelQ7(evs []nexmark.Event, wm int64) []string {
	type win struct {
		best int64
		bids []nexmark.Bid
	}
	wins := map[int64]*win{}
	for _, e := range evs {
		if e.Kind != nexmark.KindBid {
			continue
		}
		b := e.Bid
		s := b.DateTime / size * size
		w := wins[s]
		if w == nil {
			w = &win{best: -1}
			wins[s] = w
		}
		switch {
		case b.Price > w.best:
			w.best, w.bids = b.Price, []nexmark.Bid{b}
		case b.Price == w.best:
			w.bids = append(w.bids, b)
		}
	}
	var out []string
	for s, w := range wins {
		if s+size-1 > wm {
			continue
		}
		for _, b := range w.bids {
			out = append(out, line(b.Auction, fmt.Sprintf(`{"auction":%d,"price":%d,"bidder":%d,"date_time":%d,"extra":"%s"}`, b.Auction, b.Price, b.Bidder, b.DateTime, b.Extra), s+size-1))
		}
	}
	return sorted(out)
}

// modelQ8: every person who put up an auction in the fired tumbling
// window of 10 s they registered in.
func modelQ8(evs []nexmark.Event, wm int64) []string {
	type pw struct{ id, start int64 }
	sold := map[pw]bool{}
	for _, e := range evs {
		if e.Kind == nexmark.KindAuction {
			sold[pw{e.Auction.Seller, e.Auction.DateTime / size * size}] = true
		}
	}
	var out []string
	for _, e := range evs {
		if e.Kind != nexmark.KindPerson {
			continue
		}
		p := e.Person
		s := p.DateTime / size * size
		if s+size-1 <= wm && sold[pw{p.ID, s}] {
			out = append(out, line(p.ID, fmt.Sprintf(`{"id":%d,"name":"%s","starttime":%d}`, p.ID, p.Name, s), s+size-1))
		}
	}
	return sorted(out)
}

func init() {
	for q, m := range map[string]model{"q9": modelQ9, "q11": modelQ11, "q14": modelQ14, "q17": modelQ17, "q19": modelQ19, "q20": modelQ20, "q21": modelQ21, "q22": modelQ22} {
		models[q] = m
	}
}

// modelQ9: every auction that expired by the watermark with its highest
// bid placed between its start and expiry after it arrived (the earliest
// such bid on a tie), at its expiry.
func modelQ9(evs []nexmark.Event, wm int64) []string {
	auctions := map[int64]nexmark.Auction{}
	best := map[int64]nexmark.Bid{}
	for _, e := range evs {
		switch e.Kind {
		case nexmark.KindAuction:
			auctions[e.Auction.ID] = e.Auction
		case nexmark.KindBid:
			b := e.Bid
			a, ok := auctions[b.Auction]
			if !ok || b.DateTime < a.DateTime || b.DateTime > a.Expires {
				continue
			}
			if o, ok := best[a.ID]; ok && (b.Price < o.Price || (b.Price == o.Price && b.DateTime >= o.DateTime)) {
				continue
			}
			best[a.ID] = b
		}
	}
	var out []string
	for id, b := range best {
		a := auctions[id]
		if a.Expires > wm {
			continue
		}
		out = append(out, line(id, fmt.Sprintf(`{"id":%d,"item_name":"%s","initial_bid":%d,"reserve":%d,"date_time":%d,"expires":%d,"seller":%d,"category":%d,"bidder":%d,"price":%d,"bid_date_time":%d}`,
			a.ID, a.ItemName, a.InitialBid, a.Reserve, a.DateTime, a.Expires, a.Seller, a.Category, b.Bidder, b.Price, b.DateTime), a.Expires))
	}
	return sorted(out)
}

// modelQ11: every bidder's sessions (bids less than 10 s apart) that ended
// by the watermark.
func modelQ11(evs []nexmark.Event, wm int64) []string {
	const gap = 10_000
	type session struct{ start, last, n int64 }
	open := map[int64]*session{}
	var out []string
	emit := func(bidder int64, s *session) {
		if s.last+gap-1 <= wm {
			out = append(out, line(bidder, fmt.Sprintf(`{"bidder":%d,"bid_count":%d,"starttime":%d,"endtime":%d}`, bidder, s.n, s.start, s.last+gap), s.last+gap-1))
		}
	}
	for _, e := range evs {
		if e.Kind != nexmark.KindBid {
			continue
		}
		b := e.Bid
		s := open[b.Bidder]
		if s != nil && b.DateTime >= s.last+gap {
			emit(b.Bidder, s)
			s = nil
		}
		if s == nil {
			s = &session{start: b.DateTime}
			open[b.Bidder] = s
		}
		s.last = max(s.last, b.DateTime)
		s.n++
	}
	for bidder, s := range open {
		emit(bidder, s)
	}
	return sorted(out)
}

func modelQ14(evs []nexmark.Event, _ int64) []string {
	var out []string
	for _, e := range evs {
		b := e.Bid
		if e.Kind != nexmark.KindBid || b.Price*908 <= 1_000_000_000 || b.Price*908 >= 50_000_000_000 {
			continue
		}
		typ := "otherTime"
		switch h := b.DateTime / 3_600_000 % 24; {
		case h >= 8 && h <= 18:
			typ = "dayTime"
		case h <= 6 || h >= 20:
			typ = "nightTime"
		}
		out = append(out, line(b.Auction, fmt.Sprintf(`{"auction":%d,"bidder":%d,"price":%d,"bid_time_type":"%s","date_time":%d,"extra":"%s","c_counts":%d}`,
			b.Auction, b.Bidder, b.Price*908/1000, typ, b.DateTime, b.Extra, strings.Count(b.Extra, "c")), b.DateTime))
	}
	return sorted(out)
}

func modelQ17(evs []nexmark.Event, _ int64) []string {
	type agg struct{ total, r1, r2, r3, lo, hi, sum int64 }
	type k struct {
		auction int64
		day     string
	}
	aggs := map[k]*agg{}
	var out []string
	for _, e := range evs {
		if e.Kind != nexmark.KindBid {
			continue
		}
		b := e.Bid
		day := time.UnixMilli(b.DateTime).UTC().Format("2006-01-02")
		a := aggs[k{b.Auction, day}]
		if a == nil {
			a = &agg{lo: b.Price, hi: b.Price}
			aggs[k{b.Auction, day}] = a
		}
		a.total++
		switch {
		case b.Price < 10_000:
			a.r1++
		case b.Price < 1_000_000:
			a.r2++
		default:
			a.r3++
		}
		a.lo, a.hi, a.sum = min(a.lo, b.Price), max(a.hi, b.Price), a.sum+b.Price
		out = append(out, line(b.Auction, fmt.Sprintf(`{"auction":%d,"day":"%s","total_bids":%d,"rank1_bids":%d,"rank2_bids":%d,"rank3_bids":%d,"min_price":%d,"max_price":%d,"avg_price":%d,"sum_price":%d}`,
			b.Auction, day, a.total, a.r1, a.r2, a.r3, a.lo, a.hi, a.sum/a.total, a.sum), b.DateTime))
	}
	return sorted(out)
}

// modelQ19: on every bid that enters its auction's ten highest (above
// every bid of an equal price already there), those ten.
func modelQ19(evs []nexmark.Event, _ int64) []string {
	top := map[int64][]nexmark.Bid{}
	var out []string
	for _, e := range evs {
		if e.Kind != nexmark.KindBid {
			continue
		}
		b := e.Bid
		l := top[b.Auction]
		pos := sort.Search(len(l), func(i int) bool { return b.Price > l[i].Price })
		if pos >= 10 {
			continue
		}
		l = append(l[:pos], append([]nexmark.Bid{b}, l[pos:]...)...)
		if len(l) > 10 {
			l = l[:10]
		}
		top[b.Auction] = l
		var s strings.Builder
		fmt.Fprintf(&s, `{"auction":%d,"top":[`, b.Auction)
		for i, x := range l {
			if i > 0 {
				s.WriteByte(',')
			}
			fmt.Fprintf(&s, `{"price":%d,"date_time":%d,"bidder":%d}`, x.Price, x.DateTime, x.Bidder)
		}
		s.WriteString("]}")
		out = append(out, line(b.Auction, s.String(), b.DateTime))
	}
	return sorted(out)
}

// modelQ20: every (bid, auction of category 10) with bid.auction =
// auction.id, whichever came first, at the later one's time.
func modelQ20(evs []nexmark.Event, _ int64) []string {
	auctions := map[int64]nexmark.Auction{}
	for _, e := range evs {
		if e.Kind == nexmark.KindAuction && e.Auction.Category == 10 {
			auctions[e.Auction.ID] = e.Auction
		}
	}
	var out []string
	for _, e := range evs {
		if e.Kind != nexmark.KindBid {
			continue
		}
		b := e.Bid
		a, ok := auctions[b.Auction]
		if !ok {
			continue
		}
		out = append(out, line(b.Auction, fmt.Sprintf(`{"auction":%d,"bidder":%d,"price":%d,"channel":"%s","url":"%s","date_time":%d,"extra":"%s",`+
			`"item_name":"%s","description":"%s","initial_bid":%d,"reserve":%d,"a_date_time":%d,"expires":%d,"seller":%d,"category":%d,"a_extra":"%s"}`,
			b.Auction, b.Bidder, b.Price, b.Channel, b.URL, b.DateTime, b.Extra,
			a.ItemName, a.Description, a.InitialBid, a.Reserve, a.DateTime, a.Expires, a.Seller, a.Category, a.Extra), max(a.DateTime, b.DateTime)))
	}
	return sorted(out)
}

var channelIDRe = regexp.MustCompile(`(&|^)channel_id=([^&]*)`)

func modelQ21(evs []nexmark.Event, _ int64) []string {
	hot := map[string]string{"apple": "0", "google": "1", "facebook": "2", "baidu": "3"}
	var out []string
	for _, e := range evs {
		if e.Kind != nexmark.KindBid {
			continue
		}
		b := e.Bid
		id, ok := hot[strings.ToLower(b.Channel)]
		if !ok {
			m := channelIDRe.FindStringSubmatch(b.URL)
			if m == nil {
				continue
			}
			id = m[2]
		}
		out = append(out, line(b.Auction, fmt.Sprintf(`{"auction":%d,"bidder":%d,"price":%d,"channel":"%s","channel_id":"%s"}`, b.Auction, b.Bidder, b.Price, b.Channel, id), b.DateTime))
	}
	return sorted(out)
}

func modelQ22(evs []nexmark.Event, _ int64) []string {
	var out []string
	for _, e := range evs {
		if e.Kind != nexmark.KindBid {
			continue
		}
		b := e.Bid
		p := append(strings.Split(b.URL, "/"), "", "", "", "", "", "")
		out = append(out, line(b.Auction, fmt.Sprintf(`{"auction":%d,"bidder":%d,"price":%d,"channel":"%s","dir1":"%s","dir2":"%s","dir3":"%s"}`, b.Auction, b.Bidder, b.Price, b.Channel, p[3], p[4], p[5]), b.DateTime))
	}
	return sorted(out)
}
