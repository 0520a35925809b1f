// Package model is cairn's one restore-time model: every prediction the
// product shows (the dashboard, /metrics, `cairn checkpoints ls|show`, the
// drill, the demo) comes from Model.Predict.
//
// A restore's time is a sum of one term per cost:
//
//	bytes to fetch ÷ measured fetch bandwidth
//	+ per-object latency × objects downloaded whole ÷ parallelism
//	+ per-request latency × reads that write no file (a full checkpoint's
//	  index and key-group segment reads) ÷ parallelism
//	+ rebuild: bytes decoded and ingested × seconds per GiB (a full checkpoint),
//	  or bytes of the key groups moved × seconds per GiB (an incremental scale-down),
//	  at the number of slots rebuilding at once
//	+ open time (open and check every DB; hard links from a local copy or a standby cache)
//
// except that a full checkpoint's rebuild decodes each key group's segment as
// its range read arrives: its fetch and its rebuild overlap, and the slower
// of the two sets the time (open + max(fetch + latency, rebuild)).
//
// Each term is calibrated from measurements the node makes anyway (restores,
// drills, the standby's syncs, uploads) and kept in the data directory
// (File). A term that a prediction needs and nobody has measured makes the
// prediction "calibrating": the product never shows a number it does not
// believe.
package model

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"cairn/internal/base/datadir"
)

// File is the model's file name in the data directory.
const File = "restore-model.json"

// Where a restore takes its bytes from.
const (
	SourceLocal   = "local"   // the node's local checkpoint copy
	SourceStandby = "standby" // a standby's cache (only the delta from the store)
	SourceStore   = "store"   // the checkpoint store
)

// Rescale is how the slot count changes.
const (
	Same = "same"
	Up   = "up"
	Down = "down"
)

// Modes, as checkpoint.Mode spells them.
const (
	Incremental = "incremental"
	Full        = "full"
)

// DefaultParallelism is the restore's default download concurrency
// (recovery.Options.Concurrency).
const DefaultParallelism = 8

// Input is what a restore will do, from recovery.PlanRestore or a
// checkpoint's figures.
type Input struct {
	Mode    string // Incremental or Full
	Source  string // SourceLocal, SourceStandby, SourceStore
	Rescale string // Same, Up, Down ("" is Same)
	// Objects and BytesFetch are what comes from the store: Objects are
	// downloaded whole, each into a file of its own (an incremental
	// checkpoint's files).
	Objects    int
	BytesFetch int64
	// Requests are reads from the store that write no file of their own:
	// a full checkpoint's index reads and ranged key-group segment reads
	// (recovery.Plan.RequestsDownload). They cost the request term, not
	// the per-object one (a ranged read creates, writes and syncs no file).
	Requests int
	// SSTs is how many of Objects are SSTs: an online restore leaves them
	// in the store (the remote term) and downloads the others (Pebble's
	// metadata) before the DBs open (the per-object term). 0: not known
	// (every object is counted at the remote term).
	SSTs int
	// BytesRebuild is what the rebuild term works on: a full checkpoint's
	// data (decoded and ingested); an incremental rescale's key groups
	// moved from the old slots that are not a new slot's base.
	BytesRebuild int64
	// Parallelism is the download concurrency (0: DefaultParallelism).
	Parallelism int
	// Workers is how many slots rebuild at once: min(new slots, cores)
	// (0: 1). A rebuild rate is measured per worker count (RebuildKey):
	// on a machine whose cores are shared, two slots rebuilding at once
	// are not twice as fast as one.
	Workers int
}

// streams reports whether the restore's rebuild consumes its fetch as it
// arrives (a full checkpoint: each key group's segment is a range read
// decoded while it streams), so that the two overlap.
func (in Input) streams() bool { return in.Mode == Full }

func (in Input) workers() float64 { return float64(max(1, in.Workers)) }

// rebuildTerm names the rebuild cost the input has ("" none).
func (in Input) rebuildTerm() string {
	switch {
	case in.BytesRebuild <= 0:
		return ""
	case in.Mode == Full:
		return TermDecode
	case in.Rescale == Down || in.Rescale == Up:
		// A rescaled incremental restore clips each new slot from the old
		// slot it overlaps most; key groups that lie in another old slot
		// (every new slot of a scale-down, the middle ones of 2 → 3) are
		// scanned from it and ingested.
		return TermMove
	}
	return ""
}

