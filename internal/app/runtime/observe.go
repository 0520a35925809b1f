package runtime

import (
	"context"
	"encoding/json"
	"os"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"cairn/checkpoint"
	"cairn/engine"
	"cairn/internal/app/dashboard"
	"cairn/internal/app/runtime/online"
	"cairn/recovery"
	"cairn/recovery/model"
)

// observer turns the engine's, the checkpoint writer's and the restore's
// figures into dashboard snapshots. A background loop appends each finished
// checkpoint once (entries never change afterwards) and refreshes the input
// stream's last sequence, so Snapshot stays cheap.
type observer struct {
	r        *Running
	js       jetstream.JetStream // for the input stream's last sequence; nil if unavailable
	drillMod time.Time           // modification time of the drill report last read (refresh goroutine only)
	// model is the restore model of the job's data directory: every real
	// restore and every checkpoint's upload calibrate it, and it predicts
	// each checkpoint's restore (the same number `cairn checkpoints ls`
	// prints from the same file).
	model *model.Model
	// watch is the unbounded-state detector (growth.go), advice the
	// checkpoint mode advisor (advise.go).
	watch  *stateWatch
	advice *adviser
	// onlineObserved is set once an online restore's finished background
	// download calibrated the model (refresh goroutine only).
	onlineObserved bool

	mu struct {
		sync.Mutex
		checkpoints []dashboard.Checkpoint // finished checkpoints, oldest first
		ended       []checkpoint.Stats     // the writer's events not yet turned into checkpoints
		streamLast  uint64
		// streamKnown: streamLast was read from the server at least once.
		streamKnown bool
		// subLast: a job graph's sub-topologies' input streams' last
		// sequences, by sub-topology name (absent: not read yet).
		subLast  map[string]uint64
		restores []dashboard.Restore
		drill    []byte
		// latency are the last sub-topology's latency histograms of the
		// last refreshes, oldest first (latencyWindow).
		latency []latencySample
	}
}

// latencyWindow is the span of the dashboard's latency quantiles.
const latencyWindow = 10 * time.Second

type latencySample struct {
	at time.Time
	l  engine.Latency
}

// latencyLocked is the record latency of the job (a job graph's last
// sub-topology): the histogram since the start, and its quantiles over the
// last latencyWindow.
func (o *observer) latencyLocked(now time.Time, l engine.Latency) *dashboard.Latency {
	if len(l.Counts) == 0 {
		return nil
	}
	o.mu.latency = append(o.mu.latency, latencySample{now, l})
	for len(o.mu.latency) > 1 && now.Sub(o.mu.latency[1].at) >= latencyWindow {
		o.mu.latency = o.mu.latency[1:]
	}
	recent := l.Sub(o.mu.latency[0].l)
	if len(o.mu.latency) == 1 {
		recent = l
	}
	return &dashboard.Latency{Bounds: engine.LatencyBounds[:], Counts: l.Counts, Sum: l.Sum, P50: recent.Quantile(0.5), P99: recent.Quantile(0.99)}
}

// HistoryLimit is how many checkpoints the dashboard's history keeps.
const HistoryLimit = 500

func newObserver(r *Running) *observer {
	o := &observer{r: r, model: r.model}
	if o.model == nil {
		o.model = model.Load(r.Job.DataDir)
	}
	o.watch, o.advice = newStateWatch(r, observerLog(r)), &adviser{}
	if r.NC != nil {
		o.js, _ = jetstream.New(r.NC)
	}
	if r.events != nil {
		r.events.subscribe(func(s checkpoint.Stats) {
			o.mu.Lock()
			o.mu.ended = append(o.mu.ended, s)
			o.mu.Unlock()
		})
	}
	if res := r.Restored; res != nil {
		// The prediction the model made before this restore, then the
		// restore calibrates it.
		// (A model that cannot be saved only recalibrates next time.)
		var pred model.Prediction
		var predicted time.Duration
		if res.FilesRemote == 0 {
			pred, _ = o.model.ObserveRestore(recovery.ResultInput(res, 0), res.Duration, "restore")
			predicted = pred.Duration()
		} else {
			// An online restore's duration is its time to processing, not
			// a download's: it calibrates the online terms.
			predicted = observeOnlineRestore(o.model, res)
		}
		o.mu.restores = append(o.mu.restores, restoreEntry(res, predicted))
	}
	return o
}

// restoresLocked is the restore history, the last entry with an online
// restore's download as it is now.
func (o *observer) restoresLocked() []dashboard.Restore {
	rs := append([]dashboard.Restore(nil), o.mu.restores...)
	if d := o.r.online; d != nil && len(rs) > 0 {
		last := &rs[len(rs)-1]
		last.BytesRemote, last.FullyLocal = d.Status()
	}
	return rs
}

