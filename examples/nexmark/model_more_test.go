package nexmarkq_test

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"cairn/nexmark"
)

func init() {
	for q, m := range map[string]model{
		"q4": modelQ4, "q6": modelQ6, "q10": modelQ10, "q12": modelQ12, "q13": modelQ13,
		"q15": modelQ15, "q16": modelQ16, "q18": modelQ18,
	} {
		models[q] = m
	}
}

// closed is an auction that expired by the watermark with its highest
// bid between its start and expiry (bids after the auction, in order).
type closed struct {
	a     nexmark.Auction
	final int64
}

// closings are the auctions closed by wm in (expiry, id) order.
func closings(evs []nexmark.Event, wm int64) []closed {
	auctions := map[int64]nexmark.Auction{}
	best := map[int64]int64{}
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
			if p, ok := best[a.ID]; !ok || b.Price > p {
				best[a.ID] = b.Price
			}
		}
	}
	var out []closed
	for id, p := range best {
		if a := auctions[id]; a.Expires <= wm {
			out = append(out, closed{a, p})
		}
	}
	slices.SortFunc(out, func(x, y closed) int {
		if x.a.Expires != y.a.Expires {
			return int(x.a.Expires - y.a.Expires)
		}
		return int(x.a.ID - y.a.ID)
	})
	return out
}

// modelQ4: on every closing, in (expiry, id) order, its category's
// average closing price so far (integer division).
func modelQ4(evs []nexmark.Event, wm int64) []string {
	type agg struct{ sum, n int64 }
	aggs := map[int64]*agg{}
	var out []string
	for _, c := range closings(evs, wm) {
		g := aggs[c.a.Category]
		if g == nil {
			g = &agg{}
			aggs[c.a.Category] = g
		}
		g.sum, g.n = g.sum+c.final, g.n+1
		out = append(out, line(c.a.Category, fmt.Sprintf(`{"category":%d,"avg":%d}`, c.a.Category, g.sum/g.n), c.a.Expires))
	}
	return sorted(out)
}

// modelQ6: on every closing, in (expiry, id) order, the average of its
// seller's last ten closing prices.
func modelQ6(evs []nexmark.Event, wm int64) []string {
	last := map[int64][]int64{}
	var out []string
	for _, c := range closings(evs, wm) {
		l := append(last[c.a.Seller], c.final)
		if len(l) > 10 {
			l = l[len(l)-10:]
		}
		last[c.a.Seller] = l
		var sum int64
		for _, p := range l {
			sum += p
		}
		out = append(out, line(c.a.Seller, fmt.Sprintf(`{"seller":%d,"avg":%d}`, c.a.Seller, sum/int64(len(l))), c.a.Expires))
	}
	return sorted(out)
}

func utc(ms int64) time.Time { return time.UnixMilli(ms).UTC() }

func modelQ10(evs []nexmark.Event, _ int64) []string {
	var out []string
	for _, e := range evs {
		if b := e.Bid; e.Kind == nexmark.KindBid {
			dt, hm := utc(b.DateTime).Format("2006-01-02"), utc(b.DateTime).Format("15:04")
			out = append(out, fmt.Sprintf(`%s/%s|{"auction":%d,"bidder":%d,"price":%d,"date_time":%d,"extra":"%s","dt":"%s","hm":"%s"}|%d`,
				dt, hm, b.Auction, b.Bidder, b.Price, b.DateTime, b.Extra, dt, hm, b.DateTime))
		}
	}
	return sorted(out)
}

// modelQ12: per bidder, its bids per 10-second window of the processing
// clock (a bid's ingestion time, its event time for a generated input, in
// 10 ms steps), for the windows whose last millisecond the clock reached
// (the last event's time, in 10 ms steps).
func modelQ12(evs []nexmark.Event, _ int64) []string {
	const size = 10_000
	type win struct{ bidder, start int64 }
	counts := map[win]int64{}
	for _, e := range evs {
		if e.Kind == nexmark.KindBid {
			pt := e.Bid.DateTime / 10 * 10
			counts[win{e.Bid.Bidder, pt / size * size}]++
		}
	}
	clock := evs[len(evs)-1].Time() / 10 * 10
	var out []string
	for w, n := range counts {
		if w.start+size-1 <= clock {
			out = append(out, line(w.bidder, fmt.Sprintf(`{"bidder":%d,"bid_count":%d,"starttime":%d,"endtime":%d}`, w.bidder, n, w.start, w.start+size), w.start+size-1))
		}
	}
	return sorted(out)
}

