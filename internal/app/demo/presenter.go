package demo

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"cairn/checkpoint"
	"cairn/internal/app/dashboard"
	"cairn/internal/app/runtime"
	"cairn/internal/base/datadir"
	"cairn/recovery"
)

// seriesLimit is how many seconds of throughput and lag the demo keeps for
// the dashboard's charts: more than their three-minute window.
const seriesLimit = 600

// chainText says a checkpoint's kind for people: a full checkpoint has no
// chain (a restore reads it alone), an incremental one the length of its.
func chainText(mode string, chain int) string {
	if mode == string(checkpoint.ModeFull) {
		return "full"
	}
	return fmt.Sprintf("%s, chain %d", mode, chain)
}

// offBy is ", +6%": how far a measurement is from its prediction.
func offBy(measured, predicted time.Duration, ok bool) string {
	if !ok || predicted <= 0 {
		return ""
	}
	return fmt.Sprintf(", %+.0f%%", (measured.Seconds()/predicted.Seconds()-1)*100)
}

// watchFirstOutput times the first output the job publishes after its
// restart at from: "first output N after the restart" on the story, in the
// failure's numbers. It listens to the output subjects until the first
// message (or ten minutes: an online restore over a slow link can take minutes to its first output).
func (d *demo) watchFirstOutput(from time.Time) {
	var once sync.Once
	var sub *nats.Subscription
	done := make(chan struct{})
	sub, err := d.nc.Subscribe(demoOutputSubject+".>", func(*nats.Msg) {
		once.Do(func() {
			close(done)
			z := time.Since(from)
			d.mu.Lock()
			f := d.mu.failure
			if f != nil && f.FirstOutput == 0 && f.TimeMs <= from.UnixMilli() {
				f.FirstOutput = z.Seconds()
			} else {
				f = nil
			}
			d.mu.Unlock()
			if f != nil {
				d.storyLine(fmt.Sprintf("first output %s after the restart", fmtDuration(z)))
			}
		})
	})
	if err != nil {
		return
	}
	go func() {
		select {
		case <-done:
		case <-time.After(10 * time.Minute):
		}
		_ = sub.Unsubscribe()
	}()
}

// followOnlineLocked follows an online restore until its state is local:
// the restore's entry and the failure get the moment.
func (d *demo) followOnlineLocked(snap dashboard.Snapshot) {
	i := d.mu.restoreIdx
	if i < 0 || i >= len(d.mu.restores) || len(snap.Restores) == 0 || !d.mu.restores[i].Online {
		return
	}
	r, now := &d.mu.restores[i], snap.Restores[len(snap.Restores)-1]
	if r.FullyLocal > 0 || now.CheckpointID != r.CheckpointID {
		return
	}
	r.BytesRemote = now.BytesRemote
	if now.FullyLocal <= 0 {
		return
	}
	r.FullyLocal = now.FullyLocal
	at := now.Time.Add(now.Duration + now.FullyLocal).Sub(d.mu.restartAt)
	line := fmt.Sprintf("fully local %s after the restart: the online restore downloaded the rest of the state while the job processed", fmtDuration(at))
	if f := d.mu.failure; f != nil && f.Online && f.FullyLocal == 0 {
		f.FullyLocal = at.Seconds()
	}
	d.storyLineLocked(line)
	go d.say(line)
}

// rescalePreview says what a rescale's restore will do, slot by slot, and
// keeps it for the presenter view.
func (d *demo) rescalePreview(p recovery.Plan, predicted time.Duration, ok bool) string {
	rs := &dashboard.Rescale{FromSlots: p.FromSlots, ToSlots: p.ToSlots}
	if ok {
		rs.Predicted = predicted.Seconds()
	}
	var parts []string
	for _, s := range p.Slots {
		rs.BytesPerSlot = append(rs.BytesPerSlot, s.BytesDownload)
		rs.LocalPerSlot = append(rs.LocalPerSlot, s.Bytes-s.BytesDownload)
		parts = append(parts, fmt.Sprintf("slot %d: %s from the store, %s local", s.Slot, runtime.FormatBytes(uint64(s.BytesDownload)), runtime.FormatBytes(uint64(max(0, s.Bytes-s.BytesDownload)))))
	}
	rs.Preview = fmt.Sprintf("rescale %d → %d slots of checkpoint #%d: %s; predicted %s", p.FromSlots, p.ToSlots, p.ID, strings.Join(parts, "; "), fmtPrediction(predicted, ok))
	d.mu.Lock()
	d.mu.rescale = rs
	d.mu.Unlock()
	return rs.Preview
}