// onlineInput is an online restore's result as the model's input: every
// object it did not find on local disk, placed as a remote file (the SSTs,
// In.SSTs) or downloaded before the open (the metadata), as
// recovery.PlanRestore counts them for the online prediction.
func onlineInput(res *recovery.Result) model.Input {
	in := recovery.ResultInput(res, 0)
	in.Objects, in.BytesFetch = res.FilesRemote+res.FilesDownloaded, res.BytesRemote+res.BytesDownloaded
	// The remote files are the SSTs; the downloaded ones are the metadata.
	in.SSTs = res.FilesRemote
	return in
}

// observeOnlineRestore calibrates the model's online terms with an online
// restore whose DBs opened after res.Duration (the remote term: the time
// beyond the open, per object placed or fetched), and returns the time to
// processing the model predicted before it (0: calibrating).
func observeOnlineRestore(m *model.Model, res *recovery.Result) time.Duration {
	pred, _ := m.ObserveOnline(onlineInput(res), res.Duration, "online restore")
	first, _, ok := pred.Online()
	if !ok {
		return 0
	}
	return time.Duration(first * float64(time.Second))
}

// observeOnlineDownload calibrates the store bandwidth with an online
// restore's finished background download: the bytes remote at the start,
// in as many objects at online.Concurrency, over fullyLocal. A download
// capped by restore.online_rate (rate > 0) measures the cap, not the store,
// and calibrates nothing. It reports whether it recorded a transfer.
func observeOnlineDownload(m *model.Model, res *recovery.Result, fullyLocal time.Duration, rate int64) bool {
	if rate > 0 || fullyLocal <= 0 || res.Remote == nil {
		return false
	}
	files, bytes := res.Remote.Total()
	if files == 0 {
		return false
	}
	t := model.Transfer{Bytes: bytes, Objects: files, Parallelism: online.Concurrency, Seconds: fullyLocal.Seconds(), From: "online restore"}
	if t.Bytes < model.MinFetchBytes {
		return false
	}
	return m.ObserveTransfer(t) == nil
}

func restoreEntry(res *recovery.Result, predicted time.Duration) dashboard.Restore {
	src := "store"
	switch {
	case res.Savepoint != "":
		src = "savepoint"
	case res.BytesCache > 0 && res.BytesCache >= res.BytesDownloaded:
		src = "standby"
	case res.BytesDownloaded == 0 && res.BytesLocal > 0:
		src = "local"
	}
	return dashboard.Restore{
		CheckpointID: res.ID, Mode: string(res.Mode), Time: time.Now(), Duration: res.Duration,
		BytesLocal: res.BytesLocal + res.BytesCache, BytesDownloaded: res.BytesDownloaded, Files: res.Files,
		Rescaled: res.Rescaled, FromSlots: res.FromSlots, ToSlots: res.ToSlots, ChainLength: res.ChainLength, Source: src,
		// The restored checkpoint's own numbers, from its manifest: they are
		// what the restore is compared with, also after a process restart.
		CheckpointDuration: res.Figures.SyncMax + res.Figures.Async, PredictedRestore: predicted,
		Online: res.FilesRemote > 0, BytesRemote: res.BytesRemote, BytesMoved: res.BytesMoved,
	}
}

// run refreshes every second until ctx ends (serveHTTP refreshes first).
func (o *observer) run(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		o.refresh(ctx)
	}
}

func (o *observer) refresh(ctx context.Context) {
	r := o.r
	if r.DrillReport != "" {
		// The last drill's results (cairn drill --out DIR writes drill.json),
		// read again only when the file changes.
		if fi, err := os.Stat(r.DrillReport); err == nil && !fi.ModTime().Equal(o.drillMod) {
			if b, err := os.ReadFile(r.DrillReport); err == nil && json.Valid(b) {
				o.drillMod = fi.ModTime()
				o.mu.Lock()
				o.mu.drill = b
				o.mu.Unlock()
			}
		}
	}
	if o.js != nil {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		if s, err := o.js.Stream(cctx, r.Job.Input.Stream); err == nil {
			o.mu.Lock()
			o.mu.streamLast, o.mu.streamKnown = s.CachedInfo().State.LastSeq, true
			o.mu.Unlock()
		}
		for _, sub := range r.Downstream {
			if s, err := o.js.Stream(cctx, sub.Job.Input.Stream); err == nil {
				o.mu.Lock()
				if o.mu.subLast == nil {
					o.mu.subLast = map[string]uint64{}
				}
				o.mu.subLast[sub.Job.Name] = s.CachedInfo().State.LastSeq
				o.mu.Unlock()
			}
		}
		cancel()
	}
	o.watch.tick(time.Now())
	if d := r.online; d != nil && !o.onlineObserved {
		if _, fullyLocal := d.Status(); fullyLocal > 0 {
			// (A model that cannot be saved only recalibrates next time.)
			o.onlineObserved = true
			observeOnlineDownload(o.model, d.Result(), fullyLocal, d.Rate())
		}
	}
	if r.Writer == nil {
		return
	}
	o.mu.Lock()
	fresh := o.mu.ended
	o.mu.ended = nil
	o.mu.Unlock()
	if len(fresh) == 0 {
		return
	}
	// Retained storage as of now, for the new entries.
	retained := map[uint64]checkpoint.ListEntry{}
	if list, err := checkpoint.List(ctx, r.Store, r.Job.Name); err == nil {
		for _, e := range list {
			retained[e.ID] = e
		}
	}
	o.advice.update(ctx, r, o.model)
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, s := range fresh {
		f := s.Figures
		c := dashboard.Checkpoint{
			ID: s.ID, Mode: string(s.Mode), Time: s.Time,
			SyncDuration: f.SyncMax, AsyncDuration: f.Async,
			BytesUploaded: f.BytesUploaded, FullStateSize: f.FullStateSize,
			FilesUploaded: f.FilesUploaded, FilesReused: f.FilesReused, ChainLength: s.ChainLength,
			RetainedExclusive: retained[s.ID].RetainedExclusive, RetainedShared: retained[s.ID].RetainedShared,
		}
		if r.committer != nil {
			c.Reason = r.committer.reason(s.ID)
		}
		if s.Err != nil {
			c.Failed, c.Error = true, s.Err.Error()
		} else {
			// (The committer calibrated the model with this upload.)
			p := o.model.Predict(recovery.StoreInput(s.Mode, 0, r.Job.KeyGroups, f))
			c.PredictedRestore, c.Prediction = p.Duration(), p.Text()
			if t := p.OnlineText(); t != "" {
				c.Prediction += "; " + t
			}
		}
		o.mu.checkpoints = append(o.mu.checkpoints, c)
	}
	if n := len(o.mu.checkpoints); n > HistoryLimit {
		o.mu.checkpoints = o.mu.checkpoints[n-HistoryLimit:]
	}
}

