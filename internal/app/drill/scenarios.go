package drill

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"cairn/checkpoint"
	"cairn/internal/datadir"
	"cairn/recovery"
	rmodel "cairn/recovery/model"
)

// scenario is one way of restoring after the kill.
type scenario struct {
	name   string
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
}

// restoreAll runs every scenario. The two that fetch nothing from the store
// run first: they measure the open time (everything but the download) of
// each mode, which the predictions of the others use.
func (d *drill) restoreAll(ctx context.Context, chainID, fullID uint64, localKept string, want digest) error {
	cfg := &d.cfg
	mInc, err := checkpoint.Load(ctx, d.store, jobName, chainID)
	if err != nil {
		return err
	}
	mFull, err := checkpoint.Load(ctx, d.store, jobName, fullID)
	if err != nil {
		return err
	}
	fresh := func(name string) string { return filepath.Join(d.work, "restore-"+name) }
	// The calibrating scenarios run first: each isolates one term of the
	// restore model (the open time, the full rebuild, the scale-down move)
	// that the predictions of the later ones use.
	list := []scenario{
		{name: "local-disk", source: "local", id: chainID, slots: cfg.Slots, dataDir: d.jobDataDir(), localDir: localKept, calibrates: rmodel.TermOpen},
	}
	if cfg.RescaleTo < cfg.Slots {
		list = append(list, scenario{name: fmt.Sprintf("local-rescaled-%d", cfg.RescaleTo), source: "local", id: chainID, slots: cfg.RescaleTo,
			dataDir: fresh("local-rescaled"), localDir: localKept, calibrates: rmodel.TermMove})
	}
	list = append(list,
		scenario{name: "standby", source: "standby", id: fullID, slots: cfg.Slots, dataDir: fresh("standby"), cacheDir: filepath.Join(d.work, "standby"),
			calibrates: rmodel.TermDecode},
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
	// The model starts from what the drill measured before the kill: the
	// standby's syncs (downloads) and the checkpoints' uploads.
	d.rep.model = rmodel.Load(d.jobDataDir())
	mod := d.rep.model
	for _, t := range d.syncs {
		_ = mod.ObserveTransfer(t)
	}
	for _, c := range d.rep.Checkpoints {
		_ = mod.ObserveTransfer(rmodel.Transfer{Bytes: c.BytesUploaded, Objects: c.FilesUploaded, Seconds: c.AsyncSeconds, Upload: true, From: "upload", Time: c.Time})
	}
	for _, sc := range list {
		m := mInc
		if sc.id == fullID {
			m = mFull
		}
		fmt.Fprintf(d.progress(), "restore %s: checkpoint %d (%s, chain %d), %d → %d slots\n", sc.name, m.ID, m.Mode, m.ChainLength, m.SlotCount(), sc.slots)
		opts := recovery.Options{
			Store: d.store, Job: jobName, KeyGroups: cfg.KeyGroups, Slots: sc.slots,
			DataDir: sc.dataDir, LocalDir: sc.localDir, CacheDir: sc.cacheDir,
			Progress: d.restoreProgress(), ProgressEvery: d.restoreProgressEvery(), Logger: cfg.Logger, Online: sc.online,
		}
		plan, err := recovery.PlanRestore(m, opts)
		if err != nil {
			return fmt.Errorf("drill: scenario %s: %w", sc.name, err)
		}
		sc.fetch = plan.BytesDownload
		start := time.Now()
		res, err := recovery.Restore(ctx, m, opts)
		if err != nil {
			return fmt.Errorf("drill: scenario %s: %w", sc.name, err)
		}
		var fullyLocal time.Duration
		if res.Remote != nil {
			// Online: the DBs could be read from here on; the rest downloads.
			err := res.Remote.Download(ctx, 0, 4)
			fullyLocal = time.Since(start)
			res.Remote.Close()
			if err != nil {
				return fmt.Errorf("drill: scenario %s: %w", sc.name, err)
			}
		}
		got, err := digestDBs(slotDirs(datadir.State(sc.dataDir), res.ToSlots), cfg.KeyGroups)
		if err != nil {
			return fmt.Errorf("drill: scenario %s: %w", sc.name, err)
		}
		// The prediction is the model's before this restore; the restore
		// then calibrates it (as every real restore does).
		var pred rmodel.Prediction
		if !sc.online {
			pred, _ = mod.ObserveRestore(plan.Input(), res.Duration, "drill")
		} else {
			// An online restore's duration is not a download's: it
			// calibrates nothing, and its prediction is the model's online
			// terms (time to processing; fully local in the note).
			pred = mod.Predict(plan.Input())
		}
		r := d.scenarioRow(sc, m, res, pred)
		if sc.online {
			r.PredictedRestoreSeconds, r.PredictionError, r.PredictionText = 0, 0, pred.OnlineText()
			if first, _, ok := pred.Online(); ok && first > 0 {
				r.PredictedRestoreSeconds = first
				r.PredictionError = (r.RestoreSeconds - first) / first
			}
			r.FullyLocalSeconds = fullyLocal.Seconds()
			r.BytesToFetch = res.BytesRemote + res.BytesDownloaded
			r.Note = fmt.Sprintf("online: processing after %s, fully local after %s (%.1f MiB read from the store in the background)",
				res.Duration.Round(time.Millisecond), fullyLocal.Round(time.Millisecond), float64(res.BytesRemote)/(1<<20))
			if res.OnlineRefused != "" {
				r.Note = "online did not apply: " + res.OnlineRefused
			}
		}
		r.StateEqual = got == want
		r.StateDigest = got.String()
		if !r.StateEqual {
			r.Note = fmt.Sprintf("STATE DIFFERS: want %v", want)
		}
		d.rep.Scenarios = append(d.rep.Scenarios, r)
		if sc.dataDir != d.jobDataDir() {
			_ = os.RemoveAll(sc.dataDir)
		}
	}
	d.rep.ModelTerms = mod.Terms()
	d.rep.OpenSeconds = map[string]float64{"incremental": d.rep.ModelTerms[rmodel.TermOpen].Value, "full": d.rep.ModelTerms[rmodel.TermOpen].Value}
	// Order the rows as the user reads them: the store first, then local,
	// rescaled, standby.
	order := map[string]int{"store": 0, "local": 1, "standby": 3}
	rows := d.rep.Scenarios
	for i := 1; i < len(rows); i++ {
		for j := i; j > 0 && rank(rows[j], order) < rank(rows[j-1], order); j-- {
			rows[j], rows[j-1] = rows[j-1], rows[j]
		}
	}
	return nil
}

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
		Name: sc.name, Source: sc.source, CheckpointID: m.ID, Mode: string(m.Mode), ChainLength: m.ChainLength,
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
