package engine

import (
	"sort"
	"sync/atomic"
	"time"
)

// Record latency, what a user waiting for an output sees (the dashboard and
// /metrics show it): the time from a record's arrival in
// the input stream (its JetStream timestamp) until the slot processed it
// and handed its outputs to the publisher (their acknowledgements are not
// waited for). A record replayed after a restore counts with its original
// arrival, so the catch-up shows as the tail it is.

// LatencyBounds are the histogram's bucket upper bounds in seconds:
// 100 µs to 60 s, about 4 per decade.
var LatencyBounds = [...]float64{
	0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
	0.25, 0.5, 1, 2.5, 5, 10, 30, 60,
}

// latencyHist is a fixed-bucket histogram safe for concurrent use.
type latencyHist struct {
	counts [len(LatencyBounds) + 1]atomic.Uint64 // + the overflow bucket
	sumNs  atomic.Int64
}

// observeSince records, for each arrival time (Unix ns; 0: unknown), the
// latency until now: counted locally and added once per bucket, so a
// batch costs a few atomic adds, not two per record (slots share h).
func (h *latencyHist) observeSince(now int64, arrivals func(yield func(ns int64))) {
	var counts [len(LatencyBounds) + 1]uint64
	var sum int64
	arrivals(func(ns int64) {
		if ns <= 0 {
			return
		}
		d := max(now-ns, 0) // a stream timestamp ahead of this host's clock counts as 0
		counts[sort.SearchFloat64s(LatencyBounds[:], time.Duration(d).Seconds())]++
		sum += d
	})
	for i, c := range counts {
		if c > 0 {
			h.counts[i].Add(c)
		}
	}
	h.sumNs.Add(sum)
}

// Latency is a snapshot of the record latency histogram: Counts[i] records
// took at most LatencyBounds[i] (and more than the bound before it); the
// last count is above the last bound.
type Latency struct {
	Counts []uint64
	Sum    time.Duration
}

// Count is the number of records observed.
func (l Latency) Count() uint64 {
	var n uint64
	for _, c := range l.Counts {
		n += c
	}
	return n
}

// Sub returns the records observed since an earlier snapshot.
func (l Latency) Sub(earlier Latency) Latency {
	out := Latency{Counts: make([]uint64, len(l.Counts)), Sum: l.Sum - earlier.Sum}
	for i := range l.Counts {
		out.Counts[i] = l.Counts[i]
		if i < len(earlier.Counts) {
			out.Counts[i] -= earlier.Counts[i]
		}
	}
	return out
}

// Quantile returns the upper bound of the bucket holding quantile q (0 <
// q <= 1), in seconds; 0 when nothing was observed, and the last bound
// when the quantile is past it (read: at least that).
func (l Latency) Quantile(q float64) float64 {
	n := l.Count()
	if n == 0 {
		return 0
	}
	rank := uint64(q*float64(n) + 0.5)
	rank = max(rank, 1)
	var seen uint64
	for i, c := range l.Counts {
		seen += c
		if seen >= rank {
			return LatencyBounds[min(i, len(LatencyBounds)-1)]
		}
	}
	return LatencyBounds[len(LatencyBounds)-1]
}

func (h *latencyHist) snapshot() Latency {
	l := Latency{Counts: make([]uint64, len(h.counts)), Sum: time.Duration(h.sumNs.Load())}
	for i := range h.counts {
		l.Counts[i] = h.counts[i].Load()
	}
	return l
}