// Snapshot implements dashboard.Source.
func (o *observer) Snapshot() dashboard.Snapshot {
	r := o.r
	st := r.Engine.Stats()
	o.mu.Lock()
	defer o.mu.Unlock()
	wm := st.Watermark // math.MinInt64 when there is none yet
	var subs []dashboard.SubTopology
	// lastStats is the last sub-topology's (the job's, without a graph):
	// its record latency is the dashboard's.
	lastStats := st
	repeats := st.RepeatsDropped // a graph's are its downstream sub-topologies'
	missing := st.UpstreamMissing
	if len(r.Downstream) > 0 {
		g := r.graph.latest()
		for i, sub := range r.SubTopologies() {
			sst := st
			last, known := max(o.mu.streamLast, st.ConsumedSeq), o.mu.streamKnown
			if i > 0 {
				sst = sub.Engine.Stats()
				l, ok := o.mu.subLast[sub.Job.Name]
				last, known = max(l, sst.ConsumedSeq), ok
			}
			lastStats = sst
			if i > 0 {
				repeats += sst.RepeatsDropped
				missing += sst.UpstreamMissing
			}
			var state uint64
			for _, b := range sst.StateBytes {
				state += b
			}
			d := dashboard.SubTopology{
				Name: sub.Job.Name, Slots: sub.Job.Slots, RecordsIn: sst.RecordsIn, RecordsOut: sst.RecordsOut, DeadLetters: sst.DeadLetters,
				ProcessedSeq: sst.ProcessedSeq, StreamLastSeq: last, Watermark: sst.Watermark, StateBytes: state,
				LagUnknown: o.js != nil && !known,
			}
			if g != nil {
				if p, ok := g.Part(sub.Job.Name); ok {
					d.GraphCheckpoint, d.GraphPart = g.ID, p.Checkpoint
				}
			}
			subs = append(subs, d)
		}
	}
	lat := o.latencyLocked(time.Now(), lastStats.Latency)
	var interval time.Duration
	if r.Job.Checkpoint != nil {
		interval = r.Job.Checkpoint.Interval
	}
	return dashboard.Snapshot{
		Delivery: r.Job.Output.Delivery, CheckpointInterval: interval,
		Latency:       lat,
		SubTopologies: subs,
		Stages:        o.StageStats(),
		Job:           r.Job.Name, Slots: r.Job.Slots, KeyGroups: r.Job.KeyGroups,
		RecordsIn: st.RecordsIn, RecordsOut: st.RecordsOut, DeadLetters: st.DeadLetters, OutputsSkipped: st.OutputsSkipped, RepeatsDropped: repeats, UpstreamMissing: missing,
		ConsumedSeq: st.ConsumedSeq, ProcessedSeq: st.ProcessedSeq, StreamLastSeq: max(o.mu.streamLast, st.ConsumedSeq),
		LagUnknown:    o.js != nil && !o.mu.streamKnown,
		Watermark:     wm,
		StateBytes:    st.StateBytes,
		Checkpoints:   append([]dashboard.Checkpoint(nil), o.mu.checkpoints...),
		Restores:      o.restoresLocked(),
		Drill:         o.mu.drill,
		StateGrowth:   o.watch.snapshot(),
		Advice:        o.advice.snapshot(),
		BrokerWait:    r.brokerWaitSnapshot(),
		BrokerResumes: r.waits.get().Resumes,
	}
}

var _ dashboard.Source = (*observer)(nil)