func (in Input) par() float64 {
	if in.Parallelism <= 0 {
		return DefaultParallelism
	}
	return float64(in.Parallelism)
}

// Term names.
const (
	TermBandwidth = "bandwidth" // bytes/s from the store
	TermLatency   = "latency"   // seconds per object downloaded whole (a request, a file written and synced)
	TermRequest   = "request"   // seconds per read that writes no file (a ranged segment read)
	TermDecode    = "decode"    // seconds per GiB of full data decoded and ingested
	TermMove      = "move"      // seconds per GiB of key groups moved on a rescale (scanned from an old slot that is not the new slot's base, and ingested)
	TermOpen      = "open"      // seconds to open and check the DBs
	TermRemote    = "remote"    // seconds per object an online restore places as a remote file
	// TermOnlineOpen is an online restore's time to open beyond its
	// metadata downloads and remote files: it links and checks no local
	// SSTs, so it is not the open term's (it is fitted with the remote
	// term from the online restores, fitOnline).
	TermOnlineOpen = "online open"
)

// RebuildKey names a rebuild term measured with workers slots rebuilding at
// once: "decode@2" is the wall seconds per GiB of a full checkpoint's data
// when two slots rebuild together.
func RebuildKey(term string, workers int) string {
	return fmt.Sprintf("%s@%d", term, max(1, workers))
}

// Term is one calibrated cost.
type Term struct {
	Value    float64   `json:"value"`
	Samples  int       `json:"samples"`
	Measured time.Time `json:"measured"`
	// From names the measurement: "restore", "drill", "standby sync", "upload".
	From string `json:"from"`
	// Recent are the last measurements (up to maxRecent); Value is their
	// median, so that one restore slowed by a neighbour on a shared
	// machine does not move the term.
	Recent []float64 `json:"recent,omitempty"`
}

// maxRecent is how many measurements a term's median is taken over.
const maxRecent = 5

// Known reports whether the term has been measured.
func (t Term) Known() bool { return t.Samples > 0 }

// observe adds a measurement v (at least 0) to the term.
func (t *Term) observe(v float64, now time.Time, from string) {
	recent := t.Recent
	if len(recent) == 0 && t.Samples > 0 {
		recent = []float64{t.Value} // a term from before Recent was kept
	}
	recent = append(append([]float64(nil), recent...), max(0, v))
	if len(recent) > maxRecent {
		recent = recent[len(recent)-maxRecent:]
	}
	*t = Term{Value: median(recent), Samples: t.Samples + 1, Measured: now, From: from, Recent: recent}
}

// median of v (the mean of the middle two for an even count).
func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// Transfer is one measured transfer to or from the store.
type Transfer struct {
	Bytes       int64     `json:"bytes"`
	Objects     int       `json:"objects"`
	Parallelism int       `json:"parallelism"`
	Seconds     float64   `json:"seconds"`
	Upload      bool      `json:"upload,omitempty"`
	From        string    `json:"from"`
	Time        time.Time `json:"time"`
}

// maxTransfers is how many transfers the fit keeps.
const maxTransfers = 16

// MinFetchBytes is the smallest transfer that measures the bandwidth: below
// it, fixed costs dominate (ObserveTransfer ignores smaller ones).
const MinFetchBytes = 256 << 10

// State is the model's measurements, as kept in File.
type State struct {
	// Transfers are the recent store transfers: downloads (restores,
	// standby syncs) and, until there is one, uploads. Bandwidth and
	// per-object latency are fitted from them.
	Transfers []Transfer `json:"transfers"`
	// Open, Decode and Move are the other terms. Decode and Move are
	// seconds per GiB per worker (wall time × workers): the rate a worker
	// count that was never measured is predicted from, assuming the rebuild
	// scales with the workers.
	Open   Term `json:"open"`
	Decode Term `json:"decode"`
	Move   Term `json:"move"`
	// Rebuild are the rebuild rates as measured, by RebuildKey: wall
	// seconds per GiB at that worker count. A prediction uses the one of
	// its worker count when there is one.
	Rebuild map[string]Term `json:"rebuild,omitempty"`
	// Request is the seconds per read that writes no file (a full
	// checkpoint's ranged segment reads): measured by full restores from
	// the store whose fetch, not their rebuild, sets their time.
	Request Term `json:"request"`
	// Remote is the seconds per object an online restore spends placing
	// the files it leaves in the store, as a model from before Online was
	// kept measured it (over the open term); used while Online is empty.
	Remote Term `json:"remote"`
	// Online are the recent online restores (ObserveOnline): the remote
	// and online-open terms are fitted from them (fitOnline).
	Online []OnlineSample `json:"online,omitempty"`
}

