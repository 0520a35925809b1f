package nexmarkq

import (
	"fmt"
	"sort"

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
