package drill

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"

	"cairn/checkpoint"
	"cairn/internal/base/datadir"
	"cairn/internal/base/procs"
	"cairn/internal/base/sysfile"
	"cairn/recovery"
	rmodel "cairn/recovery/model"
)

// scenario is one way of restoring after the kill.
type scenario struct {
	name string
	// sub is the chain's sub-topology ("" for the one-chain job).
	sub    string
	source string // store, local, standby
	id     uint64
	slots  int
	// dataDir is where the restore builds the state; localDir and cacheDir
	// enable local recovery and the standby cache.
	dataDir, localDir, cacheDir string
	// fetch is the bytes the restore is expected to take from the store.
	fetch int64
	// calibrates names the model term this scenario measures ("" none).
	calibrates string
	// online restores online: processing could start when Restore
	// returns; the download to fully local follows.
	online bool
	// want is the state the restore must produce, when it is not the
	// state at the kill (a calibration from an older checkpoint).
	want *digest
}

// restoreAll runs every scenario of chain c. The two that fetch nothing
// from the store run first: they measure the open time (everything but the
// download) of each mode, which the predictions of the others use. Each
// chain has its own restore model, as each sub-topology of a job has (in
// its data directory).
func (d *drill) restoreAll(ctx context.Context, c *chainRun) error {
	cfg := &d.cfg
	chainID, fullID, localKept, want := c.head, c.full, c.localKept, c.want
	mInc, err := checkpoint.Load(ctx, d.store, c.job, chainID)
	if err != nil {
		return err
	}
	mFull, err := checkpoint.Load(ctx, d.store, c.job, fullID)
	if err != nil {
		return err
	}
	manifests := map[uint64]*checkpoint.Manifest{chainID: mInc, fullID: mFull}
	fresh := func(name string) string { return filepath.Join(d.work, "restore-"+c.logPrefix()+name) }
	// The calibrating scenarios run first: each isolates one term of the
	// restore model (the open time, the full rebuild, the scale-down move)
	// that the predictions of the later ones use.
	list := []scenario{
		{name: "local-disk", source: "local", id: chainID, slots: cfg.Slots, dataDir: c.dataDir, localDir: localKept, calibrates: rmodel.TermOpen},
	}
	if cfg.RescaleTo < cfg.Slots {
		list = append(list, scenario{name: fmt.Sprintf("local-rescaled-%d", cfg.RescaleTo), source: "local", id: chainID, slots: cfg.RescaleTo,
			dataDir: fresh("local-rescaled"), localDir: localKept, calibrates: rmodel.TermMove})
	}
	list = append(list,
		scenario{name: "standby", source: "standby", id: fullID, slots: cfg.Slots, dataDir: fresh("standby"), cacheDir: c.sbDir,
			calibrates: rmodel.TermDecode},
	)
	if workers(cfg.RescaleTo) != workers(cfg.Slots) {
		// A rebuild rate holds for the number of slots rebuilding at once
		// (two slots on two shared cores are not twice one): the rescaled
		// full restore's is measured on the standby's cache as well.
		list = append(list, scenario{name: fmt.Sprintf("standby-rescaled-%d", cfg.RescaleTo), source: "standby", id: fullID, slots: cfg.RescaleTo,
			dataDir: fresh("standby-rescaled"), cacheDir: c.sbDir, calibrates: rmodel.TermDecode})
	}
	if c.firstInc != 0 && c.firstInc != chainID {
		// The per-file cost of an online restore (placing each remote
		// file) is measured on the chain's first checkpoint, and the
		// chain head's online restore predicted from it.
		list = append(list, scenario{name: "store-online-older", source: "store", id: c.firstInc, slots: cfg.Slots, dataDir: fresh("store-online-older"),
			online: true, calibrates: rmodel.TermOnlineOpen, want: &c.firstWant})
	}
	list = append(list,
		scenario{name: "store-incremental", source: "store", id: chainID, slots: cfg.Slots, dataDir: fresh("store-incremental")},
		scenario{name: "store-full", source: "store", id: fullID, slots: cfg.Slots, dataDir: fresh("store-full")},
		scenario{name: "store-online", source: "store", id: chainID, slots: cfg.Slots, dataDir: fresh("store-online"), online: true},
	)
	if cfg.RescaleTo != cfg.Slots {
		list = append(list,
			scenario{name: fmt.Sprintf("rescaled-incremental-%d", cfg.RescaleTo), source: "store", id: chainID, slots: cfg.RescaleTo,
				dataDir: fresh("rescaled-incremental")},
			scenario{name: fmt.Sprintf("rescaled-full-%d", cfg.RescaleTo), source: "store", id: fullID, slots: cfg.RescaleTo,
				dataDir: fresh("rescaled-full")})
	}
	for i := range list {
		list[i].sub = c.label
		list[i].name = c.name(list[i].name)
	}
	// The model starts from what the drill measured before the kill: the
	// standby's syncs (downloads) and the checkpoints' uploads.
	c.model = rmodel.Load(c.dataDir)
	mod := c.model
	if d.rep.models == nil {
		d.rep.models = map[string]*rmodel.Model{}
	}
	d.rep.models[c.label] = mod
	for _, t := range c.syncs {
		_ = mod.ObserveTransfer(t)
	}
	for _, ck := range d.rep.Checkpoints {
		if ck.SubTopology == c.label {
			_ = mod.ObserveTransfer(rmodel.Transfer{Bytes: ck.BytesUploaded, Objects: ck.FilesUploaded, Seconds: ck.AsyncSeconds, Upload: true, From: "upload", Time: ck.Time})
		}
	}
	// Every scenario restores Repeat times, in rounds: the calibrating
	// scenarios first (so that each term is the median of several
	// measurements before anything is predicted from it), then the
	// predicted ones. Each round runs every scenario of its phase once, in
	// order, so that a burst of load from elsewhere on the machine falls
	// on one restore of each scenario rather than on every restore of
	// one. Each restore is predicted just before it runs, from every
	// restore before it, and then calibrates the model (as every real
	// restore does), except an online one: its duration is not a
	// download's; it measures the remote term and is predicted by the
	// model's online terms (time to processing; fully local in the note).
	runs := make([]scenarioRuns, len(list))
	for i, sc := range list {
		m := manifests[sc.id]
		if m == nil {
			if m, err = checkpoint.Load(ctx, d.store, c.job, sc.id); err != nil {
				return err
			}
		}
		opts := recovery.Options{
			Store: d.store, Job: c.job, KeyGroups: cfg.KeyGroups, Slots: sc.slots,
			DataDir: sc.dataDir, LocalDir: sc.localDir, CacheDir: sc.cacheDir,
			Progress: d.restoreProgress(), ProgressEvery: d.restoreProgressEvery(), Logger: cfg.Logger, Online: sc.online,
		}
		plan, err := recovery.PlanRestore(m, opts)
		if err != nil {
			return fmt.Errorf("drill: scenario %s: %w", sc.name, err)
		}
		sc.fetch = plan.BytesDownload
		runs[i] = scenarioRuns{sc: sc, m: m, opts: opts, in: plan.Input(), want: want, equal: true}
		if sc.want != nil {
			runs[i].want = *sc.want
		}
	}
	reps := max(1, cfg.Repeat)
	for _, calib := range []bool{true, false} {
		for round := range reps {
			for i := range runs {
				sr := &runs[i]
				if (sr.sc.calibrates != "") != calib {
					continue
				}
				sc, m := sr.sc, sr.m
				what := ""
				if reps > 1 {
					what = fmt.Sprintf(" (round %d/%d)", round+1, reps)
				}
				fmt.Fprintf(d.progress(), "restore %s%s: checkpoint %d (%s, chain %d), %d → %d slots\n", sc.name, what, m.ID, m.Mode, m.ChainLength, m.SlotCount(), sc.slots)
				pred := mod.Predict(sr.in)
				// Each restore starts on a disk with nothing left to write
				// back from the one before (a download leaves tens of MiB
				// dirty, which the next restore's syncs would wait for):
				// a scenario's time is its own, whatever ran before it.
				sysfile.SyncAll()
				res, fullyLocal, got, err := d.restoreOnce(ctx, m, sr.opts)
				if err != nil {
					return fmt.Errorf("drill: scenario %s: %w", sc.name, err)
				}
				sr.res, sr.got = res, got
				sr.equal = sr.equal && got == sr.want
				sr.preds = append(sr.preds, pred)
				sr.durs = append(sr.durs, res.Duration.Seconds())
				sr.locals = append(sr.locals, fullyLocal.Seconds())
				if sc.online && res.Remote != nil {
					_, _ = mod.ObserveOnline(sr.in, res.Duration, "drill")
				} else if !sc.online {
					_, _ = mod.ObserveRestore(sr.in, res.Duration, "drill")
				}
			}
		}
	}
	first := len(d.rep.Scenarios)
	for i := range runs {
		d.rep.Scenarios = append(d.rep.Scenarios, d.runsRow(&runs[i]))
		if sc := runs[i].sc; sc.dataDir != c.dataDir {
			_ = os.RemoveAll(sc.dataDir)
		}
	}
	if first == 0 {
		// The report's model terms are the first chain's (a graph's
		// sub-topologies each have theirs in SubTopologies).
		d.rep.model = mod
		d.rep.ModelTerms = mod.Terms()
		d.rep.OpenSeconds = map[string]float64{"incremental": d.rep.ModelTerms[rmodel.TermOpen].Value, "full": d.rep.ModelTerms[rmodel.TermOpen].Value}
	}
	// Order the chain's rows as the user reads them: the store first, then
	// local, rescaled, standby.
	order := map[string]int{"store": 0, "local": 1, "standby": 3}
	rows := d.rep.Scenarios[first:]
	for i := 1; i < len(rows); i++ {
		for j := i; j > 0 && rank(rows[j], order) < rank(rows[j-1], order); j-- {
			rows[j], rows[j-1] = rows[j-1], rows[j]
		}
	}
	return nil
}