// previewRescale plans a restore of the latest checkpoint onto n slots
// without running it: what each new slot would fetch, and the predicted
// time.
func (d *demo) previewRescale(ctx context.Context, n int) (string, error) {
	d.mu.Lock()
	cur := d.mu.slots
	d.mu.Unlock()
	if hi := min(recovery.MaxRescaleFactor*cur, demoKeyGroups); n < 1 || n > hi {
		return "", fmt.Errorf("rescale to %d slots: from %d slots a restore can have 1 to %d", n, cur, hi)
	}
	m, err := checkpoint.Latest(ctx, d.store, demoJobName)
	if err != nil {
		return "", fmt.Errorf("no checkpoint to preview a rescale of: %w", err)
	}
	p, err := recovery.PlanRestore(m, d.restoreOptions(d.jobDir, datadir.Checkpoints(d.jobDir), n))
	if err != nil {
		return "", err
	}
	predicted, ok := d.model.predictPlan(p)
	msg := "preview: " + d.rescalePreview(p, predicted, ok)
	d.storyLine(msg)
	return msg, nil
}

// measureStorage reads the retained checkpoints' and savepoints' manifests
// and sums the objects they reference: what the store holds, and what it
// would hold if only the newest checkpoint were retained.
func (d *demo) measureStorage(ctx context.Context) {
	ms, _, err := checkpoint.LoadIntact(ctx, d.store, demoJobName)
	if err != nil || len(ms) == 0 {
		return
	}
	names, err := checkpoint.ListSavepoints(ctx, d.store, demoJobName)
	if err != nil {
		return
	}
	var sps []*checkpoint.Manifest
	for _, n := range names {
		if m, err := checkpoint.LoadSavepoint(ctx, d.store, demoJobName, n); err == nil {
			sps = append(sps, m)
		}
	}
	sum := func(ms ...*checkpoint.Manifest) int64 {
		seen := map[string]bool{}
		var b int64
		for _, m := range ms {
			for _, o := range m.Objects {
				if !seen[o.Path] {
					seen[o.Path] = true
					b += o.Size
				}
			}
		}
		return b
	}
	latest := ms[len(ms)-1]
	st := &dashboard.Storage{Retained: sum(append(slices.Clone(ms), sps...)...), Logical: latest.Figures.FullStateSize,
		Checkpoints: len(ms), Savepoints: len(sps), RetainOne: sum(append([]*checkpoint.Manifest{latest}, sps...)...)}
	st.SavedByOne = st.Retained - st.RetainOne
	d.mu.Lock()
	d.mu.storage = st
	d.mu.Unlock()
}

// sampleLocked adds a point to the throughput and lag history.
func (d *demo) sampleLocked(lag uint64) {
	s := d.mu.snap
	d.mu.series = append(d.mu.series, dashboard.Sample{TimeMs: time.Now().UnixMilli(), RecordsIn: s.RecordsIn, RecordsOut: s.RecordsOut, Lag: lag})
	if n := len(d.mu.series); n > seriesLimit {
		d.mu.series = slices.Delete(d.mu.series, 0, n-seriesLimit)
	}
}