// OnlineSample is one online restore: Remote files placed in the store and
// Seconds to processing, less its metadata downloads.
type OnlineSample struct {
	Remote  int       `json:"remote"`
	Seconds float64   `json:"seconds"`
	From    string    `json:"from"`
	Time    time.Time `json:"time"`
}

// maxOnline is how many online restores the fit keeps.
const maxOnline = 16

// fitOnline fits an online restore's time to processing, less its
// metadata downloads, as openT + remoteT × remote files, from the samples:
//
//   - when the samples' file counts differ enough to separate the two (at
//     least three samples, the largest count at least twice the smallest),
//     by least squares, neither term below zero;
//   - otherwise from the median of the last maxRecent samples (ym, at the
//     median count xm): the online open is the local open term when that
//     is at most ym (an online restore does what a local one does, and
//     places its files), else ym (it opens faster than a local restore,
//     which links and checks its files, and its files cost nothing
//     measurable), and the rest is per file.
//
// Without samples, a model saved before they were kept predicts from its
// remote term over the open term (legacy), and neither is known otherwise.
func fitOnline(samples []OnlineSample, open, legacy Term) (openT, remoteT Term) {
	if len(samples) == 0 {
		if legacy.Known() {
			return open, legacy
		}
		return Term{}, Term{}
	}
	last := samples[len(samples)-1]
	term := func(v float64) Term {
		return Term{Value: max(0, v), Samples: len(samples), Measured: last.Time, From: last.From}
	}
	lo, hi := samples[0].Remote, samples[0].Remote
	var sx, sy, sxx, sxy float64
	for _, s := range samples {
		lo, hi = min(lo, s.Remote), max(hi, s.Remote)
		x := float64(s.Remote)
		sx, sy, sxx, sxy = sx+x, sy+s.Seconds, sxx+x*x, sxy+x*s.Seconds
	}
	if n := float64(len(samples)); len(samples) >= 3 && lo > 0 && hi >= 2*lo {
		b := (n*sxy - sx*sy) / (n*sxx - sx*sx)
		a := (sy - b*sx) / n
		switch {
		case b < 0:
			a, b = sy/n, 0
		case a < 0:
			a, b = 0, sxy/sxx
		}
		return term(a), term(b)
	}
	recent := samples[max(0, len(samples)-maxRecent):]
	xs, ys := make([]float64, len(recent)), make([]float64, len(recent))
	for i, s := range recent {
		xs[i], ys[i] = float64(s.Remote), max(0, s.Seconds)
	}
	xm, ym := median(xs), median(ys)
	a := ym
	if open.Known() && open.Value < ym {
		a = open.Value
	}
	b := 0.0
	if xm > 0 {
		b = (ym - a) / xm
	}
	return term(a), term(b)
}

// Model is safe for concurrent use.
type Model struct {
	mu   sync.Mutex
	st   State
	path string // "" keeps it in memory
	now  func() time.Time
}

// New returns an empty, in-memory model.
func New() *Model { return &Model{now: time.Now} }

// Load reads the model of a data directory (an empty one when there is no
// file or it does not decode: the model recalibrates, it never fails a job).
// Observations are written back with datadir.WriteFileAtomic.
func Load(dataDir string) *Model {
	m := New()
	if dataDir == "" {
		return m
	}
	m.path = filepath.Join(dataDir, File)
	if b, err := os.ReadFile(m.path); err == nil {
		var st State
		if json.Unmarshal(b, &st) == nil {
			m.st = st
		}
	}
	return m
}

// SetClock replaces time.Now (tests).
func (m *Model) SetClock(now func() time.Time) { m.now = now }