func modelQ13(evs []nexmark.Event, _ int64) []string {
	var out []string
	for _, e := range evs {
		if b := e.Bid; e.Kind == nexmark.KindBid {
			out = append(out, line(b.Auction, fmt.Sprintf(`{"auction":%d,"bidder":%d,"price":%d,"date_time":%d,"value":"%d"}`,
				b.Auction, b.Bidder, b.Price, b.DateTime, b.Auction%10_000), b.DateTime))
		}
	}
	return sorted(out)
}

// dayStats models q15 (byChannel false) and q16: on every bid, its key's
// counts of bids, distinct bidders and distinct auctions, in all and per
// price rank.
func dayStats(evs []nexmark.Event, byChannel bool) []string {
	type stats struct {
		n        [12]int64
		bidders  map[int64]uint8
		auctions map[int64]uint8
		minute   string
	}
	all := map[string]*stats{}
	var out []string
	for _, e := range evs {
		if e.Kind != nexmark.KindBid {
			continue
		}
		b := e.Bid
		day := utc(b.DateTime).Format("2006-01-02")
		k := day
		if byChannel {
			k = b.Channel + "," + day
		}
		s := all[k]
		if s == nil {
			s = &stats{bidders: map[int64]uint8{}, auctions: map[int64]uint8{}}
			all[k] = s
		}
		rank := 3
		switch {
		case b.Price < 10_000:
			rank = 1
		case b.Price < 1_000_000:
			rank = 2
		}
		s.n[0]++
		s.n[rank]++
		for i, m := range []map[int64]uint8{s.bidders, s.auctions} {
			id := []int64{b.Bidder, b.Auction}[i]
			mask, seen := m[id]
			if !seen {
				s.n[4*(i+1)]++
			}
			if mask&(1<<rank) == 0 {
				s.n[4*(i+1)+rank]++
			}
			m[id] = mask | 1<<rank
		}
		var v strings.Builder
		v.WriteByte('{')
		if byChannel {
			s.minute = max(s.minute, utc(b.DateTime).Format("15:04"))
			fmt.Fprintf(&v, `"channel":"%s","day":"%s","minute":"%s"`, b.Channel, day, s.minute)
		} else {
			fmt.Fprintf(&v, `"day":"%s"`, day)
		}
		for i, name := range []string{"total_bids", "rank1_bids", "rank2_bids", "rank3_bids",
			"total_bidders", "rank1_bidders", "rank2_bidders", "rank3_bidders",
			"total_auctions", "rank1_auctions", "rank2_auctions", "rank3_auctions"} {
			fmt.Fprintf(&v, `,"%s":%d`, name, s.n[i])
		}
		v.WriteByte('}')
		out = append(out, fmt.Sprintf("%s|%s|%d", k, v.String(), b.DateTime))
	}
	return sorted(out)
}

func modelQ15(evs []nexmark.Event, _ int64) []string { return dayStats(evs, false) }
func modelQ16(evs []nexmark.Event, _ int64) []string { return dayStats(evs, true) }

// modelQ18: every bid at or after the last bid of its (bidder, auction):
// with the events in order, every bid.
func modelQ18(evs []nexmark.Event, _ int64) []string {
	last := map[[2]int64]int64{}
	var out []string
	for _, e := range evs {
		if e.Kind != nexmark.KindBid {
			continue
		}
		b := e.Bid
		k := [2]int64{b.Bidder, b.Auction}
		if t, ok := last[k]; ok && b.DateTime < t {
			continue
		}
		last[k] = b.DateTime
		out = append(out, fmt.Sprintf(`%d,%d|{"auction":%d,"bidder":%d,"price":%d,"channel":"%s","url":"%s","date_time":%d,"extra":"%s"}|%d`,
			b.Bidder, b.Auction, b.Auction, b.Bidder, b.Price, b.Channel, b.URL, b.DateTime, b.Extra, b.DateTime))
	}
	return sorted(out)
}