// scenarioRuns is a scenario's restores so far.
type scenarioRuns struct {
	sc   scenario
	m    *checkpoint.Manifest
	opts recovery.Options
	in   rmodel.Input
	want digest
	// preds are the predictions made before each restore; durs and
	// locals each restore's time and (online) time to fully local.
	preds        []rmodel.Prediction
	durs, locals []float64
	res          *recovery.Result
	got          digest
	equal        bool
}

// runsRow is a scenario's row: the median restore against the median
// prediction, with the range of the restores beside it.
func (d *drill) runsRow(sr *scenarioRuns) Scenario {
	sc, res := sr.sc, sr.res
	// The prediction of the row is the median of those made before each
	// restore (for an online restore, by its time to processing).
	first := func(p rmodel.Prediction) float64 {
		if sc.online {
			f, _, _ := p.Online()
			return f
		}
		return p.Seconds
	}
	// A calibrating prediction (before the term was measured) is not the
	// row's when a later one is.
	var preds []rmodel.Prediction
	for _, p := range sr.preds {
		if p.OK {
			preds = append(preds, p)
		}
	}
	pred := sr.preds[0]
	if len(preds) > 0 {
		sort.SliceStable(preds, func(i, j int) bool { return first(preds[i]) < first(preds[j]) })
		pred = preds[(len(preds)-1)/2]
	}
	r := d.scenarioRow(sc, sr.m, res, pred)
	r.Restores = len(sr.durs)
	r.RestoreSeconds = percentile(sr.durs, 0.5)
	r.RestoreMinSeconds, r.RestoreMaxSeconds = sr.durs[0], sr.durs[len(sr.durs)-1]
	if r.PredictedRestoreSeconds > 0 {
		r.PredictionError = (r.RestoreSeconds - r.PredictedRestoreSeconds) / r.PredictedRestoreSeconds
	}
	fullyLocal := time.Duration(percentile(sr.locals, 0.5) * float64(time.Second))
	if sc.online {
		r.PredictedRestoreSeconds, r.PredictionError, r.PredictionText = 0, 0, pred.OnlineText()
		if f, _, ok := pred.Online(); ok && f > 0 {
			r.PredictedRestoreSeconds = f
			r.PredictionError = (r.RestoreSeconds - f) / f
		}
		r.FullyLocalSeconds = fullyLocal.Seconds()
		r.BytesToFetch = res.BytesRemote + res.BytesDownloaded
		r.Note = fmt.Sprintf("online: processing after %s, fully local after %s (%.1f MiB read from the store in the background)",
			time.Duration(r.RestoreSeconds*float64(time.Second)).Round(time.Millisecond), fullyLocal.Round(time.Millisecond), float64(res.BytesRemote)/(1<<20))
		if res.OnlineRefused != "" {
			r.Note = "online did not apply: " + res.OnlineRefused
		}
	}
	r.StateEqual = sr.equal
	r.StateDigest = sr.got.String()
	if !r.StateEqual {
		r.Note = fmt.Sprintf("STATE DIFFERS: want %v", sr.want)
	}
	return r
}