// presenterLocked is the presenter view's numbers.
func (d *demo) presenterLocked() *dashboard.Presenter {
	p := &dashboard.Presenter{Simulates: d.simulates()}
	var durs []time.Duration
	var lastInc, lastFull *dashboard.Checkpoint
	for i := range d.mu.history {
		c := &d.mu.history[i]
		if c.Failed {
			continue
		}
		durs = append(durs, c.SyncDuration+c.AsyncDuration)
		if c.Mode == string(checkpoint.ModeFull) {
			lastFull = c
		} else {
			lastInc = c
		}
	}
	if len(durs) > 10 {
		durs = durs[len(durs)-10:]
	}
	if len(durs) > 0 {
		s := slices.Clone(durs)
		slices.Sort(s)
		p.CheckpointP50 = s[len(s)/2].Seconds()
	}
	var newest *dashboard.Checkpoint
	if n := len(d.mu.history); n > 0 {
		newest = &d.mu.history[n-1]
	}
	if newest != nil {
		p.StateBytes = newest.FullStateSize
		if pr, ok := d.model.predictCheckpoint(*newest, d.mu.slots); ok {
			p.StoreRestore = pr.Seconds()
		}
		if pr, ok := d.model.predictLocal(*newest); ok {
			p.LocalRestore = pr.Seconds()
		}
		if pr, ok := d.model.predictOnlineCheckpoint(*newest); ok {
			p.OnlineFirst = pr.Seconds()
		}
	}
	if len(durs) < budgetCheckpoints {
		p.CheckpointP50 = 0 // the first after a start verifies the store's copy of what it reuses: not yet typical
	}
	p.Budget = budgetLine(p.CheckpointP50, p.StoreRestore, d.lastStoreRestoreLocked())
	if f := d.mu.failure; f != nil {
		c := *f
		c.Lines = slices.Clone(d.mu.story.Lines)
		p.Last = &c
	}
	if lastInc != nil && lastFull != nil {
		cf := &dashboard.ChainVsFull{ChainID: lastInc.ID, Chain: lastInc.ChainLength, ChainFiles: lastInc.FilesUploaded + lastInc.FilesReused, FullID: lastFull.ID}
		if pr, ok := d.model.predictCheckpoint(*lastInc, d.mu.slots); ok {
			cf.ChainRestore = pr.Seconds()
		}
		if pr, ok := d.model.predictCheckpoint(*lastFull, d.mu.slots); ok {
			cf.FullRestore = pr.Seconds()
		}
		for _, r := range d.mu.restores {
			if r.BytesDownloaded == 0 || r.Rescaled {
				continue
			}
			if r.Mode == string(checkpoint.ModeFull) {
				cf.FullMeasured = r.Duration.Seconds()
			} else if !r.Online {
				cf.ChainMeasured = r.Duration.Seconds()
			}
		}
		p.ChainVsFull = cf
	}
	p.Storage = d.mu.storage
	p.Rescale = d.mu.rescale
	return p
}

// lastStoreRestoreLocked is the last measured restore that downloaded the
// whole state (not online, not rescaled), 0 if none.
func (d *demo) lastStoreRestoreLocked() float64 {
	for i := len(d.mu.restores) - 1; i >= 0; i-- {
		r := d.mu.restores[i]
		if r.BytesLocal == 0 && r.BytesDownloaded > 0 && !r.Online && !r.Rescaled {
			return r.Duration.Seconds()
		}
	}
	return 0
}

// budgetCheckpoints is how many checkpoints the p50 waits for.
const budgetCheckpoints = 5

// budgetLine is the one line the presenter points at.
func budgetLine(checkpoint, predicted, measured float64) string {
	if checkpoint <= 0 {
		return fmt.Sprintf("recovery budget: waiting for %d checkpoints", budgetCheckpoints)
	}
	s := fmt.Sprintf("recovery budget from the checkpoint duration: %s; from a restore from the store: ", fmtDuration(seconds(checkpoint)))
	switch {
	case measured > 0:
		s += fmt.Sprintf("%s measured (%.0f× more)", fmtDuration(seconds(measured)), measured/checkpoint)
	case predicted > 0:
		s += fmt.Sprintf("%s predicted (%.0f× more)", fmtDuration(seconds(predicted)), predicted/checkpoint)
	default:
		s += "calibrating"
	}
	return s
}

// plural is "1 restore", "3 restores".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// simulates says what the demo stands in for.
func (d *demo) simulates() string {
	c := d.cfg
	var parts []string
	if c.stateSize > 0 {
		parts = append(parts, runtime.FormatBytes(uint64(c.stateSize))+" of keyed state, bulk-loaded")
	}
	if !c.link.Off() {
		parts = append(parts, "the checkpoint store behind a "+strings.ReplaceAll(c.link.String(), ",", " link, ")+" per request")
	}
	if len(parts) == 0 {
		return "a small state and a local folder as the store: run cairn demo --scale for the numbers of a remote store"
	}
	return strings.Join(parts, "; ")
}

// budgetChanged reports whether a budget line says something new: a first
// line, a measurement where there was a prediction, or a number off by more
// than a quarter from the one said.
func budgetChanged(said, now string) bool {
	if said == "" || strings.Contains(now, "measured") != strings.Contains(said, "measured") {
		return true
	}
	a, b := lastDuration(said), lastDuration(now)
	return a > 0 && b > 0 && (b > a*5/4 || b < a*3/4)
}

// lastDuration is the duration after "store: " in a budget line.
func lastDuration(line string) time.Duration {
	_, rest, ok := strings.Cut(line, "store: ")
	if !ok {
		return 0
	}
	f, _, _ := strings.Cut(rest, " ")
	d, _ := time.ParseDuration(f)
	return d
}