// State returns a copy of the measurements.
func (m *Model) State() State {
	m.mu.Lock()
	defer m.mu.Unlock()
	st := m.st
	st.Transfers = append([]Transfer(nil), st.Transfers...)
	if st.Rebuild != nil {
		st.Rebuild = make(map[string]Term, len(m.st.Rebuild))
		for k, v := range m.st.Rebuild {
			st.Rebuild[k] = v
		}
	}
	return st
}

func (m *Model) saveLocked() error {
	if m.path == "" {
		return nil
	}
	b, err := json.MarshalIndent(m.st, "", "  ")
	if err != nil {
		return err
	}
	return datadir.WriteFileAtomic(m.path, append(b, '\n'))
}

// ObserveTransfer records a store transfer (a standby sync, an upload, a
// restore's download). A transfer of at least MinFetchBytes measures the
// bandwidth; a smaller one (a standby's sync of a small delta) the
// per-object latency (fitTransfers).
func (m *Model) ObserveTransfer(t Transfer) error {
	if t.Bytes <= 0 || t.Seconds <= 0 {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if t.Time.IsZero() {
		t.Time = m.now()
	}
	if t.Parallelism <= 0 {
		t.Parallelism = DefaultParallelism
	}
	if t.Objects <= 0 {
		t.Objects = 1
	}
	m.st.Transfers = appendTransfer(m.st.Transfers, t)
	return m.saveLocked()
}

// small reports whether a transfer is too small to measure the bandwidth:
// its time is its objects' fixed costs.
func (t Transfer) small() bool { return t.Bytes < MinFetchBytes }

// appendTransfer appends t and drops the oldest transfer of t's kind
// (small or not) beyond maxTransfers of that kind, so that frequent small
// syncs do not push the bandwidth's measurements out.
func appendTransfer(ts []Transfer, t Transfer) []Transfer {
	ts = append(ts, t)
	n := 0
	for _, u := range ts {
		if u.small() == t.small() {
			n++
		}
	}
	if n <= maxTransfers {
		return ts
	}
	for i, u := range ts {
		if u.small() == t.small() {
			return append(ts[:i:i], ts[i+1:]...)
		}
	}
	return ts
}

// fitTransfers returns the bandwidth and per-object latency terms, from
// the downloads when there is one, else the uploads. The two are measured
// by different transfers, not fitted together: the bytes and object counts
// of a node's large transfers (its restores and syncs of the same state)
// are nearly collinear, and a least-squares fit of both trades one for the
// other — on a throttled file store it gave 25 ms "per object" where a
// request costs well under 1 ms, from the link's burst (a fixed saving per
// transfer) spread over the objects. So:
//
//   - latency: the median over the small transfers (under MinFetchBytes,
//     whose time is their objects' fixed costs) of (seconds − bytes ÷ bw)
//     ÷ (objects ÷ parallelism), at least 0, bw being the bandwidth below;
//     not known (0) until there is a small transfer;
//   - bandwidth: Σbytes ÷ Σ(seconds − latency × objects ÷ parallelism) of
//     the large transfers (Σbytes ÷ Σseconds when that is not positive);
//     not known until there is a large transfer.
//
// (The two are iterated to their fixed point, from bw = Σbytes ÷ Σseconds.)
func fitTransfers(ts []Transfer) (bw, lat Term) {
	var down []Transfer
	for _, t := range ts {
		if !t.Upload {
			down = append(down, t)
		}
	}
	if len(down) == 0 {
		down = ts
	}
	var large, small []Transfer
	for _, t := range down {
		if t.small() {
			small = append(small, t)
		} else {
			large = append(large, t)
		}
	}
	perPar := func(t Transfer) float64 { return float64(max(1, t.Objects)) / float64(max(1, t.Parallelism)) }
	var sb, ss float64
	for _, t := range large {
		sb += float64(t.Bytes)
		ss += t.Seconds
	}
	bwv := 0.0
	if ss > 0 {
		bwv = sb / ss
	}
	// The two depend on each other only through the small transfers'
	// bytes (a small correction): iterate to the fixed point.
	latv := 0.0
	for range 50 {
		if len(small) > 0 {
			v := make([]float64, 0, len(small))
			for _, t := range small {
				fixed := t.Seconds
				if bwv > 0 {
					fixed -= float64(t.Bytes) / bwv
				}
				v = append(v, max(0, fixed)/perPar(t))
			}
			latv = median(v)
		}
		next := bwv
		if st := ss - latv*sumPerPar(large, perPar); st > 0 {
			next = sb / st
		}
		if next == bwv {
			break
		}
		bwv = next
	}
	if len(small) > 0 {
		last := small[len(small)-1]
		lat = Term{Value: latv, Samples: len(small), Measured: last.Time, From: last.From}
	}
	if len(large) > 0 {
		last := large[len(large)-1]
		bw = Term{Value: bwv, Samples: len(large), Measured: last.Time, From: last.From}
	}
	return bw, lat
}

func sumPerPar(ts []Transfer, perPar func(Transfer) float64) float64 {
	n := 0.0
	for _, t := range ts {
		n += perPar(t)
	}
	return n
}

// Terms returns every term as calibrated now: the names above, and the
// rebuild rates by worker count (RebuildKey).
func (m *Model) Terms() map[string]Term {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.termsLocked()
}

func (m *Model) termsLocked() map[string]Term {
	bw, lat := fitTransfers(m.st.Transfers)
	onOpen, remote := fitOnline(m.st.Online, m.st.Open, m.st.Remote)
	t := map[string]Term{TermBandwidth: bw, TermLatency: lat, TermRequest: m.st.Request, TermOpen: m.st.Open, TermDecode: m.st.Decode, TermMove: m.st.Move,
		TermRemote: remote, TermOnlineOpen: onOpen}
	for k, v := range m.st.Rebuild {
		t[k] = v
	}
	return t
}

// Prediction is a predicted restore time with its inputs.
type Prediction struct {
	In Input
	// OK is false while a term the input needs is not calibrated
	// (Missing names them); Seconds is then 0.
	OK      bool
	Missing []string
	// Seconds is the sum of the terms less Overlap.
	Seconds                       float64
	Fetch, Latency, Rebuild, Open float64
	// Requests is the part of Latency that is In.Requests' (at the request
	// term, or at the per-object latency while the request term is not
	// measured: RequestsAtObject).
	Requests         float64
	RequestsAtObject bool
	// Overlap is the part of the fetch and the rebuild that run at the
	// same time (a full checkpoint: min(Fetch + Latency, Rebuild)).
	Overlap float64
	// RebuildWorkers is the worker count whose measured rate Rebuild
	// used (0: scaled from the per-worker rate).
	RebuildWorkers int
	// Terms are the terms used.
	Terms map[string]Term
	now   time.Time
}

// Duration is Seconds as a duration (0 when not OK).
func (p Prediction) Duration() time.Duration {
	return time.Duration(p.Seconds * float64(time.Second))
}

// Predict predicts a restore.
func (m *Model) Predict(in Input) Prediction {
	m.mu.Lock()
	defer m.mu.Unlock()
	return predict(m.termsLocked(), in, m.now())
}

// PredictLowerBound predicts like Predict, except that an open time not
// calibrated yet counts as 0 (the prediction is then a lower bound): for
// decisions that must act before the node's first restore (the restore
// budget), where the fetch dominates.
func (m *Model) PredictLowerBound(in Input) Prediction {
	m.mu.Lock()
	defer m.mu.Unlock()
	t := m.termsLocked()
	if !t[TermOpen].Known() {
		t[TermOpen] = Term{Samples: 1, From: "not calibrated: counted as 0"}
	}
	return predict(t, in, m.now())
}

func predict(t map[string]Term, in Input, now time.Time) Prediction {
	p := Prediction{In: in, Terms: t, now: now}
	need := func(name string) Term {
		if !t[name].Known() {
			p.Missing = append(p.Missing, name)
		}
		return t[name]
	}
	open := need(TermOpen)
	p.Open = open.Value
	if in.BytesFetch > 0 {
		bw := need(TermBandwidth)
		if bw.Value > 0 {
			p.Fetch = float64(in.BytesFetch) / bw.Value
		}
		rate, atObject := requestRate(t)
		p.Requests, p.RequestsAtObject = rate*float64(in.Requests)/in.par(), atObject && in.Requests > 0
		p.Latency = t[TermLatency].Value*float64(in.Objects)/in.par() + p.Requests
	}
	if r := in.rebuildTerm(); r != "" {
		rate, w := rebuildRate(t, r, in.Workers)
		if w == 0 {
			rate = need(r).Value / in.workers()
		}
		p.Rebuild, p.RebuildWorkers = rate*float64(in.BytesRebuild)/(1<<30), w
	}
	if len(p.Missing) > 0 {
		p.Fetch, p.Latency, p.Requests, p.Rebuild, p.Open, p.RebuildWorkers = 0, 0, 0, 0, 0, 0
		return p
	}
	p.OK = true
	if in.streams() {
		p.Overlap = min(p.Fetch+p.Latency, p.Rebuild)
	}
	p.Seconds = p.Fetch + p.Latency + p.Rebuild + p.Open - p.Overlap
	return p
}

// requestRate is the seconds per read that writes no file: the request
// term once a full restore has measured it, until then the per-object
// latency (atObject), which costs a request and a file more: an upper
// bound.
func requestRate(t map[string]Term) (rate float64, atObject bool) {
	if r := t[TermRequest]; r.Known() {
		return r.Value, false
	}
	return t[TermLatency].Value, true
}

// rebuildRate is the wall seconds per GiB of the rebuild term measured at
// workers (w = max(1, workers)), or w = 0 when that worker count has not
// been measured.
func rebuildRate(t map[string]Term, term string, workers int) (rate float64, w int) {
	if k := t[RebuildKey(term, workers)]; k.Known() {
		return k.Value, max(1, workers)
	}
	return 0, 0
}

// Online is the prediction's online-restore terms: processing
// starts after the online open (the open term until an online restore has
// measured one), the download of Pebble's metadata files (KiBs: the
// objects that are not SSTs × the per-object latency ÷ parallelism) and
// the placing of every SST left in the store (SSTs × the remote term;
// every object when In.SSTs is not known), and the state is fully local
// after the download's fetch and latency terms. ok is false when the
// prediction is not OK (calibrating) or the restore cannot be online (a
// full checkpoint, a scale-down). Until an online restore has been
// measured, first is the open time alone: a lower bound (OnlineText says
// so).
func (p Prediction) Online() (first, fullyLocal float64, ok bool) {
	if !p.OK || p.In.Mode != Incremental || p.In.Rescale == Down {
		return 0, 0, false
	}
	first = p.Open
	if o := p.Terms[TermOnlineOpen]; o.Known() && p.In.BytesFetch > 0 {
		first = o.Value
	}
	first += p.In.onlineFixed(p.Terms)
	return first, first + p.Fetch + p.Latency, true
}

// onlineFixed is an online restore's time before the DBs open beyond the
// open term: the metadata downloads and the SSTs placed.
func (in Input) onlineFixed(t map[string]Term) float64 {
	if in.BytesFetch <= 0 {
		return 0
	}
	meta, remote := in.onlineSplit()
	return t[TermLatency].Value*float64(meta)/in.par() + t[TermRemote].Value*float64(remote)
}

// onlineSplit is an online restore's objects downloaded before the open
// (meta) and left in the store (remote).
func (in Input) onlineSplit() (meta, remote int) {
	if in.SSTs > 0 && in.SSTs <= in.Objects {
		return in.Objects - in.SSTs, in.SSTs
	}
	return 0, in.Objects
}

// OnlineText says Online in words ("" when it does not apply).
func (p Prediction) OnlineText() string {
	first, local, ok := p.Online()
	if !ok {
		return ""
	}
	if p.In.BytesFetch > 0 && !p.Terms[TermRemote].Known() {
		return fmt.Sprintf("online: processing after at least %s (placing remote files not measured yet), fully local after %s", Seconds(first), Seconds(local))
	}
	return fmt.Sprintf("online: processing after %s, fully local after %s", Seconds(first), Seconds(local))
}

// ObserveOnline learns from an online restore of in whose DBs opened after
// first (the restore's duration): its time beyond its metadata downloads
// (per-object latency) is a sample of the online open and the placing of
// its in.SSTs remote files (in.Objects when in.SSTs is 0), the two terms
// fitOnline fits. It returns the prediction the model made before
// learning.
func (m *Model) ObserveOnline(in Input, first time.Duration, from string) (Prediction, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	t := m.termsLocked()
	before := predict(t, in, now)
	if in.Objects <= 0 || in.BytesFetch <= 0 {
		return before, nil
	}
	meta, remote := in.onlineSplit()
	if remote <= 0 {
		return before, nil
	}
	rest := first.Seconds() - t[TermLatency].Value*float64(meta)/in.par()
	m.st.Online = append(m.st.Online, OnlineSample{Remote: remote, Seconds: max(0, rest), From: from, Time: now})
	if len(m.st.Online) > maxOnline {
		m.st.Online = m.st.Online[len(m.st.Online)-maxOnline:]
	}
	return before, m.saveLocked()
}

// ObserveRestore learns from a measured restore of in that took d, and
// returns the prediction the model made for it before learning. Each
// restore calibrates the one term it isolates: a restore that fetches and
// rebuilds nothing measures the open time; one that rebuilds measures its
// rebuild term at its worker count (once the open time and bandwidth are
// known; a full checkpoint's only when its fetch is at most half of the
// rest, since the two overlap; when its fetch is more than half, the time
// beyond its bytes at the bandwidth is its requests', the request term);
// one that fetches is a transfer for the bandwidth fit (its time less the
// open time).
func (m *Model) ObserveRestore(in Input, d time.Duration, from string) (Prediction, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	t := m.termsLocked()
	before := predict(t, in, now)
	secs := d.Seconds()
	set := func(term *Term, v float64) { term.observe(v, now, from) }
	rebuild := in.rebuildTerm()
	switch {
	case in.BytesFetch == 0 && rebuild == "":
		set(&m.st.Open, secs)
	case rebuild != "" && t[TermOpen].Known() && (in.BytesFetch == 0 || t[TermBandwidth].Known()):
		fetch, bytes := 0.0, 0.0
		if in.BytesFetch > 0 {
			rate, _ := requestRate(t)
			bytes = float64(in.BytesFetch)/t[TermBandwidth].Value + t[TermLatency].Value*float64(in.Objects)/in.par()
			fetch = bytes + rate*float64(in.Requests)/in.par()
		}
		wall := secs - t[TermOpen].Value
		if in.streams() {
			// Overlapped: the rebuild is the time unless the fetch hides it.
			if fetch > wall/2 {
				// The fetch sets the time: beyond its bytes, the time is
				// its requests' (and the little of the rebuild that
				// follows the last read).
				if in.Requests <= 0 || in.BytesFetch <= 0 {
					return before, nil
				}
				set(&m.st.Request, (wall-bytes)/(float64(in.Requests)/in.par()))
				return before, m.saveLocked()
			}
		} else {
			wall -= fetch
		}
		perGiB := wall / (float64(in.BytesRebuild) / (1 << 30))
		if m.st.Rebuild == nil {
			m.st.Rebuild = map[string]Term{}
		}
		k := m.st.Rebuild[RebuildKey(rebuild, in.Workers)]
		set(&k, perGiB)
		m.st.Rebuild[RebuildKey(rebuild, in.Workers)] = k
		if rebuild == TermDecode {
			set(&m.st.Decode, perGiB*in.workers())
		} else {
			set(&m.st.Move, perGiB*in.workers())
		}
	case rebuild == "" && in.BytesFetch >= MinFetchBytes && t[TermOpen].Known() && secs > t[TermOpen].Value:
		m.st.Transfers = appendTransfer(m.st.Transfers, Transfer{Bytes: in.BytesFetch, Objects: max(1, in.Objects), Parallelism: int(in.par()),
			Seconds: secs - t[TermOpen].Value, From: from, Time: now})
	default:
		return before, nil
	}
	return before, m.saveLocked()
}

// Text is the prediction with its inputs, for people: "4 objects, 15.3 MB
// at 8.1 MB/s measured 3 min ago + 0.2 s rebuild + 22 ms open = 2.1 s", or
// "calibrating (no store bandwidth measured yet)".
func (p Prediction) Text() string {
	if !p.OK {
		var why []string
		for _, m := range p.Missing {
			why = append(why, missingText[m])
		}
		return "calibrating (" + strings.Join(why, ", ") + ")"
	}
	var parts []string
	if p.In.BytesFetch > 0 {
		bw := p.Terms[TermBandwidth]
		s := fmt.Sprintf("%d objects, %s at %s/s measured %s", p.In.Objects, Bytes(p.In.BytesFetch), Bytes(int64(bw.Value)), Ago(p.now.Sub(bw.Measured)))
		if p.In.Requests > 0 {
			s = fmt.Sprintf("%d requests, %s at %s/s measured %s", p.In.Requests, Bytes(p.In.BytesFetch), Bytes(int64(bw.Value)), Ago(p.now.Sub(bw.Measured)))
		}
		if p.In.Objects > 0 && !p.Terms[TermLatency].Known() {
			s += " (per-object latency not measured yet: in the bandwidth)"
		} else if obj := p.Latency - p.Requests; obj > 0 {
			s += fmt.Sprintf(" + %s per-object latency", Seconds(obj))
		}
		if p.Requests > 0 {
			what := "per-request latency"
			if p.RequestsAtObject {
				what += " (at the per-object latency: ranged reads not measured yet)"
			}
			s += fmt.Sprintf(" + %s %s", Seconds(p.Requests), what)
		}
		parts = append(parts, s)
	} else {
		parts = append(parts, "nothing to fetch")
	}
	if p.Rebuild > 0 || p.In.rebuildTerm() != "" {
		what := "rebuild"
		if p.In.rebuildTerm() == TermMove {
			what = "key groups moved"
		}
		at := "measured at " + workersText(p.RebuildWorkers)
		if p.RebuildWorkers == 0 {
			at = "scaled to " + workersText(p.In.Workers)
		}
		parts = append(parts, fmt.Sprintf("%s %s (%s, %s)", Seconds(p.Rebuild), what, Bytes(p.In.BytesRebuild), at))
	}
	if p.In.streams() && p.In.BytesFetch > 0 && len(parts) == 2 {
		// The rebuild decodes the fetch as it arrives: the slower one counts.
		parts = []string{"max(" + parts[0] + ", " + parts[1] + ")"}
	}
	parts = append(parts, Seconds(p.Open)+" open")
	return strings.Join(parts, " + ") + " = " + Seconds(p.Seconds)
}

func workersText(n int) string {
	if n <= 1 {
		return "1 worker"
	}
	return fmt.Sprintf("%d workers", n)
}

// Short is the predicted time, or "calibrating".
func (p Prediction) Short() string {
	if !p.OK {
		return "calibrating"
	}
	return Seconds(p.Seconds)
}

var missingText = map[string]string{
	TermBandwidth: "no store bandwidth measured yet",
	TermOpen:      "no open time measured yet: a restore from the local copy measures it",
	TermDecode:    "no full-checkpoint rebuild measured yet",
	TermMove:      "no scale-down measured yet",
}

// Seconds formats a duration in seconds for reading: ms below a second
// (two decimals below 1 ms), s with two decimals below 100 s.
func Seconds(s float64) string {
	if s >= 100 {
		return time.Duration(s * float64(time.Second)).Round(time.Second).String()
	}
	unit, v, prec := "s", s, 2
	if s < 1 {
		unit, v, prec = "ms", s*1000, 0
		if s < 0.001 {
			prec = 2
		}
	}
	if s == 0 {
		prec = 0
	}
	return fmt.Sprintf("%.*f %s", prec, v, unit)
}

// Bytes formats a byte count in SI units ("15.3 MB").
func Bytes(b int64) string {
	f := float64(b)
	for _, u := range []string{"B", "kB", "MB", "GB", "TB"} {
		if math.Abs(f) < 1000 || u == "TB" {
			if u == "B" {
				return fmt.Sprintf("%d B", b)
			}
			return fmt.Sprintf("%.1f %s", f, u)
		}
		f /= 1000
	}
	return ""
}

// Ago is an age for reading: "3 min ago".
func Ago(d time.Duration) string {
	switch {
	case d < 2*time.Second:
		return "just now"
	case d < 2*time.Minute:
		return fmt.Sprintf("%.0f s ago", d.Seconds())
	case d < 2*time.Hour:
		return fmt.Sprintf("%.0f min ago", d.Minutes())
	case d < 48*time.Hour:
		return fmt.Sprintf("%.0f h ago", d.Hours())
	}
	return fmt.Sprintf("%.0f days ago", d.Hours()/24)
}