// restoreOnce runs one restore of m, downloads an online restore's rest,
// and digests the restored state.
func (d *drill) restoreOnce(ctx context.Context, m *checkpoint.Manifest, opts recovery.Options) (*recovery.Result, time.Duration, digest, error) {
	start := time.Now()
	res, err := recovery.Restore(ctx, m, opts)
	if err != nil {
		return nil, 0, digest{}, err
	}
	var fullyLocal time.Duration
	if res.Remote != nil {
		// Online: the DBs could be read from here on; the rest downloads.
		err := res.Remote.Download(ctx, 0, 4)
		fullyLocal = time.Since(start)
		res.Remote.Close()
		if err != nil {
			return nil, 0, digest{}, err
		}
	}
	// The replaced state is removed after Restore returns: let that finish
	// before the next restore is timed.
	<-res.OldStateRemoved
	got, err := digestDBs(slotDirs(datadir.State(opts.DataDir), res.ToSlots), d.cfg.KeyGroups)
	return res, fullyLocal, got, err
}

// workers is how many slots of a restore onto slots rebuild at once (as
// recovery.Plan.Input counts them).
func workers(slots int) int { return min(max(1, slots), procs.CPUs()) }

func rank(s Scenario, order map[string]int) int {
	if s.Rescaled {
		return 2
	}
	return order[s.Source]
}

func (d *drill) restoreProgress() func(recovery.Progress) {
	if d.cfg.Progress == nil {
		return nil
	}
	return recovery.ProgressPrinter(d.cfg.Progress, d.cfg.TTY)
}

func (d *drill) restoreProgressEvery() time.Duration {
	if d.cfg.TTY {
		return 200 * time.Millisecond
	}
	return time.Second
}

// scenarioRow assembles a scenario's figures.
func (d *drill) scenarioRow(sc scenario, m *checkpoint.Manifest, res *recovery.Result, pred rmodel.Prediction) Scenario {
	predicted := pred.Seconds
	var durs []float64
	var ck CheckpointFigures
	for _, c := range d.rep.Checkpoints {
		if c.SubTopology != sc.sub {
			continue
		}
		if c.Mode == string(m.Mode) {
			durs = append(durs, c.DurationSeconds)
		}
		if c.ID == m.ID {
			ck = c
		}
	}
	maxDur := 0.0
	for _, v := range durs {
		maxDur = max(maxDur, v)
	}
	r := Scenario{
		Name: sc.name, SubTopology: sc.sub, Source: sc.source, CheckpointID: m.ID, Mode: string(m.Mode), ChainLength: m.ChainLength,
		FromSlots: res.FromSlots, ToSlots: res.ToSlots, Rescaled: res.Rescaled,
		CheckpointP50Seconds: percentile(durs, 0.5), CheckpointMaxSeconds: maxDur, CheckpointsMeasured: len(durs),
		BytesUploaded: ck.BytesUploaded, RetainedExclusiveBytes: ck.RetainedExclusiveBytes, RetainedSharedBytes: ck.RetainedSharedBytes,
		RestoreSeconds: res.Duration.Seconds(), PredictedRestoreSeconds: predicted, BytesToFetch: sc.fetch,
		BytesDownloaded: res.BytesDownloaded, BytesLocal: res.BytesLocal + res.BytesCache, Files: res.Files,
		CalibratesOpenTime: sc.calibrates, PredictionText: pred.Text(),
	}
	if predicted > 0 {
		r.PredictionError = (r.RestoreSeconds - predicted) / predicted
	}
	return r
}
